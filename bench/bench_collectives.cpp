// Collectives: latency and bandwidth of pmap's psum, all_gather, all_to_all and ppermute,
// next to hand-written baselines on the same threads.
//
// Every pmap benchmark runs one dispatch whose kernel loops over `ops` collectives, so the
// dispatch cost is amortised; `per_op` is real time per collective, and the ratio table at
// the end compares pmap with the baselines of the same workload and arguments.
//
//   psum_latency         8 KiB per device, 2 devices on 2 threads, 100 psums per dispatch,
//                        vs spin_barrier (one sense-reversing std::atomic barrier per op),
//                        omp_barrier (one `#pragma omp barrier` per op) and spin_psum (a
//                        hand-written 2-barrier psum: barrier, sum the peers' 8 KiB in
//                        place, barrier: the lower bound for what psum does).
//   psum_oversubscribed  the same psum with 4 and 8 devices on 2 threads (devices suspend in
//                        the collective) vs 2 devices on 2 threads (ref_2dev).
//   bandwidth            256 MiB received per device, 2 devices on 2 threads, one collective
//                        per dispatch: psum, all_gather (128 MiB in, 256 MiB out),
//                        all_to_all (tiled), ppermute (cyclic shift), vs memcpy of the same
//                        256 MiB per thread into preallocated memory, and memcpy_alloc
//                        (fresh destination every time, as an owning collective result).
//                        bytes_per_second counts the bytes every device receives.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <pmap/pmap.hpp>

#include "baselines.hpp"

namespace {

using Tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using Map2 = Eigen::TensorMap<Tensor2>;

constexpr int kLatencyOps = 100;
constexpr std::int64_t kLatencyBytes = 8 * 1024;
constexpr std::int64_t kBandwidthBytes = std::int64_t{256} << 20;

void label(benchmark::State& state, const char* impl, int devices, int threads,
           std::int64_t bytes) {
  state.SetLabel(std::string("impl=") + impl + " devices=" + std::to_string(devices) +
                 " threads=" + std::to_string(threads) + " bytes=" + std::to_string(bytes));
}

/// A [devices, bytes / 4] float tensor of ones: row i is device i's operand.
Tensor2 operands(int devices, std::int64_t bytes) {
  Tensor2 x(devices, bytes / static_cast<std::int64_t>(sizeof(float)));
  pmap::bench::parallel_fill(x.data(), static_cast<std::size_t>(x.size()), 1.f,
                             pmap::bench::hardware_threads());
  return x;
}

/// Runs `ops` collectives `op(ctx, row)` per dispatch, over axis "i" of `x`.
template <class Op>
void run_pmap(benchmark::State& state, pmap::Runtime& rt, const Map2& x, int ops, Op op) {
  auto f = pmap::pmap(
      [ops, op](pmap::Context& ctx, auto row) {
        for (int k = 0; k < ops; ++k) {
          auto y = op(ctx, row);
          benchmark::DoNotOptimize(y.data());
        }
      },
      {.axis_name = "i", .runtime = &rt});
  for (auto _ : state) f(x);
}

const auto psum = [](pmap::Context& ctx, const auto& row) { return ctx.psum(row, "i"); };

// ---- latency: 8 KiB on 2 devices / 2 threads -----------------------------------------------

void latency_pmap_psum(benchmark::State& state) {
  const int devices = static_cast<int>(state.range(0));
  const int threads = pmap::bench::threads_for(devices);
  Tensor2 x = operands(devices, state.range(1));
  pmap::Runtime rt({.num_devices = devices, .num_threads = threads});
  run_pmap(state, rt, Map2(x.data(), x.dimensions()), kLatencyOps, psum);
  state.counters["per_op"] = pmap::bench::time_per_op(kLatencyOps);
  label(state, "pmap_psum", devices, threads, state.range(1));
}

void latency_spin_barrier(benchmark::State& state) {
  const int threads = pmap::bench::threads_for(static_cast<int>(state.range(0)));
  pmap::bench::SpinBarrier barrier(threads);
  std::vector<pmap::bench::Sense> sense(static_cast<std::size_t>(threads));
  for (auto _ : state) {
#pragma omp parallel num_threads(threads)
    {
      bool& mine = sense[static_cast<std::size_t>(omp_get_thread_num())].value;
      for (int k = 0; k < kLatencyOps; ++k) barrier.arrive_and_wait(mine);
    }
  }
  state.counters["per_op"] = pmap::bench::time_per_op(kLatencyOps);
  label(state, "spin_barrier", threads, threads, state.range(1));
}

void latency_omp_barrier(benchmark::State& state) {
  const int threads = pmap::bench::threads_for(static_cast<int>(state.range(0)));
  for (auto _ : state) {
#pragma omp parallel num_threads(threads)
    {
      for (int k = 0; k < kLatencyOps; ++k) {
#pragma omp barrier
      }
    }
  }
  state.counters["per_op"] = pmap::bench::time_per_op(kLatencyOps);
  label(state, "omp_barrier", threads, threads, state.range(1));
}

void latency_spin_psum(benchmark::State& state) {
  const int devices = static_cast<int>(state.range(0));
  const int threads = pmap::bench::threads_for(devices);
  Tensor2 x = operands(threads, state.range(1)), y = operands(threads, state.range(1));
  float* const bufs[2] = {x.data(), y.data()};
  pmap::bench::SpinBarrier barrier(threads);
  std::vector<pmap::bench::Sense> sense(static_cast<std::size_t>(threads));
  for (auto _ : state)
    pmap::bench::spin_psum(barrier, sense, threads, bufs, static_cast<std::size_t>(x.dimension(1)),
                           kLatencyOps);
  state.counters["per_op"] = pmap::bench::time_per_op(kLatencyOps);
  label(state, "spin_psum", threads, threads, state.range(1));
}

// ---- psum with more devices than threads -------------------------------------------------

void oversubscribed(benchmark::State& state, int devices, const char* impl) {
  const int threads = static_cast<int>(state.range(0));
  Tensor2 x = operands(devices, state.range(1));
  pmap::Runtime rt({.num_devices = devices, .num_threads = threads});
  run_pmap(state, rt, Map2(x.data(), x.dimensions()), kLatencyOps, psum);
  state.counters["per_op"] = pmap::bench::time_per_op(kLatencyOps);
  label(state, impl, devices, threads, state.range(1));
}

// ---- bandwidth: 256 MiB received per device ------------------------------------------------

struct Bandwidth {
  explicit Bandwidth(benchmark::State& state)
      : devices(static_cast<int>(state.range(0))),
        threads(pmap::bench::threads_for(devices)),
        bytes(state.range(1) << 20) {}
  void finish(benchmark::State& state, const char* impl) const {
    state.SetBytesProcessed(state.iterations() * devices * bytes);
    label(state, impl, devices, threads, bytes);
  }
  /// The shared operands: [devices, bytes / 4] (all_gather uses the first half of each row).
  Tensor2& x() const {
    static Tensor2 data;
    if (data.dimension(0) != devices || data.size() * 4 != devices * bytes)
      data = operands(devices, bytes);
    return data;
  }
  int devices, threads;
  std::int64_t bytes;
};

template <class Op>
void bandwidth_pmap(benchmark::State& state, const char* impl, bool gather, Op op) {
  Bandwidth b(state);
  Tensor2& x = b.x();
  pmap::Runtime rt({.num_devices = b.devices, .num_threads = b.threads});
  // all_gather receives `devices` times its input: give every device a contiguous
  // 1/devices of the bytes (the front of the shared buffer, viewed as [devices, cols / n]).
  const Eigen::Index cols = gather ? x.dimension(1) / b.devices : x.dimension(1);
  run_pmap(state, rt, Map2(x.data(), b.devices, cols), 1, op);
  b.finish(state, impl);
}

void bw_psum(benchmark::State& state) { bandwidth_pmap(state, "pmap_psum", false, psum); }

void bw_all_gather(benchmark::State& state) {
  bandwidth_pmap(state, "pmap_all_gather", true,
                 [](pmap::Context& ctx, const auto& row) { return ctx.all_gather(row, "i"); });
}

void bw_all_to_all(benchmark::State& state) {
  bandwidth_pmap(state, "pmap_all_to_all", false, [](pmap::Context& ctx, const auto& row) {
    return ctx.all_to_all(row, "i", 0, 0, pmap::tiled);
  });
}

void bw_ppermute(benchmark::State& state) {
  const int devices = static_cast<int>(state.range(0));
  std::vector<std::pair<int, int>> perm;
  for (int i = 0; i < devices; ++i) perm.emplace_back(i, (i + 1) % devices);
  bandwidth_pmap(state, "pmap_ppermute", false, [perm](pmap::Context& ctx, const auto& row) {
    return ctx.ppermute(row, "i", perm);
  });
}

void bw_memcpy(benchmark::State& state) {
  Bandwidth b(state);
  Tensor2& x = b.x();
  Tensor2 dst(x.dimensions());
  pmap::bench::parallel_fill(dst.data(), static_cast<std::size_t>(dst.size()), 0.f, b.threads);
  const auto row = static_cast<std::size_t>(x.dimension(1));
  std::vector<void*> to;
  std::vector<const void*> from;
  for (int t = 0; t < b.threads; ++t) {
    to.push_back(dst.data() + static_cast<std::size_t>(t) * row);
    from.push_back(x.data() + static_cast<std::size_t>(t) * row);
  }
  for (auto _ : state) {
    pmap::bench::omp_memcpy(b.threads, to.data(), from.data(), static_cast<std::size_t>(b.bytes));
    benchmark::ClobberMemory();
  }
  b.finish(state, "memcpy");
}

void bw_memcpy_alloc(benchmark::State& state) {
  Bandwidth b(state);
  Tensor2& x = b.x();
  const auto row = static_cast<std::size_t>(x.dimension(1));
  std::vector<const void*> from;
  for (int t = 0; t < b.threads; ++t) from.push_back(x.data() + static_cast<std::size_t>(t) * row);
  for (auto _ : state) {
    pmap::bench::omp_memcpy_alloc(b.threads, from.data(), static_cast<std::size_t>(b.bytes));
  }
  b.finish(state, "memcpy_alloc");
}

void register_all() {
  using Fn = void (*)(benchmark::State&);
  const std::pair<const char*, Fn> latency[] = {
      {"psum_latency/pmap_psum", latency_pmap_psum},
      {"psum_latency/spin_barrier", latency_spin_barrier},
      {"psum_latency/omp_barrier", latency_omp_barrier},
      {"psum_latency/spin_psum", latency_spin_psum},
  };
  for (const auto& [name, fn] : latency)
    benchmark::RegisterBenchmark(name, fn)
        ->ArgNames({"devices", "bytes"})
        ->Args({2, kLatencyBytes})
        ->UseRealTime()
        ->MinTime(0.3);

  // The device count is part of the impl name, not an argument, so that the candidates
  // and the 2-device reference share one row of the ratio table.
  for (const int devices : {2, 4, 8}) {
    const std::string impl = devices == 2 ? "ref_2dev" : "pmap_" + std::to_string(devices) + "dev";
    benchmark::RegisterBenchmark(("psum_oversubscribed/" + impl).c_str(),
                                 [devices, impl](benchmark::State& s) {
                                   oversubscribed(s, devices, impl.c_str());
                                 })
        ->ArgNames({"threads", "bytes"})
        ->Args({2, kLatencyBytes})
        ->UseRealTime()
        ->MinTime(0.3);
  }

  const std::pair<const char*, Fn> bandwidth[] = {
      {"bandwidth/pmap_psum", bw_psum},         {"bandwidth/pmap_all_gather", bw_all_gather},
      {"bandwidth/pmap_all_to_all", bw_all_to_all}, {"bandwidth/pmap_ppermute", bw_ppermute},
      {"bandwidth/memcpy", bw_memcpy},          {"bandwidth/memcpy_alloc", bw_memcpy_alloc},
  };
  for (const auto& [name, fn] : bandwidth)
    benchmark::RegisterBenchmark(name, fn)
        ->ArgNames({"devices", "MiB"})
        ->Args({2, kBandwidthBytes >> 20})
        ->UseRealTime()
        ->MinTime(0.5);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  return pmap::bench::run_benchmarks(argc, argv);
}
