#include "pmap/detail/pool.hpp"

#include "pmap/detail/sanitizers.hpp"
#include "arena.hpp"

#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <memory>
#include <thread>

namespace pmap::detail {

Pool::Pool(int threads, bool bind)
    : threads_(threads), arena_(std::make_unique<Arena>(threads, bind)) {}

Pool::~Pool() = default;

Arena::Arena(int threads, bool bind)
    : parallelism_(threads > static_cast<int>(tbb::global_control::active_value(
                                 tbb::global_control::max_allowed_parallelism))
                       ? std::make_unique<tbb::global_control>(
                             tbb::global_control::max_allowed_parallelism,
                             static_cast<std::size_t>(threads))
                       : nullptr),
      arena_(threads, 1) {
  arena_.initialize();
#if !PMAP_DEVICE_THREADS
  if (bind && threads > 1) binder_ = std::make_unique<ThreadBinder>(arena_);
#else
  (void)bind;  // devices run on threads of their own, which the OS places
#endif
}

ThreadBinder::ThreadBinder(tbb::task_arena& arena) : tbb::task_scheduler_observer(arena) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &mask)) cpus_.push_back(c);
  // Workers read cpus_ in on_scheduler_entry, handed over by oneTBB's uninstrumented library.
  sanitizers::release(this);
  if (cpus_.size() > 1) observe(true);  // one CPU: nothing to choose
}

// A thread inside the arena holds oneTBB's record of the last observer it notified, which it
// frees when it leaves (observer_proxy.cpp): destroyed while a worker still lingers in the
// arena, the binder would leave that record behind at process exit (LeakSanitizer sees it).
// The workers leave an arena without work within microseconds; the wait is bounded anyway.
ThreadBinder::~ThreadBinder() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (inside_.load(std::memory_order_acquire) > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  observe(false);
}

void ThreadBinder::on_scheduler_exit(bool) { inside_.fetch_sub(1, std::memory_order_release); }

void ThreadBinder::on_scheduler_entry(bool is_worker) {
  sanitizers::acquire(this);  // before any member is touched: handed over by oneTBB
  inside_.fetch_add(1, std::memory_order_relaxed);
  const int slot = tbb::this_task_arena::current_thread_index();
  if (!is_worker || slot <= 0) return;
  const int cpu = cpus_[static_cast<std::size_t>(slot) % cpus_.size()];
  thread_local int bound = -1;  // a worker re-enters the arena at every dispatch
  if (cpu == bound) return;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0) bound = cpu;
}

}  // namespace pmap::detail
