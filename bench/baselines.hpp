/// @file baselines.hpp
/// @brief The hand-written baselines pmap's benchmarks are measured against, and the
/// reporter that prints pmap's times as ratios to them.
///
/// Header-only and self-contained: it needs oneTBB, OpenMP (compile with -fopenmp, i.e.
/// link OpenMP::OpenMP_CXX), Google Benchmark and, for the Eigen `ThreadPoolDevice`
/// baseline, `EIGEN_USE_THREADS` defined before the first Eigen include of the translation
/// unit. It does not include pmap, so the report program `pmap-bench` and other projects can
/// reuse the baselines as they are.
///
/// Naming convention shared by every benchmark binary (what RatioReporter relies on):
/// a benchmark is registered as `<workload>/<impl>` with named arguments
/// (`dispatch/pmap_void/devices:8`). Within one workload and one set of arguments, every
/// impl whose name starts with `pmap` is a candidate and every other impl is a baseline;
/// the reporter prints candidate time / baseline time for every pair (> 1: pmap slower).
///
/// Thread safety: every function is safe to call from any thread; a SpinBarrier is shared
/// by exactly the number of threads it was built for.
#pragma once

#if !defined(_OPENMP)
#error "bench/baselines.hpp needs OpenMP: link the target with OpenMP::OpenMP_CXX"
#endif

#include <benchmark/benchmark.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

#if defined(EIGEN_USE_THREADS)
#include <unsupported/Eigen/CXX11/Tensor>
#endif

namespace pmap::bench {

// ---- machine -------------------------------------------------------------------------------

/// @brief Hardware threads of the machine (at least 1).
inline int hardware_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

/// @brief The thread count pmap's Runtime picks for `devices` devices: min(devices, hw).
inline int threads_for(int devices) { return std::min(devices, hardware_threads()); }

/// @brief Tells the core that this thread spins (PAUSE on x86), so its sibling runs faster.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// ---- dispatch ----------------------------------------------------------------------------

/// @brief Raw oneTBB dispatch: body(i) for i in [0, n) with the static partitioner, inside
/// `arena` (build it with the concurrency pmap's Runtime would use).
template <class Body>
void tbb_for_each(tbb::task_arena& arena, int n, const Body& body) {
  arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<int>(0, n),
        [&](const tbb::blocked_range<int>& r) {
          for (int i = r.begin(); i != r.end(); ++i) body(i);
        },
        tbb::static_partitioner{});
  });
}

/// @brief OpenMP dispatch: one parallel region of `threads` threads, static schedule.
template <class Body>
void omp_for_each(int n, int threads, const Body& body) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int i = 0; i < n; ++i) body(i);
}

// ---- barriers ------------------------------------------------------------------------------

/// @brief Centralised sense-reversing spin barrier on std::atomic: the lower bound of what
/// one phase of a collective costs when every participant owns a core.
///
/// Each thread keeps its own `local_sense` (initially false) and passes it to every call.
/// The waiters spin with PAUSE and yield after a long spin, so a preempted peer on a
/// shared machine does not turn a microsecond into a scheduler quantum.
///
/// Example:
/// @code
///   pmap::bench::SpinBarrier barrier(2);
///   #pragma omp parallel num_threads(2)
///   {
///     bool sense = false;
///     for (int k = 0; k < 100; ++k) barrier.arrive_and_wait(sense);
///   }
/// @endcode
class SpinBarrier {
 public:
  explicit SpinBarrier(int threads) : threads_(threads), remaining_(threads) {}
  SpinBarrier(const SpinBarrier&) = delete;
  SpinBarrier& operator=(const SpinBarrier&) = delete;

  /// @brief Waits until all `threads` threads have arrived.
  void arrive_and_wait(bool& local_sense) {
    local_sense = !local_sense;
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      remaining_.store(threads_, std::memory_order_relaxed);
      sense_.store(local_sense, std::memory_order_release);
      return;
    }
    for (unsigned spins = 0; sense_.load(std::memory_order_acquire) != local_sense; ++spins) {
      if (spins < (1u << 14))
        cpu_relax();
      else
        std::this_thread::yield();
    }
  }

 private:
  const int threads_;
  alignas(64) std::atomic<int> remaining_;
  alignas(64) std::atomic<bool> sense_{false};
};

/// @brief Per-thread sense of a SpinBarrier, on its own cache line, kept
/// across parallel regions.
struct alignas(64) Sense {
  bool value = false;
};

/// @brief `ops` rounds of a hand-written collective on `threads` OpenMP threads: in round k
/// every thread t calls step(t, k, sync) between two SpinBarrier phases (operands ready,
/// operands free), and `sync()` is one more phase between two steps of its work. The
/// collectives below are its steps: each reads the rows its peers just wrote, so the data
/// crosses cores as in pmap, with as many barriers as pmap's algorithm for that collective.
template <class Step>
void spin_rounds(SpinBarrier& barrier, std::vector<Sense>& sense, int threads, int ops,
                 const Step& step) {
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    bool& mine = sense[static_cast<std::size_t>(t)].value;
    auto sync = [&] { barrier.arrive_and_wait(mine); };
    for (int k = 0; k < ops; ++k) {
      sync();
      step(t, k, sync);
      sync();
    }
  }
}

/// @brief `ops` chained psums of `threads` rows of `len` floats, the way pmap's small psum
/// runs: every thread sums all rows of `buf[k % 2]` into its row of `buf[(k + 1) % 2]`
/// (2 phases, in-place reads).
inline void spin_psum(SpinBarrier& barrier, std::vector<Sense>& sense, int threads,
                      float* const buf[2], std::size_t len, int ops) {
  spin_rounds(barrier, sense, threads, ops, [&](int t, int k, auto&&) {
    const float* in = buf[k % 2];
    float* o = buf[(k + 1) % 2] + static_cast<std::size_t>(t) * len;
    std::memcpy(o, in, len * sizeof(float));
    for (int p = 1; p < threads; ++p) {
      const float* x = in + static_cast<std::size_t>(p) * len;
#pragma omp simd
      for (std::size_t j = 0; j < len; ++j) o[j] += x[j];
    }
    benchmark::DoNotOptimize(o);
  });
}

/// @brief `ops` chained psums over `threads` rows of `len` floats in `rows`, each over its own
/// row, the way pmap's large psum of a donated operand runs (3 phases): thread t adds chunk t
/// of every peer's row into chunk t of its own, sync, then copies the other chunks from the
/// peers that reduced them.
inline void spin_split_psum(SpinBarrier& barrier, std::vector<Sense>& sense, int threads,
                            float* rows, std::size_t len, int ops) {
  auto chunk = [&](int p) {
    return len * static_cast<std::size_t>(p) / static_cast<std::size_t>(threads);
  };
  auto row = [&](int p) { return rows + static_cast<std::size_t>(p) * len; };
  spin_rounds(barrier, sense, threads, ops, [&](int t, int, auto&& sync) {
    float* o = row(t) + chunk(t);
    const std::size_t m = chunk(t + 1) - chunk(t);
    for (int p = 0; p < threads; ++p) {
      if (p == t) continue;
      const float* x = row(p) + chunk(t);
#pragma omp simd
      for (std::size_t j = 0; j < m; ++j) o[j] += x[j];
    }
    sync();
    for (int p = 0; p < threads; ++p)
      if (p != t)
        std::memcpy(row(t) + chunk(p), row(p) + chunk(p),
                    (chunk(p + 1) - chunk(p)) * sizeof(float));
    benchmark::DoNotOptimize(o);
  });
}

/// @brief `ops` chained shifts of `threads` rows of `len` floats (row t of `buf[(k + 1) % 2]`
/// is row t - 1 of `buf[k % 2]`), as pmap's ppermute over a ring runs (2 phases).
inline void spin_ppermute(SpinBarrier& barrier, std::vector<Sense>& sense, int threads,
                          float* const buf[2], std::size_t len, int ops) {
  spin_rounds(barrier, sense, threads, ops, [&](int t, int k, auto&&) {
    const int from = (t + threads - 1) % threads;
    float* o = buf[(k + 1) % 2] + static_cast<std::size_t>(t) * len;
    std::memcpy(o, buf[k % 2] + static_cast<std::size_t>(from) * len, len * sizeof(float));
    benchmark::DoNotOptimize(o);
  });
}

/// @brief `ops` chained tiled all_to_alls of `threads` rows of `len` floats (`len` a multiple
/// of `threads`): thread t copies block t of every row of `buf[k % 2]` into block p of its
/// row of `buf[(k + 1) % 2]`, as pmap's all_to_all runs (2 phases).
inline void spin_all_to_all(SpinBarrier& barrier, std::vector<Sense>& sense, int threads,
                            float* const buf[2], std::size_t len, int ops) {
  const std::size_t block = len / static_cast<std::size_t>(threads);
  spin_rounds(barrier, sense, threads, ops, [&](int t, int k, auto&&) {
    float* o = buf[(k + 1) % 2] + static_cast<std::size_t>(t) * len;
    for (int p = 0; p < threads; ++p)
      std::memcpy(
          o + static_cast<std::size_t>(p) * block,
          buf[k % 2] + static_cast<std::size_t>(p) * len + static_cast<std::size_t>(t) * block,
          block * sizeof(float));
    benchmark::DoNotOptimize(o);
  });
}

// ---- triad: c = a + 0.5 * b -----------------------------------------------------------------

/// @brief Serial triad over [begin, end), vectorised by `omp simd`.
inline void triad_range(float* __restrict c, const float* __restrict a,
                        const float* __restrict b, std::size_t begin, std::size_t end) {
#pragma omp simd
  for (std::size_t i = begin; i < end; ++i) c[i] = a[i] + 0.5f * b[i];
}

/// @brief Raw oneTBB triad over `size` floats, static partitioner, inside `arena`.
inline void tbb_triad(tbb::task_arena& arena, float* c, const float* a, const float* b,
                      std::size_t size) {
  arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, size),
        [&](const tbb::blocked_range<std::size_t>& r) { triad_range(c, a, b, r.begin(), r.end()); },
        tbb::static_partitioner{});
  });
}

/// @brief OpenMP triad over `size` floats: one contiguous chunk per thread.
inline void omp_triad(float* c, const float* a, const float* b, std::size_t size, int threads) {
#pragma omp parallel num_threads(threads)
  {
    const auto t = static_cast<std::size_t>(omp_get_thread_num());
    const auto nt = static_cast<std::size_t>(omp_get_num_threads());
    triad_range(c, a, b, size * t / nt, size * (t + 1) / nt);
  }
}

/// @brief Fills `size` floats with `value` on `threads` oneTBB threads (first touch in
/// parallel). Not OpenMP: libgomp workers spin for milliseconds after a region, which
/// would steal a core from the pmap benchmark that follows its setup.
inline void parallel_fill(float* data, std::size_t size, float value, int threads) {
  tbb::task_arena arena(threads);
  arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, size),
        [&](const tbb::blocked_range<std::size_t>& r) {
          std::fill(data + r.begin(), data + r.end(), value);
        },
        tbb::static_partitioner{});
  });
}

#if defined(EIGEN_USE_THREADS)
/// @brief An Eigen ThreadPool and the ThreadPoolDevice over it: `t.device(pool.device) = e`.
/// Build one per benchmark run, so its workers do not outlive (and disturb) the others.
struct EigenPool {
  explicit EigenPool(int threads) : pool(threads), device(&pool, threads) {}
  Eigen::ThreadPool pool;
  Eigen::ThreadPoolDevice device;
};
#endif

// ---- copies --------------------------------------------------------------------------------

/// @brief `threads` OpenMP threads each copy `bytes` from src[t] to dst[t]: what moving the
/// bytes every device receives costs at best, with preallocated destinations.
inline void omp_memcpy(int threads, void* const* dst, const void* const* src, std::size_t bytes) {
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    std::memcpy(dst[t], src[t], bytes);
  }
}

/// @brief Like omp_memcpy, but each thread allocates its destination, copies and frees it:
/// the cost of a copy that returns fresh memory (page faults included), as an owning
/// collective result does.
inline void omp_memcpy_alloc(int threads, const void* const* src, std::size_t bytes) {
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    std::unique_ptr<unsigned char[]> dst(new unsigned char[bytes]);
    std::memcpy(dst.get(), src[t], bytes);
    benchmark::DoNotOptimize(dst.get());
    benchmark::ClobberMemory();
  }
}

// ---- reporting -----------------------------------------------------------------------------

/// @brief A counter of seconds per operation (printed as "1.23us"), given `ops` operations
/// per benchmark iteration; uses the benchmark's timer (real time under UseRealTime()).
inline benchmark::Counter time_per_op(double ops) {
  return benchmark::Counter(ops, benchmark::Counter::kIsIterationInvariantRate |
                                     benchmark::Counter::kInvert);
}

/// @brief Console reporter that, after the usual table, prints every pmap candidate's time
/// as a ratio to every baseline of the same workload and arguments (see the file comment).
/// Uses the median over repetitions when --benchmark_repetitions is given.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  RatioReporter() : benchmark::ConsoleReporter(isatty(STDOUT_FILENO) ? OO_ColorTabular : OO_Tabular) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    benchmark::ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred || run.iterations <= 0) continue;
      const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      if (run.run_type == Run::RT_Aggregate && !median) continue;
      const std::string& function = run.run_name.function_name;
      const std::size_t slash = function.rfind('/');
      if (slash == std::string::npos) continue;
      const std::string key = function.substr(0, slash) + " [" + run.run_name.args + "]";
      const std::string impl = function.substr(slash + 1);
      auto [it, fresh] = groups_.try_emplace(key);
      if (fresh) order_.push_back(key);
      Time& t = it->second[impl];
      if (t.impl_order < 0) t.impl_order = static_cast<int>(it->second.size());
      const double seconds = run.real_accumulated_time / static_cast<double>(run.iterations);
      if (median) {
        t.median = seconds;
      } else {
        t.sum += seconds;
        ++t.count;
      }
    }
  }

  void Finalize() override {
    benchmark::ConsoleReporter::Finalize();
    std::ostream& out = GetOutputStream();
    bool header = false;
    for (const std::string& key : order_) {
      std::vector<std::pair<int, std::string>> impls;
      for (const auto& [impl, t] : groups_[key]) impls.emplace_back(t.impl_order, impl);
      std::sort(impls.begin(), impls.end());
      std::vector<std::string> candidates, baselines;
      for (const auto& [order, impl] : impls)
        (std::string_view(impl).substr(0, 4) == "pmap" ? candidates : baselines).push_back(impl);
      if (candidates.empty() || baselines.empty()) continue;
      if (!header) {
        out << "\nRatios: pmap time / baseline time (real time; > 1 means pmap is slower)\n";
        header = true;
      }
      for (const std::string& c : candidates) {
        out << "  " << key << " " << c << ":";
        const double tc = groups_[key][c].seconds();
        for (const std::string& b : baselines) {
          char buf[64];
          std::snprintf(buf, sizeof buf, " %.3gx %s", tc / groups_[key][b].seconds(), b.c_str());
          out << buf;
        }
        out << "\n";
      }
    }
    out.flush();
  }

 private:
  struct Time {
    double sum = 0;
    int count = 0;
    double median = -1;
    int impl_order = -1;
    double seconds() const { return median >= 0 ? median : sum / count; }
  };
  std::vector<std::string> order_;
  std::map<std::string, std::map<std::string, Time>> groups_;
};

/// @brief The main() of a benchmark binary: runs the registered benchmarks with the
/// RatioReporter on the console (plain Google Benchmark reporting for another
/// --benchmark_format, so JSON and CSV stay machine-readable).
inline int run_benchmarks(int argc, char** argv) {
  bool console = true;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    if (arg.substr(0, 19) == "--benchmark_format=" && arg.substr(19) != "console") console = false;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (console) {
    RatioReporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
  } else {
    benchmark::RunSpecifiedBenchmarks();
  }
  benchmark::Shutdown();
  return 0;
}

}  // namespace pmap::bench
