/// @file more_baselines.hpp
/// @brief The baselines pmap-bench needs beyond bench/baselines.hpp: a hand-written
/// 2-barrier psum, copies looped inside one parallel region, and a batch of tasks on an Eigen
/// ThreadPool. Same conventions as bench/baselines.hpp (which it builds on).
///
/// Thread safety: every function is safe to call from any thread that is not itself a worker
/// of the pool it uses.
#pragma once

#if !defined(EIGEN_USE_THREADS)
#error "bench/report/more_baselines.hpp needs EIGEN_USE_THREADS before the first Eigen include"
#endif

#include <cstddef>
#include <cstring>
#include <pthread.h>
#include <sched.h>
#include <vector>

#include <omp.h>
#include <unsupported/Eigen/CXX11/Tensor>

#include "../baselines.hpp"

namespace pmap::report {

/// @brief While alive, binds an OpenMP team of `threads` threads one per CPU, as
/// OMP_PROC_BIND=true would: the calling (master) thread to the first CPU it may use, team
/// thread k to the k-th. The destructor gives the master its CPU mask back.
///
/// Why: unbound, libgomp sometimes leaves its worker on the master's CPU of this 2-vCPU
/// machine, and every region of a sample then costs ~100 us instead of ~1 us (seen in about
/// half of the processes). OMP_PROC_BIND itself cannot be used: it binds the initial thread
/// for good, and the oneTBB and Eigen threads it creates later inherit that single CPU.
class OmpBinding {
 public:
  explicit OmpBinding(int threads) {
    pthread_getaffinity_np(pthread_self(), sizeof saved_, &saved_);
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &saved_)) cpus_.push_back(c);
    if (cpus_.size() < 2) return;
#pragma omp parallel num_threads(threads)
    {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpus_[static_cast<std::size_t>(omp_get_thread_num()) % cpus_.size()], &one);
      pthread_setaffinity_np(pthread_self(), sizeof one, &one);
    }
  }
  ~OmpBinding() { pthread_setaffinity_np(pthread_self(), sizeof saved_, &saved_); }
  OmpBinding(const OmpBinding&) = delete;
  OmpBinding& operator=(const OmpBinding&) = delete;

 private:
  cpu_set_t saved_{};
  std::vector<int> cpus_;
};

/// @brief `ops` rounds of copying `rows` buffers of `bytes` (src[r] to dst[r]), the rows
/// split statically over `threads` OpenMP threads, all inside one parallel region and with no
/// barrier between rounds: the copy bandwidth a collective can at best reach.
inline void omp_copy_rows(int threads, void* const* dst, const void* const* src, int rows,
                          std::size_t bytes, int ops) {
#pragma omp parallel num_threads(threads)
  for (int k = 0; k < ops; ++k) {
#pragma omp for schedule(static) nowait
    for (int r = 0; r < rows; ++r) std::memcpy(dst[r], src[r], bytes);
  }
  benchmark::ClobberMemory();
}

/// @brief Runs body(i) for i in [0, n) as n tasks on an Eigen ThreadPool and waits for them:
/// one independent job per batch entry, Eigen's own way.
template <class Body>
void eigen_for_each(Eigen::ThreadPool& pool, int n, const Body& body) {
  Eigen::Barrier done(static_cast<unsigned>(n));
  for (int i = 0; i < n; ++i)
    pool.Schedule([&body, &done, i] {
      body(i);
      done.Notify();
    });
  done.Wait();
}

}  // namespace pmap::report
