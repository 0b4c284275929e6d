/// @file workload.hpp
/// @brief What every pmap-bench workload gets (the options, the measuring settings, the
/// report it adds its rows to) and the helpers they share, for the workloads of
/// pmap_bench.cpp and of apps.cpp alike.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include <unsupported/Eigen/CXX11/Tensor>

#include "../baselines.hpp"
#include "harness.hpp"
#include "more_baselines.hpp"
#include "table.hpp"

namespace pmap::report {

using Tensor1 = Eigen::Tensor<float, 1, Eigen::RowMajor>;
using Tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using Tensor3 = Eigen::Tensor<float, 3, Eigen::RowMajor>;
using TensorD1 = Eigen::Tensor<double, 1, Eigen::RowMajor>;
using TensorD2 = Eigen::Tensor<double, 2, Eigen::RowMajor>;
using TensorD3 = Eigen::Tensor<double, 3, Eigen::RowMajor>;

/// @brief pmap-bench's command line.
struct Options {
  bool quick = false;
  std::string json;
  int devices = 0;        // 0: pmap::device_count()
  int threads = 0;        // 0: min(devices, hardware threads), per case
  std::string filter;     // regex over workload names and groups; "" = all
  std::int64_t size = 0;  // out-of-cache bytes per triad array; 0: 1 GiB (64 MiB with --quick)
  int rounds = 0;         // 0: 15 (3 with --quick)
};

/// @brief A workload's inputs: the options, the measuring settings, where its rows go.
struct Env {
  Options opt;
  Settings settings;
  int devices = 2;                           // D: pmap::device_count()
  std::int64_t big = std::int64_t{1} << 30;  // out-of-cache bytes per triad array
  Report* report = nullptr;

  /// Worker threads for `d` devices: --threads, else what pmap::Runtime picks.
  int threads_for(int d) const { return opt.threads > 0 ? opt.threads : bench::threads_for(d); }
  /// Per-dispatch loop lengths: shorter in quick mode.
  int ops(int full) const { return opt.quick ? std::max(1, full / 4) : full; }
};

/// @brief Runs `body` `reps` times.
template <class Body>
auto repeat(Body body) {
  return [body](std::int64_t reps) mutable {
    for (std::int64_t r = 0; r < reps; ++r) body();
  };
}

/// @brief Adds an OpenMP implementation to `c`, its team bound one thread per CPU around
/// each sample (OmpBinding says why).
inline void add_omp(Case& c, std::string name, int threads, std::function<void(std::int64_t)> run,
                    double ops = 1, double work = 0) {
  c.add_scoped(std::move(name), std::move(run), ops, work,
               [threads] { return OmpBinding(threads); });
}

inline std::string devices_threads(int d, int t) { return format("%d devices, %d threads", d, t); }

// The application workloads (apps.cpp; the group "apps" of --filter).
void batched_solve(Env& env);
void mlp_step(Env& env);
void heat_stencil(Env& env);
void monte_carlo(Env& env);
void sample_sort(Env& env);
void ring_matmul(Env& env);

}  // namespace pmap::report
