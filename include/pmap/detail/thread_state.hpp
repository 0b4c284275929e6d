/// @file thread_state.hpp
/// @brief All per-thread state of the library, in one struct (as oneTBB's thread_data):
/// which device the current fiber runs, for which call, and the thread's identity.
#pragma once

namespace pmap {
class Context;
}

namespace pmap::detail {

namespace fibers {
struct Fiber;
}

/// What the current thread is running. Kept fiber-correct: a device sets and restores it
/// around its kernel (DeviceScope), and the fibers around each switch.
struct ThreadState {
  /// Its address tells threads apart (Slot::runner).
  char tag = 0;
  /// The device the current fiber runs (nullptr outside of kernels): a pmap called from a
  /// kernel nests inside it.
  Context* device = nullptr;
  /// The device fiber (fibers.hpp) the thread runs, or nullptr: a device on it waits by
  /// switching back to its thread's loop.
  fibers::Fiber* fiber = nullptr;
};

/// The calling thread's state. Out of line and opaque to the optimizer on purpose: a compiler
/// may keep the address of an inline thread_local (the thread pointer register, tpidr_el0 on
/// aarch64) across a call that switches fibers, and a device that resumed on another thread
/// (as oneTBB's resumable tasks did; a nested call's inner devices may still) would then read
/// and write the state of the thread that started it. Every read after a possible switch
/// calls this again; none keeps the reference across one.
[[gnu::noinline, gnu::noipa]] ThreadState& this_thread();

/// Sets the current thread's device for a scope and restores the previous one after it.
class DeviceScope {
 public:
  explicit DeviceScope(Context* device) : previous_(this_thread().device) {
    this_thread().device = device;
  }
  ~DeviceScope() { this_thread().device = previous_; }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  Context* previous_;
};

}  // namespace pmap::detail
