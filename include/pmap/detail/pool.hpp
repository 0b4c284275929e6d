/// @file pool.hpp
/// @brief Where devices are scheduled: one oneTBB arena per Runtime, one task per device.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_group.h>
#include <oneapi/tbb/task_scheduler_observer.h>

#include "pmap/detail/fibers.hpp"
#include "pmap/detail/thread_state.hpp"

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

/// The devices of one call. Each worker runs a block of them, so a dispatch costs one task
/// per thread (like a static parallel_for); a device about to suspend in a collective calls
/// on_block(), which adds a worker that claims the devices nobody has started yet, so that
/// no device ever waits for a peer stuck behind it in a blocked worker's block.
class Run {
 public:
  virtual void on_block() = 0;

 protected:
  ~Run() = default;
};

/// Binds each worker thread that joins an arena to one CPU: slot k to the k-th CPU of the
/// process's affinity mask (modulo its size), slot 0 being the calling thread's, left alone.
class ThreadBinder final : public tbb::task_scheduler_observer {
 public:
  explicit ThreadBinder(tbb::task_arena& arena);
  ~ThreadBinder() override;
  ThreadBinder(const ThreadBinder&) = delete;
  ThreadBinder& operator=(const ThreadBinder&) = delete;
  void on_scheduler_entry(bool is_worker) override;

 private:
  std::vector<int> cpus_;  ///< the process's CPUs when the Runtime was made
};

/// The worker threads of a Runtime: one oneTBB task_arena, created once.
class Pool {
 public:
  /// `bind`: bind the workers to CPUs (ThreadBinder, RuntimeConfig::bind_threads).
  Pool(int threads, bool bind);
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
    (void)cancel;
    if (on_fibers(n)) {
      fibers::Work work{n, [](const void* b, int i) { (*static_cast<const Body*>(b))(i); }, &body};
      if constexpr (!std::is_same_v<Cancel, std::nullptr_t>) {
        work.cancel = [](const void* c, std::exception_ptr e) {
          (*static_cast<const Cancel*>(c))(e);
        };
        work.canceller = &cancel;
      }
      fibers::run(arena_, threads_, work);
      return;
    }
    Claims<Body> claims(n, body);
    arena_.execute([&] {
      tbb::task_group group;
      claims.group = &group;
      // Worker w starts on its own block of devices, like a static parallel_for.
      const int workers = std::min(n, threads_);
      for (int w = 1; w < workers; ++w)
        group.run([&claims, w, workers] { claims.loop(claims.n * w / workers, claims.n * (w + 1) / workers); });
      claims.loop(0, n / workers);
      group.wait();
    });
#endif
  }

 private:
  /// Devices run on pmap's fibers (fibers.hpp) when they outnumber the threads of a call
  /// made outside any device, and in every call made on such a fiber; oneTBB's resumable
  /// tasks otherwise (and where pmap's fibers are not available).
  bool on_fibers(int n) const {
    const ThreadState& t = this_thread();
    if (t.fiber) return true;
    return n > threads_ && !t.device && !t.run && fibers::available();
  }

  template <class Body>
  struct Claims final : Run {
    Claims(int count, const Body& b)
        : n(count), body(b), heap(count > kInline ? new std::atomic<bool>[count] : nullptr) {
      for (int i = 0; i < n; ++i) claimed(i).store(false, std::memory_order_relaxed);
    }
    std::atomic<bool>& claimed(int i) { return heap ? heap[i] : inline_flags[i]; }
    /// Runs every device of [begin, end) that nobody has claimed yet.
    void loop(int begin, int end) {
      Run* const previous = this_thread().run;
      for (int i = begin; i < end; ++i) {
        if (claimed(i).load(std::memory_order_relaxed) ||
            claimed(i).exchange(true, std::memory_order_relaxed))
          continue;
        this_thread().run = this;
        body(i);
      }
      this_thread().run = previous;
    }
    void on_block() override {
      if (!all_claimed.load(std::memory_order_relaxed))
        group->run([this] {
          loop(0, n);
          all_claimed.store(true, std::memory_order_relaxed);
        });
    }
    static constexpr int kInline = 64;
    const int n;
    const Body& body;
    tbb::task_group* group = nullptr;
    std::atomic<bool> all_claimed{false};
    std::atomic<bool> inline_flags[kInline];
    std::unique_ptr<std::atomic<bool>[]> heap;
  };

  int threads_;
  std::unique_ptr<tbb::global_control> parallelism_;
  tbb::task_arena arena_;
  std::unique_ptr<ThreadBinder> binder_;  ///< after arena_, which it observes
};

}  // namespace pmap::detail
