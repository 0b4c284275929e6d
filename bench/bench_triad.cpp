// Triad c = a + 0.5 * b over a RowMajor [devices, n] float tensor: pmap (one row per
// device, the kernel returns the expression, evaluated straight into the result) next to a
// raw tbb::parallel_for, OpenMP static and Eigen's ThreadPoolDevice on the same data.
//
// Two sizes: in cache (devices x 16 KiB per array) and out of cache (2^log2 floats per
// array, default 2^28 = 1 GiB per array, 3 GiB for the three; pick another with
// --triad_big_log2=N). Two forms: `triad_into` writes a preallocated result
// (`mapped.into(out, a, b)` vs baselines writing into an existing array); `triad_alloc`
// returns a fresh result every call (the baselines allocate an Eigen::Tensor each
// iteration too, page faults included). bytes_per_second counts the three arrays.

#define EIGEN_USE_THREADS  // before any Eigen include: Eigen::ThreadPoolDevice

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include <oneapi/tbb/task_arena.h>
#include <pmap/pmap.hpp>

#include "baselines.hpp"

namespace {

using Tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;

constexpr std::int64_t kInCacheRowFloats = 16 * 1024 / sizeof(float);
int big_log2 = 28;

/// The inputs and the preallocated output of one size, created once and shared by every
/// impl (so the 1 GiB arrays are initialised once).
struct Data {
  Data(int rows, std::int64_t cols, int threads) : a(rows, cols), b(rows, cols), c(rows, cols) {
    const auto size = static_cast<std::size_t>(a.size());
    pmap::bench::parallel_fill(a.data(), size, 1.f, threads);
    pmap::bench::parallel_fill(b.data(), size, 2.f, threads);
    pmap::bench::parallel_fill(c.data(), size, 0.f, threads);
  }
  Tensor2 a, b, c;
};

struct Setup {
  explicit Setup(benchmark::State& state)
      : devices(static_cast<int>(state.range(0))),
        threads(pmap::bench::threads_for(devices)),
        floats(state.range(1)),
        data(get(devices, floats, threads)) {}

  void finish(benchmark::State& state, const char* impl) const {
    state.SetBytesProcessed(state.iterations() * 3 * floats *
                            static_cast<std::int64_t>(sizeof(float)));
    state.SetLabel(std::string("impl=") + impl + " devices=" + std::to_string(devices) +
                   " threads=" + std::to_string(threads) +
                   " MiB=" + std::to_string(3 * floats * 4 / (1024 * 1024)));
  }
  std::size_t size() const { return static_cast<std::size_t>(floats); }

  int devices;
  int threads;
  std::int64_t floats;  // per array, all rows
  Data& data;

 private:
  static Data& get(int rows, std::int64_t floats, int threads) {
    static std::map<std::pair<int, std::int64_t>, std::unique_ptr<Data>> cache;
    auto& slot = cache[{rows, floats}];
    if (!slot) slot = std::make_unique<Data>(rows, floats / rows, threads);
    return *slot;
  }
};

auto triad_kernel() {
  return [](auto a, auto b) { return a + 0.5f * b; };
}

// ---- into a preallocated result ----------------------------------------------------------

void into_pmap(benchmark::State& state) {
  Setup s(state);
  pmap::Runtime rt({.num_devices = s.devices, .num_threads = s.threads});
  auto f = pmap::pmap(triad_kernel(), {.runtime = &rt});
  for (auto _ : state) {
    f.into(s.data.c, s.data.a, s.data.b);
    benchmark::DoNotOptimize(s.data.c.data());
    benchmark::ClobberMemory();
  }
  s.finish(state, "pmap");
}

void into_tbb(benchmark::State& state) {
  Setup s(state);
  tbb::task_arena arena(s.threads);
  arena.initialize();
  for (auto _ : state) {
    pmap::bench::tbb_triad(arena, s.data.c.data(), s.data.a.data(), s.data.b.data(), s.size());
    benchmark::DoNotOptimize(s.data.c.data());
    benchmark::ClobberMemory();
  }
  s.finish(state, "tbb");
}

void into_omp(benchmark::State& state) {
  Setup s(state);
  for (auto _ : state) {
    pmap::bench::omp_triad(s.data.c.data(), s.data.a.data(), s.data.b.data(), s.size(), s.threads);
    benchmark::DoNotOptimize(s.data.c.data());
    benchmark::ClobberMemory();
  }
  s.finish(state, "omp");
}

void into_eigen(benchmark::State& state) {
  Setup s(state);
  pmap::bench::EigenPool pool(s.threads);
  for (auto _ : state) {
    s.data.c.device(pool.device) = s.data.a + 0.5f * s.data.b;
    benchmark::DoNotOptimize(s.data.c.data());
    benchmark::ClobberMemory();
  }
  s.finish(state, "eigen");
}

// ---- allocating the result every call ------------------------------------------------------

void alloc_pmap(benchmark::State& state) {
  Setup s(state);
  pmap::Runtime rt({.num_devices = s.devices, .num_threads = s.threads});
  auto f = pmap::pmap(triad_kernel(), {.runtime = &rt});
  for (auto _ : state) {
    Tensor2 c = f(s.data.a, s.data.b);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  s.finish(state, "pmap");
}

void alloc_tbb(benchmark::State& state) {
  Setup s(state);
  tbb::task_arena arena(s.threads);
  arena.initialize();
  for (auto _ : state) {
    Tensor2 c(s.data.a.dimensions());
    pmap::bench::tbb_triad(arena, c.data(), s.data.a.data(), s.data.b.data(), s.size());
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  s.finish(state, "tbb");
}

void alloc_omp(benchmark::State& state) {
  Setup s(state);
  for (auto _ : state) {
    Tensor2 c(s.data.a.dimensions());
    pmap::bench::omp_triad(c.data(), s.data.a.data(), s.data.b.data(), s.size(), s.threads);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  s.finish(state, "omp");
}

void alloc_eigen(benchmark::State& state) {
  Setup s(state);
  pmap::bench::EigenPool pool(s.threads);
  for (auto _ : state) {
    Tensor2 c(s.data.a.dimensions());
    c.device(pool.device) = s.data.a + 0.5f * s.data.b;
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  s.finish(state, "eigen");
}

void register_all() {
  const int devices = std::max(2, pmap::bench::hardware_threads());
  const std::int64_t small = devices * kInCacheRowFloats;
  const std::int64_t big = std::int64_t{1} << big_log2;
  using Fn = void (*)(benchmark::State&);
  const std::pair<const char*, Fn> impls[] = {
      {"triad_into/pmap", into_pmap},   {"triad_into/tbb", into_tbb},
      {"triad_into/omp", into_omp},     {"triad_into/eigen", into_eigen},
      {"triad_alloc/pmap", alloc_pmap}, {"triad_alloc/tbb", alloc_tbb},
      {"triad_alloc/omp", alloc_omp},   {"triad_alloc/eigen", alloc_eigen},
  };
  // In cache first (every impl), then the big size with a few iterations each.
  for (const auto& [name, fn] : impls)
    benchmark::RegisterBenchmark(name, fn)
        ->ArgNames({"devices", "floats"})
        ->Args({devices, small})
        ->UseRealTime()
        ->MinTime(0.3);
  for (const auto& [name, fn] : impls)
    benchmark::RegisterBenchmark(name, fn)
        ->ArgNames({"devices", "floats"})
        ->Args({devices, big})
        ->UseRealTime()
        ->Iterations(3);
}

/// Consumes --triad_big_log2=N (floats per array of the big size) before Google Benchmark
/// sees the arguments.
bool parse_own_flags(int& argc, char** argv) {
  constexpr std::string_view flag = "--triad_big_log2=";
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    if (arg.substr(0, flag.size()) == flag) {
      big_log2 = std::atoi(argv[i] + flag.size());
      if (big_log2 < 10 || big_log2 > 34) {
        std::fprintf(stderr, "--triad_big_log2 must be in [10, 34], got %s\n", argv[i]);
        return false;
      }
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (!parse_own_flags(argc, argv)) return 1;
  register_all();
  return pmap::bench::run_benchmarks(argc, argv);
}
