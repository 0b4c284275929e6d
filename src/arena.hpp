// The oneTBB side of a Pool (pmap/detail/pool.hpp): its arena, the global limit that lets the
// arena have more threads than oneTBB's default, and the binding of its workers to CPUs.
// Private to the library: the public headers name only `Arena`.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_scheduler_observer.h>

namespace pmap::detail {

/// Binds each worker thread that joins an arena to one CPU: slot k to the k-th CPU of the
/// process's affinity mask (modulo its size), slot 0 being the calling thread's, left alone.
class ThreadBinder final : public tbb::task_scheduler_observer {
 public:
  explicit ThreadBinder(tbb::task_arena& arena);
  ~ThreadBinder() override;
  ThreadBinder(const ThreadBinder&) = delete;
  ThreadBinder& operator=(const ThreadBinder&) = delete;
  void on_scheduler_entry(bool is_worker) override;
  void on_scheduler_exit(bool is_worker) override;

 private:
  std::vector<int> cpus_;       ///< the process's CPUs when the Runtime was made
  std::atomic<int> inside_{0};  ///< threads between their entry and exit notifications
};

/// One Runtime's oneTBB arena of `threads` threads (one of them the caller's).
class Arena {
 public:
  Arena(int threads, bool bind);
  tbb::task_arena& tbb() { return arena_; }
  /// How long, in nanoseconds, a thread of a call idles before it starts a device of a
  /// thread that has not come: learnt from this arena's calls (fibers.cpp: StealDelay).
  std::atomic<std::int64_t> steal_after_ns{0};

 private:
  std::unique_ptr<tbb::global_control> parallelism_;
  tbb::task_arena arena_;
  std::unique_ptr<ThreadBinder> binder_;  ///< after arena_, which it observes
};

}  // namespace pmap::detail
