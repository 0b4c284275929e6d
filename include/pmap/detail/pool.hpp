/// @file pool.hpp
/// @brief Where devices are scheduled: one oneTBB arena per Runtime, one task per device.
#pragma once

#include <memory>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

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
