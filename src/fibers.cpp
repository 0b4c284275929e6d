// Device fibers (fibers.hpp) on Boost.Context.
//
// A fiber is a stack of its own (mmap'd, a guard page below, kept for the next call:
// fiber_stacks.cpp) switched by boost::context::fiber, which keeps what the ABI says a called
// function keeps (on x86-64 also MXCSR's control bits and the x87 control word) and makes no
// system call. Each thread of a call runs a Scheduler: a loop that continues its ready
// fibers, else starts a device nobody has started, else parks (spins a while, then sleeps on
// a futex; nested in a fiber, it suspends that fiber instead). A device that returns without
// having waited hands its fiber to the next device nobody started, so a call whose devices
// never wait costs a fiber per thread, not per device. Fibers never move between threads: a
// fiber is continued only by the loop that started it, so a peer may make it ready before it
// finished suspending (the loop runs below it on the same thread and cannot take it before
// it switched), and its thread-local state (C++ exception state, errno, oneTBB's thread
// data) stays its thread's.
//
// The sanitizers follow every switch: AddressSanitizer is told which stack the code runs on
// (__sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber), ThreadSanitizer knows
// each fiber as one (__tsan_create_fiber / __tsan_switch_to_fiber), and the handoffs through
// oneTBB's task_group, whose library is not instrumented, are annotated as the release and
// acquire they are.
#include "pmap/detail/fibers.hpp"

#include <algorithm>
#include <atomic>
#include <boost/context/fiber.hpp>
#include <boost/context/preallocated.hpp>
#include <boost/context/stack_context.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cxxabi.h>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <utility>
#include <vector>

#include <oneapi/tbb/spin_mutex.h>
#include <oneapi/tbb/task_group.h>

#include "pmap/detail/cpu_relax.hpp"
#include "pmap/detail/sanitizers.hpp"
#include "pmap/detail/thread_state.hpp"
#include "arena.hpp"
#include "fiber_claims.hpp"
#include "fiber_stacks.hpp"

namespace pmap::detail::fibers {

namespace context = boost::context;

class Scheduler;

/// A thread's C++ exception state (libstdc++'s and libc++abi's __cxa_eh_globals: the
/// exceptions being handled, innermost first, and the count of those in flight), kept per
/// fiber: a device that waits in a collective inside a catch block must find its own
/// exception on top when it goes on, not that of a device that ran meanwhile.
struct ExceptionState {
  void* caught = nullptr;
  unsigned int uncaught = 0;
};

/// The floating-point control state that Boost.Context does not keep across a switch:
/// aarch64's FPCR (rounding mode, flush to zero, trap enables). On x86-64 fcontext keeps
/// MXCSR's control bits and the x87 control word itself.
struct FloatControl {
#if defined(__aarch64__)
  unsigned int fpcr = __builtin_aarch64_get_fpcr();
  void restore() const { __builtin_aarch64_set_fpcr(fpcr); }
#else
  void restore() const {}
#endif
};

struct Fiber {
  context::fiber suspended;    ///< the device where it switched out (empty while it runs)
  ExceptionState exceptions;   ///< while switched out
  FloatControl float_control;  ///< while switched out
  Scheduler* owner = nullptr;
  Fiber* next = nullptr;  ///< in the owner's ready list
  int index = 0;          ///< the device it runs
  bool done = false;
  void* mapping = nullptr;  ///< the stack's mapping, guard page first; the Fiber at its top
  sanitizers::FiberState sanitizer;
};

namespace {

/// The calling thread's exception state, laid out as ExceptionState.
ExceptionState* thread_exceptions() {
  return reinterpret_cast<ExceptionState*>(abi::__cxa_get_globals());
}

/// The stack allocator Boost.Context is given with a preallocated stack: the Scheduler gives
/// the mapping back to the cache itself, after the fiber's last switch.
struct KeptStack {
  void deallocate(context::stack_context&) noexcept {}
};

/// After a switch back to a context: the thread state it had before it switched away (the
/// fibers that ran meanwhile on this thread set their own).
void restore(const ThreadState& saved) {
  ThreadState& t = this_thread();
  t.device = saved.device;
  t.fiber = saved.fiber;
}

/// Runs index i on the calling stack, without a fiber (there is no memory for one), after
/// work.cancel, so that it does not wait for peers; its exception propagates.
void run_cancelled(const Work& work, int i, std::exception_ptr why) {
  if (work.cancel) work.cancel(work.canceller, std::move(why));
  const ThreadState saved = this_thread();
  struct Restore {
    const ThreadState& saved;
    ~Restore() { restore(saved); }
  } restore_on_exit{saved};
  work.run(work.body, i);
}

/// Runs every index on the calling stack, cancelled (there is no memory to share them out);
/// rethrows the first exception.
void run_each_cancelled(const Work& work, const std::exception_ptr& why) {
  std::exception_ptr first;
  for (int i = 0; i < work.n; ++i) {
    try {
      run_cancelled(work, i, why);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

using Clock = std::chrono::steady_clock;

// Idle at least this long before starting a device of a thread that has not come: longer
// than a oneTBB worker takes to wake up and take its task (30-50 us on the 2-vCPU VM). Right
// after an OpenMP region whose worker still spins on the other vCPU, the worker came
// 120-150 us after the call started: a device taken from it at 100 us left the whole call on
// one thread (a 4096-point heat stencil, 2 devices on 2 threads, 1.8 us per step against
// 0.85). So the delay is learnt per arena: doubled when a thread comes to find a device of
// its block taken that way, an eighth shorter at every such start, between the two bounds.
constexpr auto kStealAfter = std::chrono::microseconds(100);
constexpr auto kStealAfterAtMost = std::chrono::microseconds(1600);

/// An arena's learnt delay (Arena::steal_after_ns); relaxed: a stale value only waits a
/// little more or less.
class StealDelay {
 public:
  explicit StealDelay(std::atomic<std::int64_t>& ns) : ns_(ns) {}
  Clock::duration get() const {
    const std::int64_t ns = ns_.load(std::memory_order_relaxed);
    return ns > 0 ? std::chrono::nanoseconds(ns) : Clock::duration(kStealAfter);
  }
  /// A thread came to find a device of its block taken after the delay: it was coming.
  void too_short() const { set(std::min<Clock::duration>(2 * get(), kStealAfterAtMost)); }
  /// A device of a thread that had not come was started elsewhere.
  void took() const {
    const Clock::duration d = get();
    set(std::max<Clock::duration>(d - d / 8, kStealAfter));
  }

 private:
  void set(Clock::duration d) const {
    ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(), std::memory_order_relaxed);
  }
  std::atomic<std::int64_t>& ns_;
};

/// What the threads of one run() share: the work, who started what (Claims), the first
/// failure.
struct Shared : Claims {
  Shared(const Work& w, int threads, std::atomic<std::int64_t>& steal_after_ns)
      : Claims(w.n, threads), work(w), steal_delay(steal_after_ns), steal_after(steal_delay.get()) {}
  /// A device of a block whose thread has not come, claimed by the thread of block `mine`.
  int steal_from_late_block(int mine) {
    const int i = unclaimed_elsewhere(mine, true);
    if (i >= 0) {
      steal_delay.took();
      stole_from_late.store(true, std::memory_order_relaxed);
    }
    return i;
  }
  /// The thread of block `b` comes: was one of its devices taken because it was late?
  void arrives(int b) {
    if (stole_from_late.load(std::memory_order_relaxed) && &this_thread() != caller &&
        started[block_begin(b)].load(std::memory_order_relaxed))
      steal_delay.too_short();
  }
  void fail(std::exception_ptr e) {
    tbb::spin_mutex::scoped_lock guard(lock);
    if (!error) error = std::move(e);
  }
  /// Index i runs without a fiber (there is no memory for one).
  void run_here(int i, std::exception_ptr why) {
    try {
      run_cancelled(work, i, std::move(why));
    } catch (...) {
      fail(std::current_exception());
    }
  }

  const Work& work;
  const StealDelay steal_delay;
  const Clock::duration steal_after;  ///< this call's
  std::atomic<bool> stole_from_late{false};
  const ThreadState* caller = nullptr;  ///< the thread that runs block 0 (run_blocks)
  tbb::spin_mutex lock;
  std::exception_ptr error;
};

/// What the handoffs through oneTBB release and acquire for ThreadSanitizer (run()).
char handoff = 0;

// Parking: spin this long for a peer on another thread before sleeping (a futex wake costs
// more than a collective's wait at 8 KiB).
constexpr auto kParkSpin = std::chrono::microseconds(20);

}  // namespace

/// One thread's loop in one run(): its own devices' fibers and their ready list.
class Scheduler {
 public:
  /// Runs block `block` of `shared` (all of it when nested in fiber `host`).
  Scheduler(Shared& shared, int block, Fiber* host)
      : shared_(shared),
        block_(block),
        next_(shared.block_begin(block)),
        end_(host ? shared.n : shared.block_begin(block + 1)),
        host_(host),
        loop_(sanitizers::current_context()) {
    shared.arrived[block].store(true, std::memory_order_release);
  }
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  void loop() {
    for (;;) {
      Fiber* f = pop();
      if (!f) f = start_next();
      if (f) {
        enter(f);
        continue;
      }
      if (live_ == 0) return;  // all it started returned, and nothing is left to start
      park();
    }
  }

  /// Appends `f` to the ready list and wakes the loop if it parked. All under the lock: the
  /// loop takes it before it can return, so that this Scheduler outlives the call.
  void push(Fiber* f) {
    tbb::spin_mutex::scoped_lock guard(lock_);
    f->next = nullptr;
    if (tail_)
      tail_->next = f;
    else
      head_.store(f, std::memory_order_relaxed);
    tail_ = f;
    if (!parked_) return;
    parked_ = false;
    if (host_) {
      resume(host_);
      return;
    }
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst)) epoch_.notify_one();
  }

  /// On fiber `f` of this loop: switches back to the loop until the loop continues `f`.
  void switch_out(Fiber* f) {
    sanitizers::leave(f->sanitizer, loop_, /*for_good=*/false);
    to_loop_ = std::move(to_loop_).resume();
    sanitizers::arrive(f->sanitizer, loop_);
  }

 private:
  Fiber* pop() {
    if (nothing_ready()) return nullptr;
    tbb::spin_mutex::scoped_lock guard(lock_);
    Fiber* f = head_.load(std::memory_order_relaxed);
    if (f) {
      head_.store(f->next, std::memory_order_relaxed);
      if (!f->next) tail_ = nullptr;
    }
    return f;
  }
  /// Without the lock (a locked instruction per device returned is a tenth of an empty
  /// call): a push it misses is seen by the loop's next pop() or park(), which take it.
  bool nothing_ready() const { return head_.load(std::memory_order_relaxed) == nullptr; }

  /// The next device nobody started: of this loop's block; else, when every device this
  /// loop started has returned (`running`: but the one on the calling fiber, which just
  /// did), of any other block, as a thread of a parallel_for takes a peer's iterations once
  /// its own are done; else, after idling for the call's steal_after, of a block whose
  /// thread has not come. -1 if none.
  int claim_next(bool running) {
    for (; next_ < end_; ++next_)
      if (shared_.claim(next_)) return next_++;
    if (host_ == nullptr && live_ == (running ? 1 : 0)) return shared_.claim_any_elsewhere(block_, elsewhere_);
    if (idle_since_ != Clock::time_point{} && Clock::now() - idle_since_ > shared_.steal_after)
      return shared_.steal_from_late_block(block_);
    return -1;
  }

  /// A fiber for the next device nobody started.
  Fiber* start_next() {
    const int i = claim_next(false);
    if (i < 0) return nullptr;
    idle_since_ = {};
    void* mapping = nullptr;
    try {
      mapping = take_stack();
    } catch (...) {
      shared_.run_here(i, std::current_exception());
      return nullptr;
    }
    auto* top = static_cast<unsigned char*>(mapping) + stack_bytes();
    top -= (sizeof(Fiber) + 63) / 64 * 64;
    Fiber* f = new (top) Fiber{};
    f->owner = this;
    f->index = i;
    f->mapping = mapping;
    const std::size_t usable =
        static_cast<std::size_t>(top - static_cast<unsigned char*>(mapping)) - page_bytes();
    sanitizers::create(f->sanitizer, top - usable, usable);
    context::stack_context stack;
    stack.sp = top;
    stack.size = usable;
    f->suspended = context::fiber(
        std::allocator_arg, context::preallocated(top, usable, stack), KeptStack{},
        [f](context::fiber&& loop) { return f->owner->fiber_main(f, std::move(loop)); });
    sanitizers::created(loop_);
    ++live_;
    return f;
  }

  /// Continues `f` until it suspends or returns, with its own exception state.
  void enter(Fiber* f) {
    const ThreadState saved = this_thread();
    ExceptionState* const exceptions = thread_exceptions();
    const ExceptionState mine = *exceptions;
    *exceptions = f->exceptions;
    this_thread().fiber = f;
    const FloatControl loop_float_control;
    f->float_control.restore();
    sanitizers::enter(loop_, f->sanitizer);
    f->suspended = std::move(f->suspended).resume();
    sanitizers::back(loop_);
    f->float_control = FloatControl{};
    loop_float_control.restore();
    f->exceptions = *exceptions;
    *exceptions = mine;
    restore(saved);
    if (f->done) {
      --live_;
      sanitizers::destroy(f->sanitizer);
      void* const mapping = f->mapping;
      f->~Fiber();
      give_stack(mapping);
    }
  }

  /// A fiber's body: runs its device, then the next ones nobody started while no other
  /// fiber of this loop is ready (a device that returned without waiting leaves its fiber
  /// to the next), then switches back for good.
  context::fiber fiber_main(Fiber* f, context::fiber&& loop) {
    to_loop_ = std::move(loop);
    sanitizers::arrive(f->sanitizer, loop_);
    for (;;) {
      try {
        shared_.work.run(shared_.work.body, f->index);
      } catch (...) {
        shared_.fail(std::current_exception());
      }
      if (!nothing_ready()) break;
      const int i = claim_next(true);
      if (i < 0) break;
      f->index = i;
    }
    f->done = true;
    sanitizers::leave(f->sanitizer, loop_, /*for_good=*/true);
    return std::move(to_loop_);
  }

  /// Waits until a fiber of this loop is ready (or returns at once if one is), or until it
  /// may start a device of a thread that has not come. Sleeps only when there is none.
  void park() {
    std::uint32_t seen = 0;
    {
      tbb::spin_mutex::scoped_lock guard(lock_);
      if (head_.load(std::memory_order_relaxed)) return;
      parked_ = true;
      seen = epoch_.load(std::memory_order_relaxed);
    }
    if (host_) {  // nested in a fiber: its thread runs other fibers meanwhile
      suspend();
      return;
    }
    const Clock::time_point now = Clock::now();
    if (idle_since_ == Clock::time_point{}) idle_since_ = now;
    const Clock::time_point spin_until = now + kParkSpin;
    for (int i = 1;; ++i) {
      if (epoch_.load(std::memory_order_acquire) != seen) return;
      if (i % 64 == 0) {
        const Clock::time_point t = Clock::now();
        if (shared_.unclaimed_elsewhere(block_, false) >= 0) {
          if (t - idle_since_ > shared_.steal_after) return unpark();
        } else if (t > spin_until) {
          break;
        }
      }
      cpu_relax();
    }
    sleeping_.store(true, std::memory_order_seq_cst);
    while (epoch_.load(std::memory_order_seq_cst) == seen)
      epoch_.wait(seen, std::memory_order_seq_cst);
    sleeping_.store(false, std::memory_order_relaxed);
  }
  /// Leaves park() without a wake: a later push() need not wake it.
  void unpark() {
    tbb::spin_mutex::scoped_lock guard(lock_);
    parked_ = false;
  }

  Shared& shared_;
  const int block_;
  int next_;       ///< next index of the own block to try
  const int end_;  ///< end of the own block
  Fiber* const host_;
  Shared::Cursor elsewhere_;        ///< its search of the other blocks
  Clock::time_point idle_since_{};  ///< parked first since it last started a device
  context::fiber to_loop_;          ///< the loop, while one of its fibers runs
  sanitizers::LoopState loop_;      ///< the loop's stack, for the sanitizers
  int live_ = 0;                    ///< fibers started here that have not returned

  alignas(64) tbb::spin_mutex lock_;
  std::atomic<Fiber*> head_{nullptr};  // the ready list, written under lock_
  Fiber* tail_ = nullptr;
  bool parked_ = false;
  alignas(64) std::atomic<std::uint32_t> epoch_{0};  ///< bumped to wake a parked loop
  std::atomic<bool> sleeping_{false};
};

namespace {

/// Inside the arena: the caller's Scheduler runs block 0, a oneTBB task per further block
/// runs that block's (a call on one thread makes no task_group, whose context costs a tenth
/// of an empty call there). oneTBB hands each task (and `shared`) to a worker, and the
/// worker's work back to the caller: releases and acquires that its uninstrumented library
/// does not show ThreadSanitizer. A task is built first (defer) and released before it is
/// spawned; it acquires before it reads what it captured.
void run_blocks(Shared& shared) {
  if (shared.blocks == 1) {
    Scheduler caller(shared, 0, nullptr);
    caller.loop();
  } else {
    shared.caller = &this_thread();
    tbb::task_group group;
    for (int w = 1; w < shared.blocks; ++w) {
      tbb::task_handle task = group.defer([&shared, w] {
        sanitizers::acquire(&handoff);
        shared.arrives(w);
        // A worker that comes after the others started every device (an empty kernel's
        // call is over by then) leaves having only read: its Scheduler would write the line
        // that their claims write, and each such write moves it between the cores.
        if (!shared.all_started()) {
          Scheduler worker(shared, w, nullptr);
          worker.loop();
        }
        sanitizers::release(&handoff);
      });
      sanitizers::release(&handoff);
      group.run(std::move(task));
    }
    Scheduler caller(shared, 0, nullptr);
    caller.loop();
    group.wait();
  }
}

}  // namespace

void run(Arena& arena, int threads, const Work& work) {
  Fiber* const host = this_thread().fiber;
  std::optional<Shared> made;
  try {
    made.emplace(work, host ? 1 : threads, arena.steal_after_ns);
  } catch (...) {  // no memory to share the indices: each runs here, cancelled
    run_each_cancelled(work, std::current_exception());
    return;
  }
  Shared& shared = *made;
  if (host) {
    Scheduler here(shared, 0, host);
    here.loop();
  } else {
    const auto threads_of_the_call = [&] {
      sanitizers::acquire(&handoff);  // before it reads what it captured
      run_blocks(shared);
      sanitizers::release(&handoff);
    };
    sanitizers::release(&handoff);  // a worker may run it (when the arena has no free slot)
    arena.tbb().execute(threads_of_the_call);
    sanitizers::acquire(&handoff);
  }
  if (shared.error) std::rethrow_exception(shared.error);
}

void suspend() {
  const ThreadState saved = this_thread();
  Fiber* f = saved.fiber;
  f->owner->switch_out(f);
  restore(saved);
}

void resume(Fiber* fiber) { fiber->owner->push(fiber); }

}  // namespace pmap::detail::fibers
