// The 1-D heat equation u_t = alpha * u_xx on a periodic domain, split over devices: each
// device owns a contiguous block of the grid and, every time step, trades one halo point
// with each neighbour by ppermute (the ring to the right and the ring to the left), and
// updates its block with the explicit three-point stencil: both halos are started
// (ppermute_start) before the interior points are updated, and waited for before the two
// edge points. All steps run inside one pmap call, as a user would write it: one dispatch,
// two collectives per step.
//
// The result is checked against the same stencil run serially over the whole grid: the
// update is the same floating-point expression in both, so the results are bit-identical.
//
//   pmap_heat_stencil [--size N] [--steps S] [--devices D] [--threads T] [--trace FILE]
//
// Defaults: N = 4096 points, S = 1000 steps, D = 8 devices on T = 2 threads. With --trace,
// the run writes a Chrome trace (pmap::trace) that bench/plot_trace.py draws.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <pmap/pmap.hpp>

#include "common.hpp"

namespace {

using Grid = Eigen::Tensor<float, 1, Eigen::RowMajor>;

constexpr float kR = 0.25f;  // alpha * dt / dx^2, stable below 0.5

/// The stencil: the new value of a point from its left neighbour, itself and its right one.
/// Kernel and serial reference share it, so that both compute the same float expression.
inline float heat(float left, float centre, float right) {
  return centre + kR * ((left + right) - 2.f * centre);
}

/// The initial temperature: a hot band and a cold one on a gentle slope.
Grid initial(Eigen::Index n) {
  Grid u(n);
  for (Eigen::Index k = 0; k < n; ++k) {
    const float x = static_cast<float>(k) / static_cast<float>(n);
    u(k) = (x > 0.2f && x < 0.3f ? 100.f : 0.f) - (x > 0.6f && x < 0.65f ? 50.f : 0.f) + 10.f * x;
  }
  return u;
}

Grid serial(Grid u, int steps) {
  const Eigen::Index n = u.size();
  Grid next(n);
  for (int s = 0; s < steps; ++s) {
    for (Eigen::Index k = 0; k < n; ++k) next(k) = heat(u((k + n - 1) % n), u(k), u((k + 1) % n));
    std::swap(u, next);
  }
  return u;
}

struct Args {
  long size = 4096;
  int steps = 1000;
  int devices = 8;
  int threads = 2;
  std::string trace;
};

Args parse(int argc, char** argv) {
  examples::Flags flags(argc, argv,
                        "[--size N] [--steps S] [--devices D] [--threads T] [--trace FILE]");
  Args a;
  a.size = static_cast<long>(flags.integer("--size", a.size));
  a.steps = static_cast<int>(flags.integer("--steps", a.steps));
  a.devices = static_cast<int>(flags.integer("--devices", a.devices));
  a.threads = static_cast<int>(flags.integer("--threads", a.threads));
  a.trace = flags.text("--trace", a.trace);
  flags.done();
  flags.require(
      a.size >= 1 && a.steps >= 0 && a.devices >= 1 && a.threads >= 1 && a.size % a.devices == 0,
      "need --size a positive multiple of --devices, and positive counts");
  return a;
}

/// The simulation as one pmap kernel: device i owns row i of the (devices, size / devices)
/// grid and runs every step, trading its edge points with its neighbours.
auto simulation(int steps, pmap::Runtime& rt) {
  return pmap::pmap(
      [steps](pmap::Context& ctx, auto block) {
        const int n = ctx.axis_size("x");
        std::vector<std::pair<int, int>> to_right, to_left;
        for (int i = 0; i < n; ++i) {
          to_right.emplace_back(i, (i + 1) % n);
          to_left.emplace_back(i, (i + n - 1) % n);
        }
        Grid u = block;
        Grid next(u.size());
        const Eigen::Index m = u.size();
        Grid last(1), first(1);
        for (int s = 0; s < steps; ++s) {
          // Both halos in flight while the interior is updated (SPEC 11): `last` and `first`
          // are read until the waits, so they stay untouched until then.
          last(0) = u(m - 1);
          first(0) = u(0);
          auto from_left = ctx.ppermute_start(last, "x", to_right);   // the left neighbour's last
          auto from_right = ctx.ppermute_start(first, "x", to_left);  // the right neighbour's first
          for (Eigen::Index k = 1; k + 1 < m; ++k) next(k) = heat(u(k - 1), u(k), u(k + 1));
          const float left = from_left.wait()(0);
          const float right = from_right.wait()(0);
          next(0) = heat(left, u(0), m > 1 ? u(1) : right);
          if (m > 1) next(m - 1) = heat(u(m - 2), u(m - 1), right);
          std::swap(u, next);
        }
        return u;
      },
      {.axis_name = "x", .runtime = &rt});
}

/// The first point where `got` differs from `want`, or -1.
Eigen::Index first_difference(const float* got, const Grid& want) {
  for (Eigen::Index k = 0; k < want.size(); ++k)
    if (got[k] != want(k)) return k;
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  pmap::Runtime rt({.num_devices = args.devices, .num_threads = args.threads});
  auto simulate = simulation(args.steps, rt);

  const Grid u0 = initial(args.size);
  const Eigen::Index per_device = args.size / args.devices;
  const Eigen::Tensor<float, 2, Eigen::RowMajor> blocks =
      u0.reshape(Eigen::array<Eigen::Index, 2>{args.devices, per_device});

  if (!args.trace.empty()) pmap::trace::start(args.trace);
  const Eigen::Tensor<float, 2, Eigen::RowMajor> result = simulate(blocks);
  if (!args.trace.empty()) pmap::trace::stop();

  const Grid want = serial(u0, args.steps);
  const float* got = result.data();
  if (const Eigen::Index k = first_difference(got, want); k >= 0) {
    std::fprintf(stderr, "heat_stencil: point %ld is %.9g, the serial stencil gives %.9g\n",
                 static_cast<long>(k), static_cast<double>(got[k]), static_cast<double>(want(k)));
    return 1;
  }
  double total = 0;
  for (Eigen::Index k = 0; k < args.size; ++k) total += got[k];
  std::printf(
      "heat_stencil: %ld points, %d steps on %d devices / %d threads: bit-identical to the "
      "serial stencil, total heat %.3f\n",
      args.size, args.steps, args.devices, args.threads, total);
  return 0;
}
