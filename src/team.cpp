#include "pmap/detail/team.hpp"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "pmap/detail/assert.hpp"
#include "pmap/detail/cpu_relax.hpp"
#include "pmap/errors.hpp"

namespace pmap::detail {
namespace {

// Spinning helps only while every device can hold a thread: a few microseconds of PAUSE
// while the devices waited for are running elsewhere. While one of them was just resumed and
// waits for a thread to continue it, longer when the devices work long between barriers: up
// to an eighth of a phase, at most 100 us, long enough for a oneTBB worker that went to sleep
// to wake up and take it (30-50 us on the 2-vCPU VM). Otherwise the waiter suspends first and
// its own thread continues the resumed peer: both devices then run on one thread, one after
// the other (a chain of 128 MiB ppermutes on 2 devices: CPU/wall 1.04, 30 ms per ppermute;
// with the long spin: CPU/wall 1.93, 17 ms). With short phases that costs a task switch, less
// than waiting for a worker to wake (8 KiB psums on 2 devices: 2.4-3.5 us per psum without the
// long spin, 3.6-4.3 us and rounds of 23 us with a 100 us spin whatever the phase length).
constexpr int kSpinIterations = 256;
// A device on a fiber that waits (Team::yield_until) first lets the other ready fibers of
// its thread run, this many times, before it suspends. Suspending and waking go through the
// team's lock and counters, lines that every device of the team writes: with 8 devices on 2
// threads, a one-point ring ppermute took 6.4 us per step that way against 1.74 us with all
// 8 devices on one thread, and 2.85 us yielding; an 8 KiB psum chain 16 us against 12.
constexpr int kYields = 64;
constexpr auto kSpinWhileResuming = std::chrono::microseconds(100);
// One phase of a device in this many is timed for SpinWaiter's budget (Team::wait_for).
constexpr std::uint32_t kTimedPhase = 16;

using Clock = std::chrono::steady_clock;

/// The wait policy above, for one wait (oneTBB's waiters.h is the model).
class SpinWaiter {
 public:
  explicit SpinWaiter(Clock::duration phase_length)
      : resuming_budget_(std::min<Clock::duration>(kSpinWhileResuming, phase_length / 8)) {}
  /// After `spins` PAUSEs, with the awaited devices in state `awaited`: spin on?
  template <class Awaited>
  bool go_on(int spins, Awaited awaited) {
    if (awaited == Awaited::blocked) return false;  // queued behind us: only a switch helps
    if (awaited == Awaited::resuming) {
      const Clock::time_point now = Clock::now();
      if (start_ == Clock::time_point{}) start_ = now;
      return now - start_ <= resuming_budget_;
    }
    return spins < kSpinIterations;
  }

 private:
  Clock::duration resuming_budget_;
  Clock::time_point start_{};
};

/// After a suspension: this device may now run on another thread, whose state is set to it.
/// Not inlined, so that no thread-local address is kept from before the switch.
[[gnu::noinline]] void resumed(Slot& mine, const ThreadState& saved) {
  ThreadState& thread = this_thread();
  mine.runner.store(&thread.tag, std::memory_order_relaxed);
  thread.device = saved.device;
}

std::uint64_t next_team_serial() {
  static std::atomic<std::uint64_t> teams{0};
  return teams.fetch_add(1, std::memory_order_relaxed) << 24;
}


}  // namespace

Team::Team(int size, std::span<const AxisBinding> axes, std::vector<int> device_ids,
           int num_threads, int local_begin, int local_count)
    : size_(size),
      num_axes_(static_cast<int>(axes.size())),
      device_ids_(std::move(device_ids)),
      slots_(new Slot[static_cast<std::size_t>(size)]),
      may_spin_((local_count < 0 ? size : local_count) <= num_threads),
      local_begin_(local_begin),
      local_count_(local_count < 0 ? size : local_count),
      serial_(next_team_serial()) {
  for (int m = local_begin_; m < local_begin_ + local_count_; ++m) local_members_.push_back(m);
  int stride = 1;
  for (int a = num_axes_ - 1; a >= 0; --a) {
    axes_[a] = axes[static_cast<std::size_t>(a)];
    strides_[a] = stride;
    stride *= axes_[a].size;
  }
}

void Team::reset() {
  for (int m = 0; m < size_; ++m) {
    Slot& s = slot(m);
    s.phase.store(0, std::memory_order_relaxed);
    s.finished.store(false, std::memory_order_relaxed);
    s.runner.store(nullptr, std::memory_order_relaxed);
    s.signature.store(0, std::memory_order_relaxed);
    for (auto& signature : s.staged_signature) signature.store(0, std::memory_order_relaxed);
    // A copy describes a started collective of this call only (check_agreement).
    for (auto& valid : s.staged_desc_valid) valid.store(false, std::memory_order_relaxed);
    s.departed = {};  // the time between calls is not a phase (phase_length is kept)
    s.final_phase = 0;
    s.awaits = -1;
    s.awaited_by.store(0, std::memory_order_relaxed);
    s.unsettled = false;
  }
  blocked_ = 0;
  sleepers_.store(0, std::memory_order_relaxed);
  cancelled_.store(false, std::memory_order_relaxed);
  calls_done_.store(0, std::memory_order_relaxed);
  error_ = nullptr;
  error_device_ = -1;
  child_.reset();
  exchange_.reset();
  ++serial_;
}

bool Team::reached(std::span<const int> members, std::uint64_t target, int me) {
  for (int m : members) {
    const Slot& s = slot(m);
    if (s.phase.load(std::memory_order_acquire) >= target) continue;
    if (s.finished.load(std::memory_order_acquire) &&
        s.phase.load(std::memory_order_acquire) < target)
      raise_stuck(me, members, target, m);
    return false;
  }
  return true;
}

namespace {

/// The first of `members` short of `target` and still running (one exists when neither
/// reached() nor drained() holds).
int first_short(const Team& team, std::span<const int> members, std::uint64_t target) {
  for (int m : members) {
    const Slot& s = team.slot(m);
    if (s.phase.load(std::memory_order_seq_cst) < target &&
        !s.finished.load(std::memory_order_seq_cst))
      return m;
  }
  return -1;
}

}  // namespace

bool Team::drained(std::span<const int> members, std::uint64_t target) const {
  for (int m : members) {
    const Slot& s = slot(m);
    if (s.phase.load(std::memory_order_acquire) < target &&
        !s.finished.load(std::memory_order_acquire))
      return false;
  }
  return true;
}

void Team::drain(int me, std::span<const int> members, std::uint64_t first, std::uint64_t last,
                 bool point_to_point) noexcept {
  Slot& mine = slot(me);
  for (std::uint64_t u = std::max(first, mine.phase.load(std::memory_order_relaxed)); u <= last;
       ++u) {
    mine.phase.store(u, std::memory_order_seq_cst);
    announce(me);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) wake(members);
    if (drained(members, u)) continue;
    for (int i = 0; may_spin_ && i < kSpinIterations && !drained(members, u); ++i) cpu_relax();
    if (!drained(members, u) && !suspend_until(me, members, u, Wait::drain, point_to_point)) return;
  }
}

void Team::await_readers(int me, std::span<const int> readers, std::uint64_t target) {
  if (drained(readers, target)) return;
  settle(me);
  for (int i = 0; may_spin_ && i < kSpinIterations; ++i) {
    if (cancelled()) throw Cancelled{};
    if (drained(readers, target)) return;
    cpu_relax();
  }
  const std::int64_t waited = tracing::recording() ? tracing::now() : -1;
  suspend_until(me, readers, target, Wait::readers, true);
  if (waited >= 0) tracing::wait(*this, me, waited);
}

void Team::arrive_and_wait(int me, std::span<const int> members, std::uint64_t target,
                           bool point_to_point) {
  arrive(me, target);
  // Only the arrival that completes the barrier wakes its waiting members: an earlier one
  // would wake them only to suspend them again, each of them, at every arrival (7 switches
  // per waiting device and barrier with 8 devices). Of two members arriving last together,
  // at least one sees the other's phase (both stores and loads are sequentially
  // consistent), and a member about to suspend counts itself a sleeper before it looks.
  // Draining members, which also wait for members that returned, are woken by drain() and
  // finish(). A point-to-point wait completes no barrier: its peers wait for this device
  // alone, and announce() woke them.
  const bool complete = reached(members, target, me);
  if (complete && !point_to_point && sleepers_.load(std::memory_order_seq_cst) > 0) wake(members);
  wait_for(me, members, target, point_to_point, complete);
}

void Team::await_arrival(int me, std::span<const int> members, std::uint64_t target) {
  // Arrived already (it travelled while this device computed): not even a clock read.
  if (reached(members, target, me)) return;
  wait_for(me, members, target, true, false);
}

void Team::wait_for(int me, std::span<const int> members, std::uint64_t target,
                    bool point_to_point, bool complete) {
  Slot& mine = slot(me);
  if (!may_spin_) {
    if (!complete) {
      settle(me);
      const std::int64_t waited = tracing::recording() ? tracing::now() : -1;
      if (!yield_until(me, members, target))
        suspend_until(me, members, target, Wait::barrier, point_to_point);
      if (waited >= 0) tracing::wait(*this, me, waited);
    }
    return;
  }
  // How long this device works between barriers, on average: a peer waiting for a thread is
  // worth a long spin only when the phases are long (see SpinWaiter). One phase in
  // kTimedPhase is timed: two clock reads per collective were a fifth of a one-device
  // ppermute's time.
  if (mine.departed != Clock::time_point{}) {
    mine.phase_length += (Clock::now() - mine.departed - mine.phase_length) / 4;
    mine.departed = {};
  }
  auto depart = [&mine] {
    if (mine.phases_left++ % kTimedPhase == 0) mine.departed = Clock::now();
  };
  if (complete) return depart();
  // Not settled here (Team::settle): its fence would wait for the line of this device's
  // arrival, which the peer it waits for polls, before this device may poll the peer's. A
  // peer that suspended on this device meanwhile is resumed by its next settle: the awaited
  // peer shows as blocked within 16 spins, and any wait ends in suspend_until() after at
  // most kSpinIterations spins, which settles first.
  const std::int64_t waited = tracing::recording() ? tracing::now() : -1;
  SpinWaiter waiter(mine.phase_length);
  for (int i = 0;; ++i) {
    if (cancelled()) throw Cancelled{};
    if (reached(members, target, me)) break;
    if (i % 16 == 0 && !waiter.go_on(i, awaited(members, target))) {
      suspend_until(me, members, target, Wait::barrier, point_to_point);
      break;
    }
    cpu_relax();
  }
  depart();
  if (waited >= 0) tracing::wait(*this, me, waited);
}

void Team::yield(int me) {
  settle(me);
#if !PMAP_DEVICE_THREADS
  if (fibers::Fiber* const f = this_thread().fiber) {
    fibers::resume(f);  // behind the ready fibers of this thread, which run first
    fibers::suspend();
    return;
  }
#endif
  std::this_thread::yield();
}

bool Team::yield_until(int me, std::span<const int> members, std::uint64_t target) {
#if PMAP_DEVICE_THREADS
  (void)me, (void)members, (void)target;
  return false;
#else
  fibers::Fiber* const f = this_thread().fiber;
  if (!f) return false;
  // A trace shows the device off its thread from the first switch to the last.
  struct Traced {
    Team& team;
    int me;
    const bool on = tracing::recording();
    Traced(Team& t, int m) : team(t), me(m) {
      if (on) tracing::suspend(team, me);
    }
    ~Traced() {
      if (on) tracing::resume(team, me);
    }
  } traced(*this, me);
  for (int i = 0; i < kYields; ++i) {
    fibers::resume(f);  // behind the ready fibers of this thread, which run first
    fibers::suspend();
    if (cancelled()) throw Cancelled{};
    if (reached(members, target, me)) return true;
  }
  return false;
#endif
}

Team::Awaited Team::awaited(std::span<const int> members, std::uint64_t target) const {
  Awaited result = Awaited::running;
  const void* const here = &this_thread().tag;
  for (int m : members) {
    const Slot& s = slot(m);
    if (s.phase.load(std::memory_order_relaxed) >= target) continue;
    const void* r = s.runner.load(std::memory_order_relaxed);
    if (r == here || r == kSuspendedRunner) return Awaited::blocked;
    if (r == kResumingRunner) result = Awaited::resuming;
  }
  return result;
}

/// Holds the team's lock while a device counts as blocked in it. The destructor undoes both,
/// unless the device suspended: then the suspension released the lock, and whoever resumes
/// it (resume_locked) uncounts it.
class Team::Blocked {
 public:
  explicit Blocked(Team& team) : team_(team) {
    team_.lock_.lock();
    ++team_.blocked_;
    team_.sleepers_.fetch_add(1, std::memory_order_seq_cst);
  }
  ~Blocked() {
    if (!held_) return;
    --team_.blocked_;
    team_.sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    team_.lock_.unlock();
  }
  Blocked(const Blocked&) = delete;
  Blocked& operator=(const Blocked&) = delete;
  void handed_over() { held_ = false; }

 private:
  Team& team_;
  bool held_ = true;
};

bool Team::await_one(Slot& mine, std::span<const int> members, std::uint64_t target) {
  const int m = first_short(*this, members, target);
  if (m < 0) return false;
  // Counted in the awaited member's slot before its phase is read again: an arrival that
  // this read misses sees the count and resumes us (announce).
  Slot& awaited = slot(m);
  awaited.awaited_by.fetch_add(1, std::memory_order_seq_cst);
  if (awaited.phase.load(std::memory_order_seq_cst) >= target ||
      awaited.finished.load(std::memory_order_seq_cst)) {
    awaited.awaited_by.fetch_sub(1, std::memory_order_seq_cst);
    return false;
  }
  mine.awaits = m;
  return true;
}

bool Team::suspend_until(int me, std::span<const int> members, std::uint64_t target, Wait wait,
                         bool point_to_point) {
  Slot& mine = slot(me);
  const ThreadState saved = this_thread();
  const bool draining = wait == Wait::drain;
  settle(me);
  for (;;) {
    {
      Blocked blocked(*this);
      if (!draining && cancelled()) throw Cancelled{};
      if (wait == Wait::barrier ? reached(members, target, me) : drained(members, target))
        return true;
      if (blocked_ + count_finished() == local_count_) {
        // Nobody is left running who could release us. A draining device may leave: nobody
        // reads its buffers either (the others wake when it finishes). Otherwise report
        // instead of hanging.
        if (draining) return false;
        throw DeviceError(device_id(me), describe_deadlock());
      }
      if (point_to_point && !await_one(mine, members, target)) continue;  // arrived meanwhile
      if (tracing::recording()) tracing::suspend(*this, me);
      suspend_locked(mine, blocked);
    }
    resumed(mine, saved);
    if (tracing::recording()) tracing::resume(*this, me);
    if (!draining && cancelled()) throw Cancelled{};
  }
}

void Team::suspend_locked(Slot& mine, Blocked& blocked) {
  mine.suspended = true;
  mine.runner.store(kSuspendedRunner, std::memory_order_relaxed);
  blocked.handed_over();
#if PMAP_DEVICE_THREADS
  mine.awake.store(false, std::memory_order_relaxed);
  lock_.unlock();
  mine.awake.wait(false, std::memory_order_acquire);
#else
  // Only this thread continues it: a peer may make it ready before it switched.
  mine.fiber = this_thread().fiber;
  PMAP_ASSERT(mine.fiber != nullptr);  // every device runs on a fiber (Pool::run)
  lock_.unlock();
  fibers::suspend();
#endif
}

void Team::resume_locked(Slot& s) {
  if (!s.suspended) return;
  s.suspended = false;
  s.runner.store(kResumingRunner, std::memory_order_relaxed);
  --blocked_;
  sleepers_.fetch_sub(1, std::memory_order_seq_cst);
  if (s.awaits >= 0) {
    slot(s.awaits).awaited_by.fetch_sub(1, std::memory_order_seq_cst);
    s.awaits = -1;
  }
#if PMAP_DEVICE_THREADS
  s.awake.store(true, std::memory_order_release);
  s.awake.notify_one();
#else
  fibers::resume(std::exchange(s.fiber, nullptr));
#endif
}

void Team::wake(std::span<const int> members) {
  std::lock_guard<SpinLock> guard(lock_);
  for (int m : members) resume_locked(slot(m));
}

void Team::wake_awaiting(int me) {
  std::lock_guard<SpinLock> guard(lock_);
  for (int m : local_members_) {
    Slot& s = slot(m);
    if (s.suspended && s.awaits == me) resume_locked(s);
  }
}

void Team::wake_all_locked() {
  for (int m = 0; m < size_; ++m) resume_locked(slot(m));
}

int Team::count_finished() const {
  // Counted here, on the slow path, so that finishing costs no shared read-modify-write.
  int finished = 0;
  for (int m : local_members_)
    finished += slot(m).finished.load(std::memory_order_seq_cst) ? 1 : 0;
  return finished;
}

void Team::finish(int me) {
  slot(me).finished.store(true, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<SpinLock> guard(lock_);
    wake_all_locked();
  }
}

bool Team::fail(std::exception_ptr error, int member) {
  std::lock_guard<SpinLock> guard(lock_);
  const bool first = !error_;
  if (first) {
    error_ = std::move(error);
    error_device_ = member >= 0 ? device_id(member) : -1;
  }
  cancelled_.store(true, std::memory_order_release);
  wake_all_locked();
  // Lock order: a parent's lock, then its child's (a child never takes its parent's).
  if (child_) child_->fail(std::make_exception_ptr(Cancelled{}));
  return first;
}

void Team::make_child(int size, std::span<const AxisBinding> axes, std::vector<int> device_ids,
                      int num_threads) {
  auto child = std::make_shared<Team>(size, axes, std::move(device_ids), num_threads);
  child->nesting_ = nesting_ + 1;
  std::lock_guard<SpinLock> guard(lock_);
  child_ = std::move(child);
  if (cancelled()) child_->fail(std::make_exception_ptr(Cancelled{}));
}

}  // namespace pmap::detail
