// pmap-bench's application workloads (the group "apps"): whole computations as a user would
// write them with pmap or shard_map, each against the same computation hand-written with
// OpenMP in the same run, the per-block math shared (report/apps.hpp):
//
//   batched_solve   B dense n x n systems (double), one PartialPivLU each, split over a mesh
//                   of all devices, f.into(x, A, r): B = 1024 (even blocks) and 1001 (uneven)
//                   at n = 32, 1001 at n = 8; vs an OpenMP static parallel for over the
//                   systems, in systems/s
//   mlp_step        one data-parallel SGD step of a 64-256-1 MLP (ReLU, MSE loss, float) on a
//                   4096-row batch split over all devices: each block's gradient, one pmean of
//                   the flat gradient, the update returned replicated; vs the same step in one
//                   OpenMP region (per-thread gradients, a barrier, a parallel average and
//                   update), in steps/s
//   heat_stencil    1000 steps of the 1-D periodic heat equation in one pmap call, two
//                   one-point ppermutes per step (the halo exchange), 4096 and 262144 points,
//                   2 and 8 devices on 2 threads; vs OpenMP updating the same shards with one
//                   barrier per step. Its halo_exchange rows: the two ppermutes of a step alone
//                   against one, what the second costs (2 and 8 devices on 2 threads). The
//                   heat_overlap rows: the same stencil with both halos started
//                   (ppermute_start) before the interior update and waited for before the
//                   edge points; halo_overlap: both in flight together against one ppermute
//   monte_carlo     a European call priced from 2^21 paths, each device its own stream, one
//                   psum of the payoff sums; vs OpenMP over the same streams with a reduction,
//                   in paths/s
//   sample_sort     2^22 int32 keys sorted by a sample sort over a mesh of 2 devices on 2
//                   threads (examples/sample_sort.hpp: local sort, splitters from an all_gather
//                   of samples, a ragged_all_to_all of the buckets, a merge), uniform keys and
//                   skewed ones (90% one hot key: one bucket holds most of them); vs the same
//                   steps in one OpenMP region, the buckets read in place, in keys/s
//                   (bench/apps_sample_sort.cpp)
//   ring_matmul     C = A B (float, 1024 x 1024): A's row blocks on the devices, B's passed
//                   around the ring by ppermute, one block product per step; vs OpenMP doing
//                   the same block products reading B in place, in GFLOP/s
#define EIGEN_USE_THREADS
// Before any Eigen include: an Eigen Core product would otherwise open an OpenMP team of its
// own inside every pmap kernel (report/apps.hpp).
#define EIGEN_DONT_PARALLELIZE

#include "report/app_kernels.hpp"
#include "report/apps.hpp"

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <omp.h>

#include <pmap/pmap.hpp>

#include "report/workload.hpp"

namespace pmap::report {
namespace {
using Eigen::Index;
}  // namespace

// ---- batched solve -------------------------------------------------------------------------

namespace {

/// x = A^-1 r for a batch of systems (A [B, n, n], r [B, n], x [B, n]), the systems split
/// statically over an OpenMP team of `threads`, each thread reusing one factorisation.
void omp_solve(int threads, const TensorD3& a, const TensorD2& r, TensorD2& x) {
  const Index batch = a.dimension(0), n = a.dimension(1);
#pragma omp parallel num_threads(threads)
  {
    SolveLU lu(n);
#pragma omp for schedule(static)
    for (Index s = 0; s < batch; ++s)
      solve_system(lu, a.data() + s * n * n, r.data() + s * n, x.data() + s * n, n);
  }
}
}  // namespace

void batched_solve(Env& env) {
  const int d = env.devices;
  const int t = env.threads_for(d);
  pmap::Runtime rt({.num_devices = d, .num_threads = t});
  const pmap::Mesh mesh({{"x", d}}, &rt);
  auto f = batch_solver(mesh);
  const std::pair<Index, Index> sizes[] = {{1024, 32}, {1001, 32}, {1001, 8}};
  for (const auto& [batch, n] : sizes) {
    TensorD3 a(batch, n, n);
    TensorD2 r(batch, n), x(batch, n), x_omp(batch, n);
    solve_problem(a.data(), r.data(), batch, n);
    // Once before measuring: both solve every system, to the same figures.
    f.into(x, a, r);
    omp_solve(t, a, r, x_omp);
    const double residual = solve_residual(a.data(), r.data(), x.data(), batch, n);
    const double apart = (Eigen::Map<const Eigen::VectorXd>(x.data(), x.size()) -
                          Eigen::Map<const Eigen::VectorXd>(x_omp.data(), x_omp.size()))
                             .lpNorm<Eigen::Infinity>();
    if (!(residual < 1e-10) || !(apart <= 1e-12))
      throw std::runtime_error(format(
          "batched_solve %ld x %ldx%ld: residual %g, shard_map and omp %g apart",
          static_cast<long>(batch), static_cast<long>(n), static_cast<long>(n), residual, apart));

    const std::string size = format("%ld x %ldx%ld, ", static_cast<long>(batch),
                                    static_cast<long>(n), static_cast<long>(n)) +
                             devices_threads(d, t);
    const auto systems = static_cast<double>(batch);
    Case cs("batched solve, " + size);
    cs.add("shard_map", repeat([&] { f.into(x, a, r); }), 1, systems);
    add_omp(cs, "omp", t, repeat([&] { omp_solve(t, a, r, x_omp); }), 1, systems);
    cs.measure(env.settings);
    env.report->add(compare(cs, "batched_solve", size, "shard_map", "omp", Case::kRate,
                            Target::at_least(0.95), "Msystems/s", 1e-6));
  }
}

// ---- MLP training step ---------------------------------------------------------------------

namespace {

constexpr Index kMlpBatch = 4096;  // divides evenly over 2, 4, 8 and 16 devices

/// One SGD step of the report/apps.hpp MLP on x [B, kMlpIn], y [B, 1] from theta into next
/// (both [kMlpParams]) by an OpenMP team of `threads`: each thread the gradient of its block
/// into its slot, a barrier, then each thread averages its share of the flat gradient over
/// the slots and updates that share of the parameters.
void omp_mlp_step(int threads, const Tensor1& theta, const Tensor2& x, const Tensor2& y,
                  Tensor1& next, Tensor2& slots, std::vector<MlpWork>& work) {
  const Index batch = x.dimension(0);
#pragma omp parallel num_threads(threads)
  {
    const int i = omp_get_thread_num();
    const int nt = omp_get_num_threads();
    const Index begin = batch * i / nt, end = batch * (i + 1) / nt;
    float* grads = slots.data();
    mlp_gradient(theta.data(), x.data() + begin * kMlpIn, y.data() + begin, end - begin,
                 static_cast<float>(nt) / static_cast<float>(batch), grads + i * kMlpParams,
                 work[static_cast<std::size_t>(i)]);
#pragma omp barrier
    const Index from = kMlpParams * i / nt, to = kMlpParams * (i + 1) / nt;
    Eigen::Map<Eigen::VectorXf> share(next.data() + from, to - from);
    share = Eigen::Map<const Eigen::VectorXf>(grads + from, to - from);
    for (int k = 1; k < nt; ++k)
      share += Eigen::Map<const Eigen::VectorXf>(grads + k * kMlpParams + from, to - from);
    share = Eigen::Map<const Eigen::VectorXf>(theta.data() + from, to - from) -
            (kMlpRate / static_cast<float>(nt)) * share;
  }
}

}  // namespace

void mlp_step(Env& env) {
  const int d = env.devices;
  const int t = env.threads_for(d);
  pmap::Runtime rt({.num_devices = d, .num_threads = t});
  const pmap::Mesh mesh({{"x", d}}, &rt);
  Tensor1 theta(kMlpParams), next(kMlpParams), next_omp(kMlpParams);
  Tensor2 x(kMlpBatch, kMlpIn), y(kMlpBatch, 1);
  mlp_problem(theta.data(), x.data(), y.data(), kMlpBatch);
  // Scratch kept across steps, per device and per OpenMP thread.
  std::vector<MlpWork> work(static_cast<std::size_t>(d)), omp_work(static_cast<std::size_t>(t));
  Tensor2 slots(t, kMlpParams);

  auto f = mlp_stepper(mesh, work, kMlpBatch);

  // Once before measuring: both take the same step (up to the order of the float sums).
  f.into(next, theta, x, y);
  omp_mlp_step(t, theta, x, y, next_omp, slots, omp_work);
  const Eigen::Map<const Eigen::VectorXf> p0(theta.data(), kMlpParams), p1(next.data(), kMlpParams),
      p2(next_omp.data(), kMlpParams);
  const float step = (p2 - p0).lpNorm<Eigen::Infinity>();
  const float apart = (p1 - p2).lpNorm<Eigen::Infinity>();
  if (!(step > 0) || !(apart <= 1e-3f * step))
    throw std::runtime_error(
        format("mlp_step: the largest update is %g, shard_map and omp are %g apart",
               static_cast<double>(step), static_cast<double>(apart)));

  const std::string size =
      format("batch %ld, ", static_cast<long>(kMlpBatch)) + devices_threads(d, t);
  Case cs("mlp step, " + size);
  cs.add("shard_map", repeat([&] { f.into(next, theta, x, y); }), 1, 1);
  add_omp(cs, "omp", t, repeat([&] { omp_mlp_step(t, theta, x, y, next_omp, slots, omp_work); }), 1,
          1);
  cs.measure(env.settings);
  env.report->add(compare(cs, "mlp_step", size, "shard_map", "omp", Case::kRate,
                          Target::at_least(0.95), "steps/s"));
}

// ---- heat stencil ----------------------------------------------------------------------------

namespace {

/// `steps` time steps of the periodic grid u0[n] in `shards` blocks, into u[n] (next[n] is
/// scratch), by an OpenMP team of `threads`: each thread updates its shards from the grid of
/// the previous step, reading the halo points of its neighbours in place; one barrier per step
/// (the implicit one of the for).
void omp_heat(int threads, int shards, int steps, const Tensor1& u0, Tensor1& u, Tensor1& next) {
  const Index n = u0.size(), m = n / shards;
#pragma omp parallel num_threads(threads)
  {
    float* from = u.data();
    float* to = next.data();
#pragma omp for schedule(static)
    for (int b = 0; b < shards; ++b) std::copy_n(u0.data() + b * m, m, from + b * m);
    for (int s = 0; s < steps; ++s) {
#pragma omp for schedule(static)
      for (int b = 0; b < shards; ++b)
        heat_block(from + b * m, from[(b * m + n - 1) % n], from[(b * m + m) % n], to + b * m, m);
      std::swap(from, to);
    }
  }
  if (steps % 2 == 1) std::swap(u, next);
}

/// The ring permutations of a halo exchange over d devices: to the right and to the left.
std::pair<std::vector<std::pair<int, int>>, std::vector<std::pair<int, int>>> rings(int d) {
  std::vector<std::pair<int, int>> to_right, to_left;
  for (int i = 0; i < d; ++i) {
    to_right.emplace_back(i, (i + 1) % d);
    to_left.emplace_back(i, (i + d - 1) % d);
  }
  return {to_right, to_left};
}

/// The pmap kernel: every step, the last point to the right neighbour and the first to the
/// left one (the ring of ppermutes), then the block's update. `overlap`: both halos started
/// (ppermute_start) before the interior is updated, waited for before the two edge points.
auto heat_kernel(int steps, bool overlap) {
  return [steps, overlap](pmap::Context& ctx, auto block) {
    const auto [to_right, to_left] = rings(ctx.axis_size("x"));
    const Index m = block.size();
    Tensor1 u = block, next(m), last(1), first(1);
    for (int s = 0; s < steps; ++s) {
      last(0) = u(m - 1);
      first(0) = u(0);
      if (overlap) {
        auto from_left = ctx.ppermute_start(last, "x", to_right);
        auto from_right = ctx.ppermute_start(first, "x", to_left);
        heat_interior(u.data(), next.data(), m);
        const float left = from_left.wait()(0);
        heat_edges(u.data(), left, from_right.wait()(0), next.data(), m);
      } else {
        const auto from_left = ctx.ppermute(last, "x", to_right);
        const auto from_right = ctx.ppermute(first, "x", to_left);
        heat_block(u.data(), from_left(0), from_right(0), next.data(), m);
      }
      std::swap(u, next);
    }
    return u;
  };
}

/// One row: `points` points over d devices on 2 threads, against OpenMP over d shards;
/// `overlap`: the row heat_overlap, both halos in flight while the interior is updated.
void heat_row(Env& env, Index points, int d, int steps, bool overlap, Target target) {
  const int t = 2;
  pmap::Runtime rt({.num_devices = d, .num_threads = t});
  auto f = pmap::pmap(heat_kernel(steps, overlap), {.axis_name = "x", .runtime = &rt});
  Tensor2 blocks(d, points / d), out(d, points / d);
  heat_problem(blocks.data(), points);
  const Tensor1 u0 = blocks.reshape(Eigen::array<Index, 1>{points});
  Tensor1 u(points), next(points);
  f.into(out, blocks);
  omp_heat(t, d, steps, u0, u, next);
  if (!std::equal(u.data(), u.data() + points, out.data()))
    throw std::runtime_error(format("heat_stencil %ld points on %d devices: pmap and omp differ",
                                    static_cast<long>(points), d));
  const std::string size =
      format("%ld points, %d steps, ", static_cast<long>(points), steps) + devices_threads(d, t);
  const char* pmap_name = overlap ? "pmap, halos in flight" : "pmap";
  Case c("heat stencil, " + size);
  c.add(pmap_name, repeat([&] { f.into(out, blocks); }), 1);
  add_omp(c, format("omp, %d shards", d), t, repeat([&] { omp_heat(t, d, steps, u0, u, next); }));
  c.measure(env.settings);
  env.report->add(compare(c, overlap ? "heat_overlap" : "heat_stencil", size, pmap_name,
                          format("omp, %d shards", d), Case::kTime, target));
}

/// A halo exchange of `exchanges` one-point ppermutes per step (1: to the right; 2: to the
/// right and to the left; 3: both, in flight together), `steps` steps in one call, and
/// nothing else.
auto halo_kernel(int steps, int exchanges) {
  return [steps, exchanges](pmap::Context& ctx, auto block) {
    const auto [to_right, to_left] = rings(ctx.axis_size("x"));
    Tensor1 edge(1);
    edge(0) = block(0);
    float sum = 0;
    for (int s = 0; s < steps; ++s) {
      if (exchanges == 3) {
        auto right = ctx.ppermute_start(edge, "x", to_right);
        auto left = ctx.ppermute_start(edge, "x", to_left);
        sum += right.wait()(0);
        sum += left.wait()(0);
        continue;
      }
      sum += ctx.ppermute(edge, "x", to_right)(0);
      if (exchanges == 2) sum += ctx.ppermute(edge, "x", to_left)(0);
    }
    return sum;
  };
}

/// What the second ppermute of a step costs: the halo exchange both ways against one way,
/// d devices on 2 threads (a stencil's two ppermutes per step cost at most 1.5x one); and
/// the row halo_overlap, both ways in flight together against one way.
void halo_row(Env& env, int d, int steps) {
  pmap::Runtime rt({.num_devices = d, .num_threads = 2});
  auto one = pmap::pmap(halo_kernel(steps, 1), {.axis_name = "x", .runtime = &rt});
  auto two = pmap::pmap(halo_kernel(steps, 2), {.axis_name = "x", .runtime = &rt});
  auto both = pmap::pmap(halo_kernel(steps, 3), {.axis_name = "x", .runtime = &rt});
  Tensor2 blocks(d, 4);
  blocks.setConstant(1.f);
  Tensor1 out(d);
  const std::string size = format("1 point, %d steps, ", steps) + devices_threads(d, 2);
  Case c("halo exchange, " + size);
  c.add("2 ppermutes per step", repeat([&] { two.into(out, blocks); }), 1);
  c.add("2 in flight per step", repeat([&] { both.into(out, blocks); }), 1);
  c.add("1 ppermute per step", repeat([&] { one.into(out, blocks); }), 1);
  c.measure(env.settings);
  env.report->add(compare(c, "halo_exchange", size, "2 ppermutes per step", "1 ppermute per step",
                          Case::kTime, Target::at_most(1.5)));
  env.report->add(compare(c, "halo_overlap", size, "2 in flight per step", "1 ppermute per step",
                          Case::kTime, Target::at_most(d == 2 ? 1.15 : 1.5)));
}

}  // namespace

void heat_stencil(Env& env) {
  const int steps = env.opt.quick ? 200 : 1000;
  // 2 on 2: the apps target; 8 on 2: the oversubscription issue's (time ratios).
  heat_row(env, 4096, 2, steps, false, Target::at_most(1.05));
  heat_row(env, 4096, 8, steps, false, Target::at_most(4.0));
  heat_row(env, 262144, 2, steps, false, Target::at_most(1.05));
  heat_row(env, 262144, 8, steps, false, Target::at_most(1.3));
  // The halos in flight (SPEC 11, issue 28's targets at 2 on 2; 8 on 2 no worse than the
  // blocking rows' targets).
  heat_row(env, 4096, 2, steps, true, Target::at_most(1.0));
  heat_row(env, 4096, 8, steps, true, Target::at_most(4.0));
  heat_row(env, 262144, 2, steps, true, Target::at_most(0.95));
  heat_row(env, 262144, 8, steps, true, Target::at_most(1.3));
  halo_row(env, 2, steps);
  halo_row(env, 8, steps);
}

// ---- Monte Carlo -----------------------------------------------------------------------------

namespace {

/// The payoff sums of `streams` streams of `per_stream` paths each, the streams split
/// statically over an OpenMP team of `threads`, combined by a reduction.
PayoffSums omp_payoffs(int threads, const CallOption& o, int streams, std::int64_t per_stream) {
  double payoff = 0, squares = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : payoff, squares)
  for (int s = 0; s < streams; ++s) {
    const PayoffSums part = call_payoffs(o, static_cast<std::uint64_t>(s), per_stream);
    payoff += part.payoff;
    squares += part.squares;
  }
  return {payoff, squares};
}

}  // namespace

void monte_carlo(Env& env) {
  const int d = env.devices;
  const int t = env.threads_for(d);
  const std::int64_t paths = env.opt.quick ? std::int64_t{1} << 18 : std::int64_t{1} << 21;
  const std::int64_t per_device = paths / d;
  const CallOption option;
  pmap::Runtime rt({.num_devices = d, .num_threads = t});
  // Device i draws stream i; the sums come back replicated.
  auto f = pmap::pmap(
      [&option, per_device](pmap::Context& ctx, auto) {
        const PayoffSums s =
            call_payoffs(option, static_cast<std::uint64_t>(ctx.axis_index("i")), per_device);
        TensorD1 sums(2);
        sums(0) = s.payoff;
        sums(1) = s.squares;
        return ctx.psum(std::move(sums), "i");
      },
      pmap::out_axes(pmap::none), {.axis_name = "i", .runtime = &rt});
  const TensorD1 streams(d);  // what maps the call over the devices; the kernel reads its index
  const TensorD1 sums = f(streams);
  const PayoffSums omp = omp_payoffs(t, option, d, per_device);
  // The same streams in a different summation order: equal to rounding.
  if (!(std::abs(sums(0) - omp.payoff) <= 1e-9 * omp.payoff))
    throw std::runtime_error(
        format("monte_carlo: pmap sums %.17g, omp %.17g", sums(0), omp.payoff));

  const std::string size = format("%ld paths, ", static_cast<long>(paths)) + devices_threads(d, t);
  Case c("monte carlo, " + size);
  c.add("pmap", repeat([&] { f(streams); }), 1, static_cast<double>(paths));
  add_omp(c, "omp", t, repeat([&] { omp_payoffs(t, option, d, per_device); }), 1,
          static_cast<double>(paths));
  c.measure(env.settings);
  env.report->add(compare(c, "monte_carlo", size, "pmap", "omp", Case::kRate,
                          Target::at_least(0.95), "Mpaths/s", 1e-6));
}

// ---- ring matmul -----------------------------------------------------------------------------

namespace {

/// C = A B by an OpenMP team of `threads` over d row blocks: each thread the row blocks of
/// C it owns, by the same d block products in the same order as device i, B read in place.
void omp_ring(int threads, int d, const Tensor2& a, const Tensor2& b, Tensor2& c) {
  const Index n = a.dimension(1), r = n / d;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int i = 0; i < d; ++i) {
    float* ci = c.data() + i * r * n;
    std::fill_n(ci, r * n, 0.f);
    for (int s = 0; s < d; ++s) {
      const int j = (i + s) % d;
      ring_step(a.data() + i * r * n, b.data() + j * r * n, ci, r, n, j);
    }
  }
}

}  // namespace

void ring_matmul(Env& env) {
  const int d = env.devices;
  const int t = env.threads_for(d);
  const Index n = env.opt.quick ? 512 : 1024, r = n / d;
  pmap::Runtime rt({.num_devices = d, .num_threads = t});
  // Device i holds A's row block i and, at step s, B's row block (i + s) % d: it adds that
  // block's product and passes the block to its left neighbour.
  auto f = pmap::pmap(
      [d, r, n](pmap::Context& ctx, auto a, auto b_block) {
        std::vector<std::pair<int, int>> to_left;
        for (int i = 0; i < d; ++i) to_left.emplace_back(i, (i + d - 1) % d);
        const int i = ctx.axis_index("i");
        Tensor2 c(r, n), b = b_block;
        c.setZero();
        for (int s = 0; s < d; ++s) {
          ring_step(a.data(), b.data(), c.data(), r, n, (i + s) % d);
          if (s + 1 < d) b = ctx.ppermute(std::move(b), "i", to_left);
        }
        return c;
      },
      {.axis_name = "i", .runtime = &rt});
  Tensor2 a(n, n), b(n, n), c(n, n);
  a.setRandom();
  b.setRandom();
  const Eigen::array<Index, 3> blocks{d, r, n};
  const Tensor3 a3 = a.reshape(blocks), b3 = b.reshape(blocks);
  Tensor3 c3(d, r, n);
  f.into(c3, a3, b3);
  omp_ring(t, d, a, b, c);
  if (!std::equal(c.data(), c.data() + c.size(), c3.data()))
    throw std::runtime_error("ring_matmul: pmap and omp differ");

  const std::string size =
      format("%ld x %ld, ", static_cast<long>(n), static_cast<long>(n)) + devices_threads(d, t);
  const double flops =
      2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  Case cs("ring matmul, " + size);
  cs.add("pmap", repeat([&] { f.into(c3, a3, b3); }), 1, flops);
  add_omp(cs, "omp", t, repeat([&] { omp_ring(t, d, a, b, c); }), 1, flops);
  cs.measure(env.settings);
  env.report->add(compare(cs, "ring_matmul", size, "pmap", "omp", Case::kRate,
                          Target::at_least(0.95), "GFLOP/s", 1e-9));
}

}  // namespace pmap::report
