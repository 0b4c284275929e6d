/// @file fibers.hpp
/// @brief Device fibers: how a device waits for its peers without holding its thread
/// (src/fibers.cpp, on Boost.Context).
///
/// Each thread of a call runs a loop over the devices it started, each on a fiber of its
/// own; a device that waits switches back to that loop, and a peer that releases it puts it
/// in its thread's ready list. oneTBB still owns and places the threads: the loops are
/// oneTBB tasks in the runtime's arena. A device that never waits costs no switch of its
/// own: it leaves its fiber to the next device.
#pragma once

#include <exception>

namespace pmap::detail {
class Arena;
}

namespace pmap::detail::fibers {

struct Fiber;

/// What run() runs: body(i) for i in [0, n), through `run`; `cancel`, if set, tells the
/// caller that an index cannot have a fiber (no memory), before that index runs without one
/// (see run()).
struct Work {
  int n = 0;
  void (*run)(const void* body, int i) = nullptr;
  const void* body = nullptr;
  void (*cancel)(const void* canceller, std::exception_ptr error) = nullptr;
  const void* canceller = nullptr;
};

/// Runs work.run(body, i) for every i in [0, n) on fibers, and returns when all have
/// returned; rethrows the first exception one let out. Called outside any fiber, it runs
/// them on the arena's threads: the calling thread and `threads - 1` oneTBB tasks, each
/// first starting the indices of its own block (as a static parallel_for), then unstarted
/// ones of any block. A fiber stays on the thread that started it; a device that returns
/// without having waited hands its fiber to the next unstarted index of its thread. Called
/// on a fiber (a pmap nested in a device), it runs them on the calling thread, and while none
/// of them can run it suspends the calling fiber, so that its thread runs the others
/// meanwhile. Every index runs, even without memory for its fiber: then it runs on the
/// loop's own stack after work.cancel() (a cancelled device leaves at once, without waiting
/// for its peers; without `cancel`, the body must not wait either).
void run(Arena& arena, int threads, const Work& work);

/// Suspends the calling fiber until resume() of it; resume() may come first (from another
/// thread, before the caller got here): suspend() then returns at once, or nearly.
void suspend();
/// Makes a suspended fiber ready; its own thread continues it. Callable from any thread.
void resume(Fiber* fiber);

}  // namespace pmap::detail::fibers
