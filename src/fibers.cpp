// pmap's own device fibers (fibers.hpp).
//
// A fiber is a stack of its own (mmap'd, a guard page below, kept in a process-wide cache for
// the next call) and a saved stack pointer. Its switch saves what the x86-64 ABI says a
// called function keeps: rbx, rbp, r12-r15, the stack pointer, MXCSR's control bits and the
// x87 control word (Boost.Context's fcontext keeps the same), and nothing else: no signal
// mask, no system call. Each thread of a call runs a Scheduler: a loop that continues its
// ready fibers, else starts a device nobody has started, else parks (spins a while, then
// sleeps on a futex; nested in a fiber, it suspends that fiber instead). Fibers never move
// between threads: a fiber is continued only by the loop that started it, so a peer may
// make it ready before it finished suspending (the loop runs below it on the same thread and
// cannot take it before it switched), and its thread-local state (C++ exception state,
// errno, oneTBB's thread data) stays its thread's.
#include "pmap/detail/fibers.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cxxabi.h>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/spin_mutex.h>
#include <oneapi/tbb/task_group.h>

#include "pmap/detail/cpu_relax.hpp"
#include "pmap/detail/fiber_switch.hpp"
#include "pmap/detail/thread_state.hpp"

#if defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__)
#define PMAP_FIBERS_AVAILABLE 1
#else
#define PMAP_FIBERS_AVAILABLE 0
#endif

#if PMAP_FIBERS_AVAILABLE

extern "C" {
/// Saves the caller's context on its stack, stores its stack pointer in *from, and continues
/// the context whose stack pointer is `to`.
void pmap_fiber_switch(void** from, void* to);
/// Where a new fiber's first switch lands: calls r13(r12), which never returns.
void pmap_fiber_start();
}

asm(R"(
  .text
  .globl pmap_fiber_switch
  .hidden pmap_fiber_switch
  .type pmap_fiber_switch, @function
  .p2align 4
pmap_fiber_switch:
  .cfi_startproc
  endbr64
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .cfi_endproc
  .size pmap_fiber_switch, .-pmap_fiber_switch

  .globl pmap_fiber_start
  .hidden pmap_fiber_start
  .type pmap_fiber_start, @function
  .p2align 4
pmap_fiber_start:
  .cfi_startproc
  .cfi_undefined rip
  movq %r12, %rdi
  callq *%r13
  ud2
  .cfi_endproc
  .size pmap_fiber_start, .-pmap_fiber_start
)");

namespace pmap::detail::fibers {

class Scheduler;

/// A thread's C++ exception state (libstdc++'s and libc++abi's __cxa_eh_globals: the
/// exceptions being handled, innermost first, and the count of those in flight), kept per
/// fiber: a device that waits in a collective inside a catch block must find its own
/// exception on top when it goes on, not that of a device that ran meanwhile.
struct ExceptionState {
  void* caught = nullptr;
  unsigned int uncaught = 0;
};

struct Fiber {
  void* sp = nullptr;         ///< saved stack pointer while switched out
  ExceptionState exceptions;  ///< while switched out
  Scheduler* owner = nullptr;
  Fiber* next = nullptr;  ///< in the owner's ready list
  int index = 0;
  bool done = false;
  void* mapping = nullptr;  ///< the stack's mapping, guard page first; the Fiber at its top
};

namespace {

/// The calling thread's exception state, laid out as ExceptionState.
ExceptionState* thread_exceptions() {
  return reinterpret_cast<ExceptionState*>(abi::__cxa_get_globals());
}

/// Stacks as large as oneTBB's worker stacks (which its resumable tasks use too).
std::size_t stack_bytes() {
  static const std::size_t bytes = [] {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    std::size_t size = tbb::global_control::active_value(tbb::global_control::thread_stack_size);
    size = std::max<std::size_t>(size, 256 * 1024);
    return (size + page - 1) / page * page + page;  // and the guard page
  }();
  return bytes;
}

/// Fiber stacks, kept between calls: a mapping is made once and its pages stay touched.
class StackCache {
 public:
  ~StackCache() {
    for (void* m : free_) munmap(m, stack_bytes());
  }
  void* take() {
    {
      tbb::spin_mutex::scoped_lock guard(lock_);
      if (!free_.empty()) {
        void* m = free_.back();
        free_.pop_back();
        return m;
      }
    }
    void* m = mmap(nullptr, stack_bytes(), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    if (mprotect(m, static_cast<std::size_t>(sysconf(_SC_PAGESIZE)), PROT_NONE) != 0) {
      munmap(m, stack_bytes());
      throw std::bad_alloc();
    }
    return m;
  }
  void give(void* m) {
    {
      tbb::spin_mutex::scoped_lock guard(lock_);
      if (free_.size() < kKept) {
        free_.push_back(m);
        return;
      }
    }
    munmap(m, stack_bytes());
  }

 private:
  static constexpr std::size_t kKept = 256;
  tbb::spin_mutex lock_;
  std::vector<void*> free_;
};

StackCache& stacks() {
  static StackCache cache;
  return cache;
}

/// After a switch back to a context: the thread state it had before it switched away (the
/// fibers that ran meanwhile on this thread set their own).
void restore(const ThreadState& saved) {
  ThreadState& t = this_thread();
  t.device = saved.device;
  t.run = saved.run;
  t.fiber = saved.fiber;
}

/// Runs index i on the calling stack, without a fiber (there is no memory for one), after
/// work.cancel, so that it does not wait for peers; its exception propagates.
void run_cancelled(const Work& work, int i, std::exception_ptr why) {
  if (work.cancel) work.cancel(work.canceller, std::move(why));
  const ThreadState saved = this_thread();
  this_thread().run = nullptr;
  struct Restore {
    const ThreadState& saved;
    ~Restore() { restore(saved); }
  } restore_on_exit{saved};
  work.run(work.body, i);
}

/// What the threads of one run() share: the work, who started what, the first failure.
/// The indices are cut into one block per thread, as a static parallel_for would; a thread
/// starts the devices of its own block, and those of a block whose thread has not come
/// only when it has nothing else to do for a while (kStealAfter): a device stays on the
/// thread that started it, so one taken early from a thread that was just waking up would
/// leave that thread with less to do for the whole call. Stealing is what makes progress
/// certain all the same: oneTBB does not promise that a task runs while another waits.
struct Shared {
  Shared(const Work& w, int threads)
      : work(w),
        n(w.n),
        blocks(std::min(w.n, threads)),
        flags(n + blocks > kInline ? new std::atomic<bool>[static_cast<std::size_t>(n + blocks)]()
                                   : nullptr),
        started(flags ? flags.get() : inline_flags),
        arrived(started + n) {}
  int block_begin(int b) const { return static_cast<int>(std::int64_t{n} * b / blocks); }
  bool claim(int i) {
    std::atomic<bool>& s = started[i];
    return !s.load(std::memory_order_relaxed) && !s.exchange(true, std::memory_order_relaxed);
  }
  /// An index nobody started in a block whose thread has not come, claimed if `take`.
  int unclaimed_elsewhere(int mine, bool take) {
    for (int b = 0; b < blocks; ++b) {
      if (b == mine || arrived[b].load(std::memory_order_acquire)) continue;
      for (int i = block_begin(b); i < block_begin(b + 1); ++i)
        if (take ? claim(i) : !started[i].load(std::memory_order_relaxed)) return i;
    }
    return -1;
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

  static constexpr int kInline = 128;
  const Work& work;
  const int n;
  const int blocks;
  std::atomic<bool> inline_flags[kInline] = {};
  std::unique_ptr<std::atomic<bool>[]> flags;
  std::atomic<bool>* const started;  ///< per index: a thread took it
  std::atomic<bool>* const arrived;  ///< per block: its thread runs its loop
  tbb::spin_mutex lock;
  std::exception_ptr error;
};

using Clock = std::chrono::steady_clock;

// Parking: spin this long for a peer on another thread before sleeping (a futex wake costs
// more than a collective's wait at 8 KiB).
constexpr auto kParkSpin = std::chrono::microseconds(20);
// Idle this long before starting a device of a thread that has not come: longer than a
// oneTBB worker takes to wake up and take its task (30-50 us on the 2-vCPU VM).
constexpr auto kStealAfter = std::chrono::microseconds(100);

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
        host_(host) {
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
      head_ = f;
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

  void* loop_sp() const { return sp_; }
  Shared& shared() { return shared_; }

 private:
  Fiber* pop() {
    tbb::spin_mutex::scoped_lock guard(lock_);
    Fiber* f = head_;
    if (f) {
      head_ = f->next;
      if (!head_) tail_ = nullptr;
    }
    return f;
  }

  /// A fiber for the next device nobody started: of this loop's block, else, after idling
  /// for kStealAfter, of a block whose thread has not come.
  Fiber* start_next() {
    int i = -1;
    for (; i < 0 && next_ < end_; ++next_)
      if (shared_.claim(next_)) i = next_;
    if (i < 0 && idle_since_ != Clock::time_point{} && Clock::now() - idle_since_ > kStealAfter)
      i = shared_.unclaimed_elsewhere(block_, true);
    if (i < 0) return nullptr;
    idle_since_ = {};
    void* mapping = nullptr;
    try {
      mapping = stacks().take();
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
    // The frame pmap_fiber_switch pops: control words, r15 .. rbp, return address.
    auto* frame = reinterpret_cast<std::uint64_t*>(top) - 9;
    std::uint32_t mxcsr = 0;
    std::uint16_t x87 = 0;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(x87));
    std::memset(frame, 0, 9 * sizeof(std::uint64_t));
    std::memcpy(frame, &mxcsr, sizeof mxcsr);
    std::memcpy(reinterpret_cast<unsigned char*>(frame) + 4, &x87, sizeof x87);
    frame[4] = reinterpret_cast<std::uint64_t>(&fiber_main);  // r13
    frame[5] = reinterpret_cast<std::uint64_t>(f);            // r12
    frame[8] = reinterpret_cast<std::uint64_t>(&pmap_fiber_start);
    f->sp = frame;
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
    pmap_fiber_switch(&sp_, f->sp);
    f->exceptions = *exceptions;
    *exceptions = mine;
    restore(saved);
    if (f->done) {
      --live_;
      stacks().give(f->mapping);
    }
  }

  /// Waits until a fiber of this loop is ready (or returns at once if one is), or until it
  /// may start a device of a thread that has not come. Sleeps only when there is none.
  void park() {
    std::uint32_t seen = 0;
    {
      tbb::spin_mutex::scoped_lock guard(lock_);
      if (head_) return;
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
          if (t - idle_since_ > kStealAfter) return unpark();
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

  /// A fiber's first frame: runs its device, then switches back for good.
  static void fiber_main(Fiber* f) {
    this_thread().run = nullptr;
    Shared& shared = f->owner->shared();
    try {
      shared.work.run(shared.work.body, f->index);
    } catch (...) {
      shared.fail(std::current_exception());
    }
    f->done = true;
    pmap_fiber_switch(&f->sp, f->owner->loop_sp());
    __builtin_unreachable();
  }

  Shared& shared_;
  const int block_;
  int next_;       ///< next index of the own block to try
  const int end_;  ///< end of the own block
  Fiber* const host_;
  Clock::time_point idle_since_{};  ///< parked first since it last started a device
  void* sp_ = nullptr;              ///< the loop's context while a fiber runs
  int live_ = 0;                    ///< fibers started here that have not returned

  alignas(64) tbb::spin_mutex lock_;
  Fiber* head_ = nullptr;  // the ready list, guarded by lock_
  Fiber* tail_ = nullptr;
  bool parked_ = false;
  alignas(64) std::atomic<std::uint32_t> epoch_{0};  ///< bumped to wake a parked loop
  std::atomic<bool> sleeping_{false};
};

bool available() {
  static const bool yes = [] {
    const char* setting = std::getenv("PMAP_FIBERS");
    if (setting && std::strcmp(setting, "0") == 0) return false;
    return !shadow_stack_enabled();
  }();
  return yes;
}

void run(tbb::task_arena& arena, int threads, const Work& work) {
  Fiber* const host = this_thread().fiber;
  std::optional<Shared> made;
  try {
    made.emplace(work, host ? 1 : threads);
  } catch (...) {  // no memory to share the indices: each runs here, cancelled
    const std::exception_ptr why = std::current_exception();
    std::exception_ptr first;
    for (int i = 0; i < work.n; ++i) {
      try {
        run_cancelled(work, i, why);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
    return;
  }
  Shared& shared = *made;
  if (host) {
    Scheduler here(shared, 0, host);
    here.loop();
  } else {
    arena.execute([&] {
      tbb::task_group group;
      for (int w = 1; w < shared.blocks; ++w)
        group.run([&shared, w] {
          Scheduler worker(shared, w, nullptr);
          worker.loop();
        });
      Scheduler caller(shared, 0, nullptr);
      caller.loop();
      group.wait();
    });
  }
  if (shared.error) std::rethrow_exception(shared.error);
}

void suspend() {
  const ThreadState saved = this_thread();
  Fiber* f = saved.fiber;
  pmap_fiber_switch(&f->sp, f->owner->loop_sp());
  restore(saved);
}

void resume(Fiber* fiber) { fiber->owner->push(fiber); }

}  // namespace pmap::detail::fibers

#else

namespace pmap::detail::fibers {
struct Fiber {};
bool available() { return false; }
void run(tbb::task_arena&, int, const Work&) { std::abort(); }
void suspend() { std::abort(); }
void resume(Fiber*) { std::abort(); }
}  // namespace pmap::detail::fibers

#endif
