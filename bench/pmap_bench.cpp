// pmap-bench: pmap's workloads next to their baselines, measured interleaved in one process
// and reported as ratios against the performance targets of README's benchmark section.
//
//   pmap-bench [--quick] [--json FILE] [--devices N] [--threads N] [--filter REGEX]
//              [--size BYTES] [--rounds N]
//
// Workloads (the names --filter matches):
//   dispatch          empty kernel on 2, device_count() and 8 devices vs raw
//                     tbb::parallel_for (static partitioner, same arena concurrency) and an
//                     OpenMP parallel for
//   shard_dispatch    empty kernel on a 2-device mesh over a [2,1] tensor split P("x") vs the
//                     same empty pmap dispatch
//   break_even        per-device triad size from which pmap beats a serial loop, vs the same
//                     for OpenMP
//   triad             a + 0.5f * b, the kernel returns the expression, mapped.into(out, a, b),
//                     in cache and --size bytes per array, vs OpenMP static, raw oneTBB and
//                     Eigen's ThreadPoolDevice
//   gemm              one Eigen matrix product per device vs Eigen's contraction on a
//                     ThreadPoolDevice (each product threaded, or the products in parallel on
//                     the pool) and a serial loop, in GFLOP/s
//   apps              the application workloads of apps.cpp (batched_solve, mlp_step,
//                     heat_stencil, monte_carlo, sample_sort, ring_matmul), each against the same
//                     computation hand-written with OpenMP
//   psum_latency      8 KiB psum on 2 devices: what it costs beyond a hand-written 2-barrier
//                     psum, in spin barriers; vs a spin barrier, an OpenMP barrier and that
//                     psum; and a 4-byte psum (synchronisation alone)
//   bandwidth         psum, all_gather, all_to_all and ppermute vs memcpy, in cache and
//                     --size / 8 bytes received per device; psum, all_to_all and ppermute
//                     chains donate each result to the next collective
//   oversubscription  the 8 KiB psum with 4 and 8 devices on 2 threads vs 2 on 2
//   idle              CPU burnt during a 10 ms idle gap after a burst of dispatches, and the
//                     first dispatch after the gap vs a warm one
//   tree_pmean        100 chained pmeans of a tuple of 4 tensors (64 KiB together), one
//                     collective each, vs 100 pmeans of one 64 KiB tensor and vs the 4 tensors
//                     in 4 pmeans, on 2 devices
//
// stdout: the machine line, then the table and "targets met: X of Y"; stderr: progress.
// The exit code is 0 whether targets are met or not (it is a report).

#define EIGEN_USE_THREADS  // before any Eigen include: Eigen::ThreadPoolDevice
// Before any Eigen include too: with -fopenmp, an Eigen Core product (batched_solve,
// mlp_step) would open an OpenMP team of its own inside every pmap kernel (report/apps.hpp).
// Tensor contractions (gemm) never do, so this changes nothing else.
#define EIGEN_DONT_PARALLELIZE

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <limits>
#include <optional>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>
#include <oneapi/tbb/task_arena.h>

#include <pmap/pmap.hpp>

#include "baselines.hpp"
#include "report/harness.hpp"
#include "report/more_baselines.hpp"
#if PMAP_BENCH_WITH_MPI
#include "report/mpi.hpp"
#include "report/mpi_apps.hpp"
#endif
#include "report/table.hpp"
#include "report/workload.hpp"

namespace {

namespace pb = pmap::bench;
namespace pr = pmap::report;
using pr::Case;
using pr::Target;

using pr::Env;
using pr::Options;
using pr::Tensor1;
using pr::Tensor2;
using pr::Tensor3;
using pr::add_omp;
using pr::devices_threads;
using pr::repeat;
using Map1 = Eigen::TensorMap<Tensor1>;
using Map2 = Eigen::TensorMap<Tensor2>;
using Eigen::Index;

constexpr std::int64_t KiB = 1024;
constexpr std::int64_t MiB = 1024 * KiB;
constexpr std::int64_t GiB = 1024 * MiB;

// ---- options --------------------------------------------------------------------------------

constexpr const char* kUsage =
    "usage: pmap-bench [--quick] [--json FILE] [--devices N] [--threads N] [--filter REGEX]\n"
    "                  [--size BYTES] [--rounds N]\n"
    "  --quick          CI smoke run: 3 rounds, small sizes, under a minute\n"
    "  --json FILE      also write the report as JSON (bench/plot_report.py draws it)\n"
    "  --devices N      devices of the default runtime (default: pmap::device_count())\n"
    "  --threads N      worker threads (default: min(devices, hardware threads))\n"
    "  --filter REGEX   run only the workloads whose name or group matches: dispatch,\n"
    "                   shard_dispatch, break_even, triad, gemm, psum_latency, bandwidth,\n"
    "                   oversubscription, idle, tree_pmean; the group apps: batched_solve,\n"
    "                   mlp_step, heat_stencil, monte_carlo, sample_sort,\n"
    "                   ring_matmul\n"
    "  --size BYTES     out-of-cache triad size per array (K/M/G suffixes; default 1G,\n"
    "                   64M with --quick); collectives move an eighth of it per device\n"
    "  --rounds N       measured rounds per case (default 15, 3 with --quick)\n";

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "pmap-bench: %s\n%s", what.c_str(), kUsage);
  std::exit(2);
}

std::int64_t parse_bytes(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  const std::string suffix(end);
  double scale = 0;
  if (suffix.empty() || suffix == "B") scale = 1;
  if (suffix == "K" || suffix == "KiB") scale = KiB;
  if (suffix == "M" || suffix == "MiB") scale = MiB;
  if (suffix == "G" || suffix == "GiB") scale = GiB;
  if (end == text.c_str() || scale == 0 || !(value > 0))
    usage_error("--size needs a positive byte count like 1073741824 or 1G, got '" + text + "'");
  return static_cast<std::int64_t>(value * scale);
}

int parse_count(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || value <= 0 || value > 4096)
    usage_error(flag + " needs a positive integer, got '" + text + "'");
  return static_cast<int>(value);
}

Options parse(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--quick") {
      opt.quick = true;
    } else if (arg == "--json") {
      opt.json = value();
    } else if (arg == "--devices") {
      opt.devices = parse_count(arg, value());
    } else if (arg == "--threads") {
      opt.threads = parse_count(arg, value());
    } else if (arg == "--filter") {
      opt.filter = value();
    } else if (arg == "--size") {
      opt.size = parse_bytes(value());
    } else if (arg == "--rounds") {
      opt.rounds = parse_count(arg, value());
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      usage_error("unknown argument '" + arg + "'");
    }
  }
  return opt;
}

// ---- what every workload gets --------------------------------------------------------------

/// A [rows, cols] tensor filled with `value`, first touched by `threads` OpenMP threads.
Tensor2 filled(std::int64_t rows, std::int64_t cols, float value, int threads) {
  Tensor2 t(rows, cols);
  pb::parallel_fill(t.data(), static_cast<std::size_t>(t.size()), value, threads);
  return t;
}


// ---- dispatch ------------------------------------------------------------------------------

void dispatch(Env& env) {
  std::vector<int> counts;
  for (const int d : {2, env.devices, 8})
    if (std::find(counts.begin(), counts.end(), d) == counts.end()) counts.push_back(d);
  for (const int d : counts) {
    const int t = env.threads_for(d);
    pmap::Runtime rt({.num_devices = d, .num_threads = t});
    tbb::task_arena arena(t);
    arena.initialize();
    Tensor2 x(d, 1);
    x.setZero();
    const float* px = x.data();
    auto touch = [px](int i) {
      const float* p = px + i;
      benchmark::DoNotOptimize(p);
    };
    auto f = pmap::pmap([](auto row) { benchmark::DoNotOptimize(row.data()); }, {.runtime = &rt});

    const std::string size = devices_threads(d, t);
    Case c("dispatch, " + size);
    c.add("pmap", repeat([&] { f(x); }));
    c.add("tbb", repeat([&] { pb::tbb_for_each(arena, d, touch); }));
    add_omp(c, "omp", t, repeat([&] { pb::omp_for_each(d, t, touch); }));
    c.measure(env.settings);
    env.report->add(
        pr::compare(c, "dispatch", size, "pmap", "tbb", Case::kTime, Target::at_most(1.5, 1.2)));
    env.report->add(
        pr::compare(c, "dispatch", size, "pmap", "omp", Case::kTime, Target::at_most(1.0)));
  }
}

// ---- shard_map dispatch --------------------------------------------------------------------

void shard_dispatch(Env& env) {
  const int d = 2;
  const int t = env.threads_for(d);
  pmap::Runtime rt({.num_devices = d, .num_threads = t});
  const pmap::Mesh mesh({{"x", d}}, &rt);
  Tensor2 x(d, 1);
  x.setZero();
  // The same empty kernel: pmap passes each device its row, shard_map its [1,1] block.
  auto empty = [](auto part) { benchmark::DoNotOptimize(part.data()); };
  auto f = pmap::pmap(empty, {.runtime = &rt});
  auto s = pmap::shard_map(empty, mesh, {pmap::P("x")}, {});

  const std::string size = "[2,1], " + devices_threads(d, t);
  Case c("shard dispatch, " + size);
  c.add("shard_map", repeat([&] { s(x); }));
  c.add("pmap", repeat([&] { f(x); }));
  c.measure(env.settings);
  env.report->add(pr::compare(c, "shard_dispatch", size, "shard_map", "pmap", Case::kTime,
                              Target::at_most(1.1)));
}

// ---- break-even ----------------------------------------------------------------------------

auto triad_kernel() {
  return [](auto a, auto b) { return a + 0.5f * b; };
}

void break_even(Env& env) {
  const int d = env.devices;
  const int t = env.threads_for(d);
  pmap::Runtime rt({.num_devices = d, .num_threads = t});
  auto f = pmap::pmap(triad_kernel(), {.runtime = &rt});
  struct Point {
    double bytes;      // per array per device
    double pmap, omp;  // median time ratio to the serial loop
  };
  std::vector<Point> curve;
  const pr::Interference interference;
  const std::int64_t max_floats = env.opt.quick ? std::int64_t{1} << 16 : std::int64_t{1} << 20;
  for (std::int64_t n = 16; n <= max_floats; n *= 2) {
    Tensor2 a = filled(d, n, 1.f, t), b = filled(d, n, 2.f, t), c = filled(d, n, 0.f, t);
    const auto total = static_cast<std::size_t>(a.size());
    Case cs("break-even, " + pr::format_bytes(4.0 * static_cast<double>(n)) + "/device");
    cs.add("pmap", repeat([&] { f.into(c, a, b); }));
    cs.add("serial", repeat([&] {
             pb::triad_range(c.data(), a.data(), b.data(), 0, total);
             benchmark::ClobberMemory();
           }));
    add_omp(cs, "omp", t, repeat([&] { pb::omp_triad(c.data(), a.data(), b.data(), total, t); }));
    cs.measure(env.settings);
    curve.push_back({4.0 * static_cast<double>(n),
                     pr::stat(cs.ratios("pmap", "serial", Case::kTime)).median,
                     pr::stat(cs.ratios("omp", "serial", Case::kTime)).median});
  }
  // The smallest size from which on (up to the largest measured) the ratio stays below 1.
  auto break_even_at = [&](double Point::*ratio) {
    double at = std::numeric_limits<double>::infinity();
    for (auto p = curve.rbegin(); p != curve.rend() && (*p).*ratio < 1; ++p) at = p->bytes;
    return at;
  };
  pr::Row row;
  row.workload = "break_even";
  row.size = "triad, bytes/array/device";
  row.pmap = "pmap";
  row.pmap_value = break_even_at(&Point::pmap);
  row.pmap_figure = pr::format_bytes(row.pmap_value);
  row.baseline = "omp";
  row.baseline_value = break_even_at(&Point::omp);
  row.baseline_figure = pr::format_bytes(row.baseline_value);
  row.unit = "B";
  row.ratio_meaning = "break-even size pmap / break-even size omp";
  row.ratio.median = row.pmap_value / row.baseline_value;
  row.has_range = false;
  row.others = interference.others();
  env.report->add(row);

  std::string json = "[";
  for (const Point& p : curve)
    json += pr::format("%s{\"bytes\": %.0f, \"pmap_vs_serial\": %s, \"omp_vs_serial\": %s}",
                       json.size() > 1 ? ", " : "", p.bytes, pr::json_number(p.pmap).c_str(),
                       pr::json_number(p.omp).c_str());
  env.report->add_json("break_even", json + "]");
}

// ---- triad ---------------------------------------------------------------------------------

void triad(Env& env) {
  const int d = env.devices;
  const int t = env.threads_for(d);
  pmap::Runtime rt({.num_devices = d, .num_threads = t});
  tbb::task_arena arena(t);
  arena.initialize();
  auto f = pmap::pmap(triad_kernel(), {.runtime = &rt});
  const std::pair<const char*, std::int64_t> sizes[] = {{"in cache", 256 * KiB * d},
                                                        {"out of cache", env.big}};
  for (const auto& [where, bytes] : sizes) {
    const std::int64_t n = std::max<std::int64_t>(16, bytes / 4 / d);  // floats per device
    Tensor2 a = filled(d, n, 1.f, t), b = filled(d, n, 2.f, t), c = filled(d, n, 0.f, t);
    const auto total = static_cast<std::size_t>(a.size());
    const auto index = static_cast<Eigen::Index>(total);
    const Map1 am(a.data(), index), bm(b.data(), index);
    Map1 cm(c.data(), index);
    pb::EigenPool pool(t);
    const double traffic = 3.0 * 4.0 * static_cast<double>(total);  // read a, b; write c

    const std::string size =
        std::string(where) + ": " + pr::format_bytes(4.0 * static_cast<double>(total)) + "/array";
    Case cs("triad, " + size);
    cs.add("pmap", repeat([&] { f.into(c, a, b); }), 1, traffic);
    add_omp(cs, "omp", t, repeat([&] { pb::omp_triad(c.data(), a.data(), b.data(), total, t); }), 1,
            traffic);
    cs.add("tbb", repeat([&] { pb::tbb_triad(arena, c.data(), a.data(), b.data(), total); }), 1,
           traffic);
    cs.add("eigen", repeat([&] { cm.device(pool.device) = am + 0.5f * bm; }), 1, traffic);
    cs.measure(env.settings);
    for (const auto& [base, target] :
         {std::pair{"omp", Target::at_least(0.95)}, std::pair{"eigen", Target::at_least(1.0)},
          std::pair{"tbb", Target{}}})
      env.report->add(
          pr::compare(cs, "triad", size, "pmap", base, Case::kRate, target, "GB/s", 1e-9));
  }
}

// ---- batched GEMM --------------------------------------------------------------------------

void gemm(Env& env) {
  const int d = env.devices;
  const int t = env.threads_for(d);
  pmap::Runtime rt({.num_devices = d, .num_threads = t});
  pb::EigenPool pool(t);
  const Eigen::array<Eigen::IndexPair<int>, 1> dims{Eigen::IndexPair<int>(1, 0)};
  auto f = pmap::pmap([dims](auto a, auto b) { return a.contract(b, dims); }, {.runtime = &rt});
  const std::vector<int> sizes =
      env.opt.quick ? std::vector<int>{64, 256} : std::vector<int>{64, 1024};
  for (const int m : sizes) {
    Tensor3 a(d, m, m), b(d, m, m), c(d, m, m);
    a.setRandom();
    b.setRandom();
    c.setZero();
    const std::int64_t stride = std::int64_t{m} * m;
    auto slice = [m, stride](Tensor3& x, int i) { return Map2(x.data() + i * stride, m, m); };
    auto product = [&](int i) { return slice(a, i).contract(slice(b, i), dims); };
    const double flops = 2.0 * m * m * static_cast<double>(m) * d;

    const std::string size = pr::format("%d x [%d,%d]x[%d,%d]", d, m, m, m, m);
    Case cs("gemm, " + size);
    cs.add("pmap", repeat([&] { f.into(c, a, b); }), 1, flops);
    cs.add("eigen_loop", repeat([&] {
             for (int i = 0; i < d; ++i) slice(c, i).device(pool.device) = product(i);
           }),
           1, flops);
    cs.add("eigen_batch", repeat([&] {
             pr::eigen_for_each(pool.pool, d, [&](int i) { slice(c, i) = product(i); });
           }),
           1, flops);
    cs.add("serial", repeat([&] {
             for (int i = 0; i < d; ++i) slice(c, i) = product(i);
           }),
           1, flops);
    cs.measure(env.settings);
    // Eigen's strongest threaded form at this size carries the target; the other is reported.
    const bool loop_wins = cs.median_rate("eigen_loop") >= cs.median_rate("eigen_batch");
    const char* strong = loop_wins ? "eigen_loop" : "eigen_batch";
    const char* weak = loop_wins ? "eigen_batch" : "eigen_loop";
    env.report->add(pr::compare(cs, "gemm", size, "pmap", strong, Case::kRate,
                                Target::at_least(1.0), "GFLOP/s", 1e-9));
    for (const char* base : {weak, "serial"})
      env.report->add(
          pr::compare(cs, "gemm", size, "pmap", base, Case::kRate, Target{}, "GFLOP/s", 1e-9));
  }
}

// ---- collectives ---------------------------------------------------------------------------

/// `ops` chained psums per dispatch over axis "i": the first reads the argument in place, the
/// others donate the previous result (a large psum then reduces into it, as a training loop's
/// gradient allreduce would).
auto psum_chain(pmap::Runtime& rt, int ops) {
  return pmap::pmap(
      [ops](pmap::Context& ctx, auto row) {
        Tensor1 v = ctx.psum(row, "i");
        for (int k = 1; k < ops; ++k) v = ctx.psum(std::move(v), "i");
        benchmark::DoNotOptimize(v.data());
      },
      {.axis_name = "i", .runtime = &rt});
}

constexpr std::int64_t kLatencyFloats = 8 * KiB / 4;

void psum_latency(Env& env) {
  const int d = 2;
  const int t = env.threads_for(d);
  const int ops = env.ops(200);
  pmap::Runtime rt({.num_devices = d, .num_threads = t});
  auto f = psum_chain(rt, ops);
  Tensor2 x = filled(d, kLatencyFloats, 0.f, t), x1 = filled(d, 1, 0.f, t);
  Tensor2 buf0 = filled(t, kLatencyFloats, 0.f, t), buf1 = filled(t, kLatencyFloats, 0.f, t);
  float* const bufs[2] = {buf0.data(), buf1.data()};
  pb::SpinBarrier barrier(t), psum_barrier(t);
  std::vector<pb::Sense> sense(static_cast<std::size_t>(t)), psum_sense(sense);

  const std::string size = "8 KiB, " + devices_threads(d, t);
  Case c("psum latency, " + size);
  c.add("pmap psum", repeat([&] { f(x); }), ops);
  c.add("pmap psum 4 B", repeat([&] { f(x1); }), ops);
  add_omp(c, "spin_barrier", t, repeat([&] {
#pragma omp parallel num_threads(t)
            {
              bool& mine = sense[static_cast<std::size_t>(omp_get_thread_num())].value;
              for (int k = 0; k < ops; ++k) barrier.arrive_and_wait(mine);
            }
          }),
          ops);
  add_omp(c, "omp_barrier", t, repeat([&] {
#pragma omp parallel num_threads(t)
            for (int k = 0; k < ops; ++k) {
#pragma omp barrier
            }
          }),
          ops);
  add_omp(c, "spin_psum", t,
          repeat([&] { pb::spin_psum(psum_barrier, psum_sense, t, bufs, kLatencyFloats, ops); }),
          ops);
  c.measure(env.settings);
  // The target: what pmap's psum costs beyond a hand-written one (the same two barriers and
  // the same reads of the peer's operand), at most two spin barriers.
  env.report->add(pr::excess(c, "psum_latency", size, "pmap psum", "spin_psum", "spin_barrier",
                             Target::at_most(2.0)));
  for (const char* base : {"spin_psum", "spin_barrier", "omp_barrier"})
    env.report->add(pr::compare(c, "psum_latency", size, "pmap psum", base, Case::kTime, Target{}));
  // The same chain on 4-byte operands: what the synchronisation alone costs.
  env.report->add(pr::compare(c, "psum_latency", "4 B, " + devices_threads(d, t), "pmap psum 4 B",
                              "spin_barrier", Case::kTime, Target{}));
}

void oversubscription(Env& env) {
  const int t = 2;
  const int ops = env.ops(200);
  pmap::Runtime rt2({.num_devices = 2, .num_threads = t});
  pmap::Runtime rt4({.num_devices = 4, .num_threads = t});
  pmap::Runtime rt8({.num_devices = 8, .num_threads = t});
  auto f2 = psum_chain(rt2, ops), f4 = psum_chain(rt4, ops), f8 = psum_chain(rt8, ops);
  Tensor2 x2 = filled(2, kLatencyFloats, 0.f, t), x4 = filled(4, kLatencyFloats, 0.f, t),
          x8 = filled(8, kLatencyFloats, 0.f, t);

  Case c("oversubscription, 8 KiB psum");
  c.add("2 on 2", repeat([&] { f2(x2); }), ops);
  c.add("4 on 2", repeat([&] { f4(x4); }), ops);
  c.add("8 on 2", repeat([&] { f8(x8); }), ops);
  c.measure(env.settings);
  const std::string size = "8 KiB psum, devices on 2 threads";
  env.report->add(pr::compare(c, "oversubscription", size, "4 on 2", "2 on 2", Case::kTime,
                              Target::at_most(2.5)));
  env.report->add(pr::compare(c, "oversubscription", size, "8 on 2", "2 on 2", Case::kTime,
                              Target::at_most(5.0)));
}

/// The hand-written peers of pmap's collectives in cache (bench/baselines.hpp): the same
/// rows of `n` floats per thread, read from the other core's cache, with the barriers of the
/// algorithm each stands for. One device per thread only: a thread is a device there.
struct HandWritten {
  HandWritten(int threads, std::int64_t n)
      : t(threads),
        len(static_cast<std::size_t>(n)),
        a(filled(threads, n, 0.f, threads)),
        b(filled(threads, n, 0.f, threads)),
        bufs{a.data(), b.data()},
        barrier(threads),
        sense(static_cast<std::size_t>(threads)) {}
  void add(Case& c, int ops, double received) {
    add_omp(c, "spin_psum", t,
            repeat([this, ops] { pb::spin_split_psum(barrier, sense, t, a.data(), len, ops); }),
            ops, received);
    add_omp(c, "spin_ppermute", t,
            repeat([this, ops] { pb::spin_ppermute(barrier, sense, t, bufs, len, ops); }), ops,
            received);
    add_omp(c, "spin_all_to_all", t,
            repeat([this, ops] { pb::spin_all_to_all(barrier, sense, t, bufs, len, ops); }), ops,
            received);
  }
  static void report(Env& env, const Case& c, const std::string& size) {
    for (const char* op : {"psum", "ppermute", "all_to_all"})
      env.report->add(pr::compare(c, "bandwidth", size, op, std::string("spin_") + op, Case::kRate,
                                  Target::at_least(0.8), "GB/s", 1e-9));
  }
  const int t;
  const std::size_t len;
  Tensor2 a, b;
  float* const bufs[2];
  pb::SpinBarrier barrier;
  std::vector<pb::Sense> sense;
};

void bandwidth(Env& env) {
  const int d = env.devices;
  const int t = env.threads_for(d);
  pmap::Runtime rt({.num_devices = d, .num_threads = t});
  const pmap::Options options{.axis_name = "i", .runtime = &rt};
  std::vector<std::pair<int, int>> shift;
  for (int i = 0; i < d; ++i) shift.emplace_back(i, (i + 1) % d);

  const std::pair<const char*, std::int64_t> sizes[] = {{"in cache", 64 * KiB},
                                                        {"out of cache", env.big / 8}};
  for (const auto& [where, bytes] : sizes) {
    // Floats per device, a multiple of d so that all_gather and all_to_all split evenly.
    const std::int64_t n = std::max<std::int64_t>(d, bytes / 4 / d * d);
    const int ops = bytes <= 4 * MiB ? env.ops(200) : 8;
    Tensor2 x = filled(d, n, 0.f, t), dst = filled(d, n, 0.f, t);
    const Map2 gather_in(x.data(), d, n / d);  // each device sends n/d, receives n
    std::vector<void*> to;
    std::vector<const void*> from;
    for (int i = 0; i < d; ++i) {
      to.push_back(dst.data() + i * n);
      from.push_back(x.data() + i * n);
    }
    const auto row_bytes = static_cast<std::size_t>(n) * 4;
    const double received = static_cast<double>(row_bytes) * d;  // by all devices, per op

    // Chains of `ops` collectives per dispatch on a per-device buffer that persists across
    // calls (a training loop's gradients, a simulation's state): in steady state nothing is
    // allocated, as in the memcpy baseline, which copies into a preallocated destination.
    // Fresh memory costs page faults, several times the copy at 128 MiB; the "fresh" rows
    // show that cost, for pmap and for memcpy.
    std::vector<Tensor1> state(static_cast<std::size_t>(d));
    auto take_state = [&state](pmap::Context& ctx, const auto& row) {
      Tensor1& s = state[static_cast<std::size_t>(ctx.axis_index("i"))];
      if (s.size() != row.size()) s = row;  // the first (warm-up) call
      return std::move(s);
    };
    auto put_state = [&state](pmap::Context& ctx, Tensor1&& v) {
      benchmark::DoNotOptimize(v.data());
      state[static_cast<std::size_t>(ctx.axis_index("i"))] = std::move(v);
    };
    auto chain = [&](auto step) {
      return pmap::pmap(
          [ops, step, &take_state, &put_state](pmap::Context& ctx, auto row) {
            Tensor1 v = take_state(ctx, row);
            for (int k = 0; k < ops; ++k) v = step(ctx, std::move(v));
            put_state(ctx, std::move(v));
          },
          options);
    };
    auto psum = chain([](pmap::Context& ctx, Tensor1&& v) { return ctx.psum(std::move(v), "i"); });
    auto all_to_all = chain([](pmap::Context& ctx, Tensor1&& v) {
      return ctx.all_to_all(std::move(v), "i", 0, 0, pmap::tiled);
    });
    auto ppermute = chain([&shift](pmap::Context& ctx, Tensor1&& v) {
      return ctx.ppermute(std::move(v), "i", shift);
    });
    // all_gather's result is d times its input: each one is handed back for the next.
    auto gather = [ops](bool donate) {
      return [ops, donate](pmap::Context& ctx, auto row) {
        for (int k = 0; k < ops; ++k) {
          auto v = ctx.all_gather(row, "i");
          benchmark::DoNotOptimize(v.data());
          if (donate) ctx.donate(std::move(v));
        }
      };
    };
    auto all_gather = pmap::pmap(gather(true), options);
    auto all_gather_fresh = pmap::pmap(gather(false), options);

    const std::string size =
        std::string(where) + ": " + pr::format_bytes(static_cast<double>(row_bytes)) + "/device";
    Case c("bandwidth, " + size);
    c.add("psum", repeat([&] { psum(x); }), ops, received);
    c.add("all_gather", repeat([&] { all_gather(gather_in); }), ops, received);
    c.add("all_to_all", repeat([&] { all_to_all(x); }), ops, received);
    c.add("ppermute", repeat([&] { ppermute(x); }), ops, received);
    c.add("all_gather fresh", repeat([&] { all_gather_fresh(gather_in); }), ops, received);
    add_omp(c, "memcpy", t,
            repeat([&] { pr::omp_copy_rows(t, to.data(), from.data(), d, row_bytes, ops); }), ops,
            received);
    add_omp(c, "memcpy_alloc", t, repeat([&] {
              for (int k = 0; k < ops; ++k) pb::omp_memcpy_alloc(t, from.data(), row_bytes);
            }),
            ops, static_cast<double>(row_bytes) * t);
    const bool out_of_cache = bytes > 4 * MiB;
    std::optional<HandWritten> hand;
    if (!out_of_cache && d == t) hand.emplace(t, n).add(c, ops, received);
    c.measure(env.settings);
    // The memcpy targets are for memory bandwidth (out of cache). In cache, memcpy copies a
    // thread's own L2-resident row while every collective must pull its peers' rows across
    // cores, so those rows are reported only; the hand-written collectives, which pull the
    // same rows, are the targets there.
    if (hand) HandWritten::report(env, c, size);
    auto target = [out_of_cache](Target goal) { return out_of_cache ? goal : Target{}; };
    for (const auto& [op, goal] :
         {std::pair{"psum", target(Target::at_least(0.6, 0.7))},
          std::pair{"all_gather", target(Target::at_least(0.8))},
          std::pair{"all_to_all", target(Target::at_least(0.8))}, std::pair{"ppermute", Target{}}})
      env.report->add(
          pr::compare(c, "bandwidth", size, op, "memcpy", Case::kRate, goal, "GB/s", 1e-9));
    env.report->add(pr::compare(c, "bandwidth", size, "all_gather fresh", "memcpy_alloc",
                                Case::kRate, Target{}, "GB/s", 1e-9));
  }
}

// ---- idle ----------------------------------------------------------------------------------

void idle(Env& env) {
  const int d = env.devices;
  const int t = env.threads_for(d);
  pmap::Runtime rt({.num_devices = d, .num_threads = t});
  Tensor2 x(d, 1);
  x.setZero();
  auto f = pmap::pmap([](auto row) { benchmark::DoNotOptimize(row.data()); }, {.runtime = &rt});
  constexpr int kBurst = 200;
  constexpr auto kGap = std::chrono::milliseconds(10);

  std::vector<double> cpu, wall, busy, first, warm, cold_ratio;
  const auto start = pr::Clock::now();
  const pr::Interference interference;
  std::fprintf(stderr, "  %-44s", "idle, 10 ms gap after a burst");
  for (int round = -1; round < env.settings.rounds; ++round) {  // round -1 warms up
    pr::settle();
    for (int k = 0; k < kBurst; ++k) f(x);
    const double cpu0 = pr::process_cpu_seconds();
    const auto wall0 = pr::Clock::now();
    std::this_thread::sleep_for(kGap);
    const double gap_cpu = pr::process_cpu_seconds() - cpu0;
    const double gap_wall = pr::seconds_since(wall0);

    auto t0 = pr::Clock::now();
    f(x);
    const double first_dispatch = pr::seconds_since(t0);
    std::vector<double> warm_times;
    for (int k = 0; k < 51; ++k) {
      t0 = pr::Clock::now();
      f(x);
      warm_times.push_back(pr::seconds_since(t0));
    }
    const double warm_dispatch = pr::stat(warm_times).median;
    if (round < 0) continue;
    cpu.push_back(gap_cpu);
    wall.push_back(gap_wall);
    busy.push_back(gap_cpu / gap_wall);
    first.push_back(first_dispatch);
    warm.push_back(warm_dispatch);
    cold_ratio.push_back(first_dispatch / warm_dispatch);
  }
  const double others = interference.others();
  std::fprintf(stderr, " %6.1f s, others used %.2f cores\n", pr::seconds_since(start), others);

  pr::Row gap;
  gap.others = others;
  gap.workload = "idle";
  gap.size = pr::format("10 ms gap, %d dispatches before", kBurst);
  gap.pmap = "cpu";
  gap.pmap_value = pr::stat(cpu).median;
  gap.pmap_figure = pr::format_time(gap.pmap_value);
  gap.baseline = "wall";
  gap.baseline_value = pr::stat(wall).median;
  gap.baseline_figure = pr::format_time(gap.baseline_value);
  gap.unit = "s";
  gap.ratio_meaning = "process CPU time / wall time of the gap";
  gap.rounds = busy;
  gap.ratio = pr::stat(busy);
  gap.target = Target::at_most(0.05);
  env.report->add(gap);

  pr::Row wake = gap;
  wake.size = "first dispatch after the gap";
  wake.pmap = "first";
  wake.pmap_value = pr::stat(first).median;
  wake.pmap_figure = pr::format_time(wake.pmap_value);
  wake.baseline = "warm";
  wake.baseline_value = pr::stat(warm).median;
  wake.baseline_figure = pr::format_time(wake.baseline_value);
  wake.ratio_meaning = "time first dispatch / time warm dispatch";
  wake.rounds = cold_ratio;
  wake.ratio = pr::stat(cold_ratio);
  wake.target = Target{};
  env.report->add(wake);
}

// ---- tree_pmean ----------------------------------------------------------------------------

/// A pmean over a tuple of 4 tensors (64 KiB together) in one collective vs one pmean of a
/// 64 KiB tensor, and vs the same 4 tensors in 4 pmeans: `ops` chained per dispatch on 2
/// devices, each result assigned back (the same allocations in all three).
void tree_pmean(Env& env) {
  const int d = 2;
  const int t = env.threads_for(d);
  const int ops = env.ops(100);
  pmap::Runtime rt({.num_devices = d, .num_threads = t});
  constexpr Eigen::Index kQuarter = 16 * 1024 / 4;  // floats: 16 KiB per leaf
  Tensor2 x = filled(d, 4 * kQuarter, 1.f, t);
  Tensor2 q0 = filled(d, kQuarter, 1.f, t), q1 = q0, q2 = q0, q3 = q0;
  const pmap::Options o{.axis_name = "i", .runtime = &rt};
  auto one = pmap::pmap(
      [ops](pmap::Context& ctx, auto v) {
        Tensor1 a = v;
        for (int k = 0; k < ops; ++k) a = ctx.pmean(a, "i");
        benchmark::DoNotOptimize(a.data());
      },
      o);
  auto tree = pmap::pmap(
      [ops](pmap::Context& ctx, auto v0, auto v1, auto v2, auto v3) {
        Tensor1 a = v0, b = v1, c = v2, e = v3;
        for (int k = 0; k < ops; ++k) std::tie(a, b, c, e) = ctx.pmean(std::tie(a, b, c, e), "i");
        benchmark::DoNotOptimize(a.data());
      },
      o);
  auto four = pmap::pmap(
      [ops](pmap::Context& ctx, auto v0, auto v1, auto v2, auto v3) {
        Tensor1 a = v0, b = v1, c = v2, e = v3;
        for (int k = 0; k < ops; ++k) {
          a = ctx.pmean(a, "i");
          b = ctx.pmean(b, "i");
          c = ctx.pmean(c, "i");
          e = ctx.pmean(e, "i");
        }
        benchmark::DoNotOptimize(a.data());
      },
      o);
  const std::string size = "4 x 16 KiB, " + devices_threads(d, t);
  Case c("tree pmean, " + size);
  c.add("tree", repeat([&] { tree(q0, q1, q2, q3); }), ops);
  c.add("one 64 KiB", repeat([&] { one(x); }), ops);
  c.add("four pmeans", repeat([&] { four(q0, q1, q2, q3); }), ops);
  c.measure(env.settings);
  env.report->add(pr::compare(c, "tree_pmean", size, "tree", "one 64 KiB", Case::kTime,
                              Target::at_most(1.3)));
  env.report->add(pr::compare(c, "tree_pmean", size, "tree", "four pmeans", Case::kTime, Target{}));
}

struct Workload {
  const char* name;
  void (*run)(Env&);
  const char* group = "";  ///< --filter matches the name or the group
};

constexpr Workload kWorkloads[] = {
    {"dispatch", dispatch},
    {"shard_dispatch", shard_dispatch},
    {"break_even", break_even},
    {"triad", triad},
    {"gemm", gemm},
    {"batched_solve", pr::batched_solve, "apps"},
    {"mlp_step", pr::mlp_step, "apps"},
    {"heat_stencil", pr::heat_stencil, "apps"},
    {"monte_carlo", pr::monte_carlo, "apps"},
    {"sample_sort", pr::sample_sort, "apps"},
    {"ring_matmul", pr::ring_matmul, "apps"},
    {"psum_latency", psum_latency},
    {"bandwidth", bandwidth},
    {"oversubscription", oversubscription},
    {"idle", idle},
    {"tree_pmean", tree_pmean},
};

}  // namespace

#if PMAP_BENCH_WITH_MPI
/// Under mpirun: only the multi-process cases (every process runs them; process 0 reports).
int run_mpi(const Env& env) {
  // The processes of this node share its cores: unless told otherwise, each gets its share,
  // with one device per thread (oversubscribed cores would measure the OS scheduler).
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const char* world = std::getenv("OMPI_COMM_WORLD_SIZE");
  const int per_node = local ? std::max(1, std::atoi(local)) : 1;
  const int procs = world ? std::max(1, std::atoi(world)) : 1;
  const int share = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / per_node);
  const int threads = env.opt.threads > 0 ? env.opt.threads : share;
  const int devices = env.opt.devices > 0 ? env.opt.devices : threads;
  // The apps' baseline: one process with every process's devices and threads (created before
  // initialize(), so that it does not span the processes).
  pmap::Runtime alone({.num_devices = devices * procs, .num_threads = threads * procs});
  pmap::distributed::initialize();
  std::vector<pr::Row> rows =
      pr::mpi_workloads(devices, threads, env.opt.quick, env.settings.rounds);
  if (pr::mpi_apps_fit(threads * procs, per_node == procs)) {
    pmap::Runtime spanning({.num_devices = devices, .num_threads = threads});
    for (pr::Row& row : pr::mpi_app_workloads(spanning, alone, env.opt.quick, env.settings.rounds))
      rows.push_back(std::move(row));
  }
  int rc = 0;
  if (pmap::process_index() == 0) {
    pr::Report report(pr::Machine::describe(pmap::device_count()));
    std::printf("%s\n%d processes\n\n", report.machine().line().c_str(), pmap::process_count());
    for (pr::Row& row : rows) report.add(std::move(row));
    report.print(stdout);
    if (!env.opt.json.empty() && !report.write_json(env.opt.json, "{\"mpi\": true}")) {
      std::fprintf(stderr, "pmap-bench: cannot write %s\n", env.opt.json.c_str());
      rc = 1;
    }
  }
  pmap::distributed::finalize();
  return rc;
}
#endif

/// libgomp reads its wait policy when it loads, before main: so the OpenMP baselines spin
/// for a bounded time after each region, pmap-bench sets GOMP_SPINCOUNT (unless the caller
/// chose a policy) and runs itself again. libgomp's default, 300,000 spins, lasts hundreds
/// of milliseconds on a VM that traps PAUSE (PAUSE-loop exiting), longer than the harness
/// waits for quiet (settle(), 50 ms): the OpenMP worker then spins through the next
/// implementation's sample on a core it needs (pmap's batched_solve at 0.64x omp with the
/// default, 0.98x with 10,000; the 8 KiB psum 4.1 us against 2.2 us). 10,000 spins keep
/// back-to-back regions as fast as the default (an OpenMP region 1.06 us against 1.1 us,
/// its barrier 442 ns against 441 ns, measured in this report).
constexpr const char* kOmpSpinCount = "10000";
void bound_openmp_spinning(char** argv) {
  if (std::getenv("GOMP_SPINCOUNT") || std::getenv("OMP_WAIT_POLICY")) return;
  setenv("GOMP_SPINCOUNT", kOmpSpinCount, 1);
  execv("/proc/self/exe", argv);
  std::perror("pmap-bench: could not run itself again with GOMP_SPINCOUNT set");  // runs on
}

int main(int argc, char** argv) {
  bound_openmp_spinning(argv);
  Env env;
  env.opt = parse(argc, argv);
  const Options& opt = env.opt;
  // The global runtime (pmap::device_count()) reads these on first use.
  if (opt.devices > 0) setenv("PMAP_NUM_DEVICES", std::to_string(opt.devices).c_str(), 1);
  if (opt.threads > 0) setenv("PMAP_NUM_THREADS", std::to_string(opt.threads).c_str(), 1);
  std::regex filter;
  try {
    filter = std::regex(opt.filter.empty() ? "." : opt.filter);
  } catch (const std::regex_error& e) {
    usage_error("--filter '" + opt.filter + "' is not a regular expression: " + e.what());
  }

  try {
    env.devices = pmap::device_count();
    env.settings.rounds = opt.rounds > 0 ? opt.rounds : opt.quick ? 3 : 15;
    env.settings.sample_seconds = opt.quick ? 1e-3 : 10e-3;
    env.big = opt.size > 0 ? opt.size : opt.quick ? 64 * MiB : GiB;
#if PMAP_BENCH_WITH_MPI
    if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE")) return run_mpi(env);
#endif
    pr::Report report(pr::Machine::describe(env.devices));
    env.report = &report;
    std::printf("%s\n", report.machine().line().c_str());
    std::printf("OpenMP waits: GOMP_SPINCOUNT=%s, OMP_WAIT_POLICY=%s\n",
                std::getenv("GOMP_SPINCOUNT") ? std::getenv("GOMP_SPINCOUNT") : "(default)",
                std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "(default)");
    std::fflush(stdout);

    const auto start = pr::Clock::now();
    const pr::Interference interference;
    for (const Workload& w : kWorkloads) {
      if (!std::regex_search(w.name, filter) && !std::regex_search(w.group, filter)) continue;
      std::fprintf(stderr, "[%s]\n", w.name);
      w.run(env);
    }
    const double others = interference.others();
    std::fprintf(stderr, "pmap-bench: %.1f s\n", pr::seconds_since(start));

    std::printf("\n");
    report.print(stdout);
    std::printf("other processes used %.2f cores on average during the run (%.1f s)\n", others,
                pr::seconds_since(start));
    report.add_json("others", pr::json_number(others));
    if (!opt.json.empty()) {
      const std::string options =
          pr::format(
              "{\"quick\": %s, \"rounds\": %d, \"sample_seconds\": %g, \"size\": %lld, "
              "\"devices\": %d, \"threads\": %d, \"filter\": ",
              opt.quick ? "true" : "false", env.settings.rounds, env.settings.sample_seconds,
              static_cast<long long>(env.big), env.devices, opt.threads) +
          pr::json_string(opt.filter) + "}";
      if (!report.write_json(opt.json, options)) {
        std::fprintf(stderr, "pmap-bench: cannot write %s\n", opt.json.c_str());
        return 1;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pmap-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
