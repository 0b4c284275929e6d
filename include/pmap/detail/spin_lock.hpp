/// @file spin_lock.hpp
/// @brief The lock of a Team's short critical sections (a device counting itself blocked,
/// suspending, resuming a peer, the first failure).
#pragma once

#include <atomic>
#include <thread>

#include "pmap/detail/cpu_relax.hpp"

namespace pmap::detail {

/// Test and test-and-set with a pause, then a yield, while it is held: what tbb::spin_mutex
/// does. Not tbb::spin_mutex itself, because every program that includes pmap would parse
/// its header, which brings in every x86 intrinsics header (<immintrin.h>: 0.6 s of a 1.5 s
/// Eigen Tensor parse); not std::mutex, which sleeps in the kernel when it is taken, and
/// the holder of this lock releases it within nanoseconds. Meets Lockable (std::lock_guard).
class SpinLock {
 public:
  void lock() {
    while (locked_.exchange(true, std::memory_order_acquire))
      for (int i = 0; locked_.load(std::memory_order_relaxed); ++i) {
        if (i < kPauses)
          cpu_relax();
        else
          std::this_thread::yield();
      }
  }
  bool try_lock() {
    return !locked_.load(std::memory_order_relaxed) &&
           !locked_.exchange(true, std::memory_order_acquire);
  }
  void unlock() { locked_.store(false, std::memory_order_release); }

 private:
  static constexpr int kPauses = 64;
  std::atomic<bool> locked_{false};
};

}  // namespace pmap::detail
