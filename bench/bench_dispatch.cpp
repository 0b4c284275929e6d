// Dispatch cost: pmap of an (almost) empty kernel over D devices, next to a raw
// tbb::parallel_for and an OpenMP parallel for over the same D iterations.
//
// Every impl runs with T = min(D, hardware threads) threads: pmap::Runtime{D, T}, a
// tbb::task_arena of concurrency T, `omp parallel for num_threads(T)`. The kernel gets
// row i of a RowMajor [D, 1] float tensor (a rank-1 view); the baselines touch the same
// element. `per_dispatch` is real time per call; the ratio table at the end is pmap's
// time over each baseline's.

#include <benchmark/benchmark.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>

#include <oneapi/tbb/task_arena.h>
#include <pmap/pmap.hpp>

#include "baselines.hpp"

namespace {

using Tensor1 = Eigen::Tensor<float, 1, Eigen::RowMajor>;
using Tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;

struct Setup {
  explicit Setup(const benchmark::State& state)
      : devices(static_cast<int>(state.range(0))),
        threads(pmap::bench::threads_for(devices)),
        x(devices, 1),
        out(devices) {
    x.setConstant(1.f);
    out.setZero();
  }
  int devices;
  int threads;
  Tensor2 x;
  Tensor1 out;
};

void finish(benchmark::State& state, const Setup& s, const char* impl) {
  state.counters["per_dispatch"] = pmap::bench::time_per_op(1);
  state.SetLabel(std::string("impl=") + impl + " devices=" + std::to_string(s.devices) +
                 " threads=" + std::to_string(s.threads));
}

// A kernel that returns nothing: the pure cost of running D devices.
void pmap_void(benchmark::State& state) {
  Setup s(state);
  pmap::Runtime rt({.num_devices = s.devices, .num_threads = s.threads});
  auto f = pmap::pmap([](auto row) { benchmark::DoNotOptimize(row.data()); }, {.runtime = &rt});
  for (auto _ : state) f(s.x);
  finish(state, s, "pmap_void");
}

// A kernel that returns a float: adds allocating and filling the [D] result.
void pmap_float(benchmark::State& state) {
  Setup s(state);
  pmap::Runtime rt({.num_devices = s.devices, .num_threads = s.threads});
  auto f = pmap::pmap([](auto row) { return row(0); }, {.runtime = &rt});
  for (auto _ : state) {
    Tensor1 r = f(s.x);
    benchmark::DoNotOptimize(r.data());
  }
  finish(state, s, "pmap_float");
}

// The same kernel writing into a preallocated [D] result.
void pmap_float_into(benchmark::State& state) {
  Setup s(state);
  pmap::Runtime rt({.num_devices = s.devices, .num_threads = s.threads});
  auto f = pmap::pmap([](auto row) { return row(0); }, {.runtime = &rt});
  for (auto _ : state) {
    f.into(s.out, s.x);
    benchmark::DoNotOptimize(s.out.data());
  }
  finish(state, s, "pmap_float_into");
}

// Four scalar psums per dispatch, untraced and while a pmap::trace records: the difference
// in time per dispatch over the events a dispatch records (counted in the written trace) is
// the cost of one event. A fixed iteration count keeps the trace's memory bounded.
void pmap_psums(benchmark::State& state, bool traced) {
  Setup s(state);
  pmap::Runtime rt({.num_devices = s.devices, .num_threads = s.threads});
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto row) {
        float v = row(0);
        for (int k = 0; k < 4; ++k) v = ctx.psum(v, "i");
        return v;
      },
      {.axis_name = "i", .runtime = &rt});
  const std::string path = "/tmp/pmap_bench_dispatch_trace.json";
  if (traced) pmap::trace::start(path);
  std::int64_t calls = 0;
  for (auto _ : state) {
    Tensor1 r = f(s.x);
    benchmark::DoNotOptimize(r.data());
    ++calls;
  }
  if (traced) {
    pmap::trace::stop();
    std::ifstream in(path);
    std::int64_t events = 0;
    for (std::string line; std::getline(in, line);)
      events += line.find("\"ph\":") != std::string::npos && line.find("\"ph\":\"M\"") == std::string::npos;
    state.counters["events_per_dispatch"] = static_cast<double>(events) / static_cast<double>(calls);
    std::remove(path.c_str());
  }
  finish(state, s, traced ? "pmap_psums_traced" : "pmap_psums");
}
void pmap_psums_untraced(benchmark::State& state) { pmap_psums(state, false); }
void pmap_psums_traced(benchmark::State& state) { pmap_psums(state, true); }

void tbb(benchmark::State& state) {
  Setup s(state);
  tbb::task_arena arena(s.threads);
  arena.initialize();
  const float* x = s.x.data();
  float* out = s.out.data();
  for (auto _ : state) {
    pmap::bench::tbb_for_each(arena, s.devices, [&](int i) { out[i] = x[i]; });
    benchmark::DoNotOptimize(out);
  }
  finish(state, s, "tbb");
}

void omp(benchmark::State& state) {
  Setup s(state);
  const float* x = s.x.data();
  float* out = s.out.data();
  for (auto _ : state) {
    pmap::bench::omp_for_each(s.devices, s.threads, [&](int i) { out[i] = x[i]; });
    benchmark::DoNotOptimize(out);
  }
  finish(state, s, "omp");
}

void register_all() {
  const std::pair<const char*, void (*)(benchmark::State&)> impls[] = {
      {"dispatch/pmap_void", pmap_void},
      {"dispatch/pmap_float", pmap_float},
      {"dispatch/pmap_float_into", pmap_float_into},
      {"dispatch/tbb", tbb},
      {"dispatch/omp", omp},
  };
  for (const auto& [name, fn] : impls)
    benchmark::RegisterBenchmark(name, fn)
        ->ArgName("devices")
        ->Arg(2)
        ->Arg(8)
        ->UseRealTime()
        ->MinTime(0.5);
  const std::pair<const char*, void (*)(benchmark::State&)> traced[] = {
      {"trace/pmap_psums", pmap_psums_untraced},
      {"trace/pmap_psums_traced", pmap_psums_traced},
  };
  for (const auto& [name, fn] : traced)
    benchmark::RegisterBenchmark(name, fn)->ArgName("devices")->Arg(1)->Arg(2)->Arg(8)->UseRealTime()->Iterations(20000);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  return pmap::bench::run_benchmarks(argc, argv);
}
