/// @file pool.hpp
/// @brief Where devices are scheduled: one oneTBB arena per Runtime, one task per device.
#pragma once

#include <memory>
#include <thread>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

/// PMAP_DEVICE_THREADS: every device on its own std::thread, waits block the thread.
/// For ThreadSanitizer, which cannot follow oneTBB's fibers; never faster.
#if !defined(PMAP_DEVICE_THREADS)
#if defined(__SANITIZE_THREAD__)
#define PMAP_DEVICE_THREADS 1
#else
#define PMAP_DEVICE_THREADS 0
#endif
#endif

namespace pmap::detail {

/// The worker threads of a Runtime. Every device is its own task (simple partitioner,
/// grain 1), so a device that suspends in a collective never holds a sibling hostage.
class Pool {
 public:
  explicit Pool(int threads);
  int threads() const { return threads_; }

  /// Runs body(i) for i in [0, n), each as a separate task, and waits for all of them.
  /// The calling thread takes part. Safe to call from inside a device (nesting).
  template <class Body>
  void run(int n, const Body& body) {
#if PMAP_DEVICE_THREADS
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) threads.emplace_back([&body, i] { body(i); });
    for (auto& t : threads) t.join();
    return;
#endif
    arena_.execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<int>(0, n, 1),
          [&](const tbb::blocked_range<int>& r) {
            for (int i = r.begin(); i != r.end(); ++i) body(i);
          },
          tbb::simple_partitioner{});
    });
  }

 private:
  int threads_;
  std::unique_ptr<tbb::global_control> parallelism_;
  tbb::task_arena arena_;
};

}  // namespace pmap::detail
