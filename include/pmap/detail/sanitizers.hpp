/// @file sanitizers.hpp
/// @brief What AddressSanitizer and ThreadSanitizer are told of the device fibers
/// (src/fibers.cpp): which stack runs after each switch, which fiber, and the handoffs
/// through oneTBB's uninstrumented library. Nothing in other builds.
#pragma once

#include <cstddef>

#if defined(__SANITIZE_ADDRESS__)
#define PMAP_ASAN 1
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(__SANITIZE_THREAD__)
#define PMAP_TSAN 1
#include <sanitizer/tsan_interface.h>
#endif

namespace pmap::detail::sanitizers {

/// A device fiber: its stack, ASan's fake stack while it is switched out, TSan's fiber.
struct FiberState {
  void* fake_stack = nullptr;
  const void* bottom = nullptr;
  std::size_t size = 0;
  void* tsan = nullptr;
};

/// The context a Scheduler's loop runs on (a thread's stack, or the fiber it is nested in).
/// Its stack is learnt when a fiber first arrives from it.
struct LoopState {
  void* fake_stack = nullptr;
  const void* bottom = nullptr;
  std::size_t size = 0;
  void* tsan = nullptr;
};

/// The calling context, as a loop.
inline LoopState current_context() {
  LoopState loop;
#if defined(PMAP_TSAN)
  loop.tsan = __tsan_get_current_fiber();
#endif
  return loop;
}

/// A fiber on the stack [bottom, bottom + size) is made (before Boost.Context's first,
/// short, switch to it: TSan then records that switch's frames on the new fiber).
inline void create(FiberState& f, const void* bottom, std::size_t size) {
  f.bottom = bottom;
  f.size = size;
#if defined(PMAP_TSAN)
  f.tsan = __tsan_create_fiber(0);
  __tsan_switch_to_fiber(f.tsan, 0);
#endif
}
/// After the fiber was made, back on the loop.
inline void created(const LoopState& loop) {
#if defined(PMAP_TSAN)
  __tsan_switch_to_fiber(loop.tsan, 0);
#else
  (void)loop;
#endif
}
/// The fiber returned for good and the loop runs again.
inline void destroy(FiberState& f) {
#if defined(PMAP_TSAN)
  __tsan_destroy_fiber(f.tsan);
  f.tsan = nullptr;
#else
  (void)f;
#endif
}

/// On the loop, just before it switches to fiber f.
inline void enter(LoopState& loop, FiberState& f) {
#if defined(PMAP_ASAN)
  __sanitizer_start_switch_fiber(&loop.fake_stack, f.bottom, f.size);
#endif
#if defined(PMAP_TSAN)
  __tsan_switch_to_fiber(f.tsan, 0);
#endif
  (void)loop, (void)f;
}
/// On the loop, just after a fiber switched back to it.
inline void back(LoopState& loop) {
#if defined(PMAP_ASAN)
  __sanitizer_finish_switch_fiber(loop.fake_stack, nullptr, nullptr);
#endif
  (void)loop;
}
/// On fiber f, just after the loop switched to it (first or again): learns the loop's stack.
inline void arrive(FiberState& f, LoopState& loop) {
#if defined(PMAP_ASAN)
  __sanitizer_finish_switch_fiber(f.fake_stack, &loop.bottom, &loop.size);
#endif
  (void)f, (void)loop;
}
/// On fiber f, just before it switches back to the loop; `for_good`: it has returned.
inline void leave(FiberState& f, const LoopState& loop, bool for_good) {
#if defined(PMAP_ASAN)
  __sanitizer_start_switch_fiber(for_good ? nullptr : &f.fake_stack, loop.bottom, loop.size);
#endif
#if defined(PMAP_TSAN)
  __tsan_switch_to_fiber(loop.tsan, 0);
#endif
  (void)f, (void)loop, (void)for_good;
}

/// A handoff through oneTBB (a task that a worker runs, a task_group::wait that returns):
/// the release before it and the acquire after it, which TSan cannot see in Debian's libtbb.
inline void release(const void* what) {
#if defined(PMAP_TSAN)
  __tsan_release(const_cast<void*>(what));
#else
  (void)what;
#endif
}
inline void acquire(const void* what) {
#if defined(PMAP_TSAN)
  __tsan_acquire(const_cast<void*>(what));
#else
  (void)what;
#endif
}

}  // namespace pmap::detail::sanitizers
