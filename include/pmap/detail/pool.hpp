/// @file pool.hpp
/// @brief Where devices are scheduled: one oneTBB arena per Runtime, one task per thread of a
/// call, the devices on fibers (fibers.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "pmap/detail/fibers.hpp"
#include "pmap/detail/thread_state.hpp"

/// PMAP_DEVICE_THREADS=1: every device on its own std::thread, waits block the thread (an
/// option for comparison and debugging; never faster). Devices run on fibers otherwise, also
/// under the sanitizers, which follow every switch (sanitizers.hpp).
#if !defined(PMAP_DEVICE_THREADS)
#define PMAP_DEVICE_THREADS 0
#endif

namespace pmap::detail {

class Arena;  // src/arena.hpp: oneTBB's arena, whose headers programs that use pmap never parse

/// The worker threads of a Runtime: one oneTBB task_arena, created once.
class Pool {
 public:
  /// `bind`: bind the workers to CPUs (ThreadBinder, RuntimeConfig::bind_threads).
  Pool(int threads, bool bind);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  int threads() const { return threads_; }

  /// Runs body(i) for i in [0, n) and waits for all of them. The calling thread takes
  /// part. Safe to call from inside a device (nesting). With device threads, a thread that
  /// cannot start (no memory, no threads left) is reported to cancel(exception) first, so
  /// that the devices already running stop waiting for the ones that never will; those
  /// then run on the calling thread (and leave at once, being cancelled).
  template <class Body, class Cancel = std::nullptr_t>
  void run(int n, const Body& body, const Cancel& cancel = nullptr) {
    if (n <= 0) return;
#if PMAP_DEVICE_THREADS
    std::vector<std::thread> threads;
    int started = 0;
    try {
      threads.reserve(static_cast<std::size_t>(n));
      for (; started < n; ++started) threads.emplace_back([&body, i = started] { body(i); });
    } catch (...) {
      if constexpr (!std::is_same_v<Cancel, std::nullptr_t>) cancel(std::current_exception());
      for (int i = started; i < n; ++i) body(i);
    }
    for (auto& t : threads) t.join();
#else
    fibers::Work work{n, [](const void* b, int i) { (*static_cast<const Body*>(b))(i); }, &body};
    if constexpr (!std::is_same_v<Cancel, std::nullptr_t>) {
      work.cancel = [](const void* c, std::exception_ptr e) {
        (*static_cast<const Cancel*>(c))(e);
      };
      work.canceller = &cancel;
    }
    fibers::run(*arena_, threads_, work);
#endif
  }

 private:
  int threads_;
  std::unique_ptr<Arena> arena_;
};

}  // namespace pmap::detail
