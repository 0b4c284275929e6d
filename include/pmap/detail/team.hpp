/// @file team.hpp
/// @brief The devices of one call and their barriers: where a device waits for its peers.
///
/// A Team is the set of logical devices of one call (for a nested call: the whole grid of
/// outer x inner devices). Each device owns one Slot. A collective is a sequence of phases
/// (rendezvous.hpp); in each phase a device publishes "I reached phase k" in its slot and
/// waits until every member of its group has too. A device that has to wait spins briefly
/// when every device of the team can hold a thread, otherwise it suspends its oneTBB task
/// (resumable tasks), so its worker thread runs other devices meanwhile. A failure cancels
/// the team: waiting devices wake, drain their collective (Team::drain) and leave.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pmap/axes.hpp"
#include "pmap/detail/distributed.hpp"
#include "pmap/detail/errors.hpp"
#include "pmap/detail/hash.hpp"
#include "pmap/errors.hpp"
#include "pmap/detail/pool.hpp"
#include "pmap/detail/process_exchange.hpp"
#include "pmap/detail/slot.hpp"
#include "pmap/detail/spin_lock.hpp"
#include "pmap/detail/tensor_traits.hpp"
#include "pmap/detail/thread_state.hpp"
#include "pmap/detail/trace_events.hpp"
#include "pmap/runtime.hpp"

namespace pmap::detail {

/// A collective could not complete because another process failed or disagreed.
class RemoteFailure : public DeviceError {
 public:
  using DeviceError::DeviceError;
};

inline constexpr int kMaxAxes = 8;

/// Every collective advances its members' phase counters by this much, whatever path it
/// takes (staged: 1 barrier, in place: 2, split reduction: 3, across processes: 3 or 4; the
/// nesting rendezvous: 3). The members of one group take the same path, but the groups of one
/// grouped collective may not (another operand size, another group size): were each to count
/// only its own barriers, the devices would disagree on where the team stands in the next
/// collective over all of them, and a device would take a peer's barrier of the previous
/// collective for this one and read its buffers while they are being overwritten.
inline constexpr std::uint64_t kPhasesPerCollective = 4;

/// One named axis bound by an enclosing pmap.
/// The team owns the names: an inner Mapped may die before the other devices finish.
struct AxisBinding {
  std::string name;
  int size = 1;
};

class Team {
 public:
  /// @param size devices in the team; @param axes outer to inner, product == size;
  /// @param device_ids global device id of each member; @param local_begin,local_count the
  /// members this process runs (all of them unless the team spans processes).
  Team(int size, std::span<const AxisBinding> axes, std::vector<int> device_ids,
       int num_threads, int local_begin = 0, int local_count = -1);
  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;

  /// Prepares a finished team for the next call with the same devices.
  void reset();

  int size() const { return size_; }
  /// Tells this call's team from every other team and call (a trace's collective keys).
  std::uint64_t serial() const { return serial_; }
  /// 0 for a call's team, 1 for the team of a pmap nested in its kernels, ...
  int nesting() const { return nesting_; }
  int num_axes() const { return num_axes_; }
  /// Its local devices outnumber the runtime's threads: some run on one thread, in turn.
  bool shares_threads() const { return !may_spin_; }
  const AxisBinding& axis(int a) const { return axes_[a]; }
  /// Index of member `m` along axis `a`.
  int index_on(int m, int a) const { return (m / strides_[a]) % axes_[a].size; }
  int stride(int a) const { return strides_[a]; }
  int device_id(int m) const { return device_ids_[static_cast<std::size_t>(m)]; }
  Slot& slot(int m) { return slots_[static_cast<std::size_t>(m)]; }
  const Slot& slot(int m) const { return slots_[static_cast<std::size_t>(m)]; }

  /// Publishes what `me` calls, before its first barrier: the description error messages
  /// read, the signature its peers compare and the buffers they read in place.
  void publish(int me, const OpDescRef& desc, std::string_view axes, std::uint64_t signature,
               const void* in = nullptr, void* out = nullptr) {
    Slot& s = slot(me);
    s.describe(desc, axes, signature);
    s.in = in;
    s.out = out;
    s.signature.store(signature, std::memory_order_release);
  }
  /// publish() of the `ordinal`-th staged collective of `me`: the input is copied into the
  /// slot (copy `ordinal % kStagedCopies`, returned), and the copy is signed with the ordinal
  /// too, so that a member that called something else cannot match an older copy. The regular
  /// signature is the same, for a member that calls a collective that is not staged.
  /// `started`: a collective started (SPEC 11), which later ones of `me` may follow before it
  /// completes: its copy describes it too (Slot::staged_desc).
  int publish_staged(int me, const OpDescRef& desc, std::string_view axes, std::uint64_t signature,
                     std::uint64_t ordinal, const void* in, std::size_t bytes, bool started) {
    Slot& s = slot(me);
    const int copy = static_cast<int>(ordinal % kStagedCopies);
    const std::uint64_t signed_copy = hash_mix(signature, ordinal);
    s.describe(desc, axes, signature);
    if (started)
      s.describe_staged(copy, desc, axes, signature);
    else if (s.staged_desc_valid[copy].load(std::memory_order_relaxed))
      s.staged_desc_valid[copy].store(false, std::memory_order_relaxed);
    s.stage(copy, in, bytes);
    s.staged_signature[copy].store(signed_copy, std::memory_order_relaxed);
    s.signature.store(signed_copy, std::memory_order_release);
    return copy;
  }

  /// Adds the point-to-point collective `signature` over the whole team (a ppermute,
  /// pshuffle or pbroadcast, which waits for its source alone and is compared with nobody
  /// else's) that `me` calls as its `position`-th of the call to its history, which the
  /// devices compare when the call ends (check_same_collectives): only there is a device
  /// found that disagrees on one in which nobody reads it. Every other collective is compared
  /// by all members of its group when they meet.
  void record_unread(int me, std::uint64_t position, std::uint64_t signature,
                     const OpDescRef& desc, std::string_view axes) {
    Slot& s = slot(me);
    s.history = hash_mix(hash_mix(s.history, position), signature);
    s.note_unchecked(position, signature, desc, axes);
  }

  /// An inner call of a nested pmap over `n` of this (child) team's devices returned
  /// normally: true for the last of the outer devices' inner calls, which compares the
  /// collectives of the whole team (the others' inner devices may have disagreed with its
  /// own on a collective over an outer axis that nobody waited for). A top-level call is
  /// the only call of its team.
  bool last_call_done(int n) {
    return calls_done_.fetch_add(n, std::memory_order_acq_rel) + n == local_count_;
  }

  /// Phase k of the current collective of `me`: publish, wake waiting peers, wait until every
  /// member reached it. Throws Cancelled if another device failed, DeviceError (E14) if a
  /// member returned from its kernel or called a different collective. `point_to_point`:
  /// `members` are the only peers `me` reads (a ppermute's source), not its whole group, so
  /// that `me` neither waits for the others nor completes a barrier they wait in; it waits
  /// until the peer it awaits arrives anywhere (wake_awaiting).
  void arrive_and_wait(int me, std::span<const int> members, std::uint64_t target,
                       bool point_to_point = false);
  /// The two halves of a point-to-point arrive_and_wait, for a collective started now and
  /// completed later (SPEC 11): `me` reached `target` (its peers may read what it published;
  /// its newest collective's: the phase only grows); then, later, waits until `members`
  /// reached `target` too (a device that published later collectives meanwhile is past it).
  void arrive(int me, std::uint64_t target) {
    Slot& s = slot(me);
    s.phase.store(target, std::memory_order_seq_cst);
    if (s.unsettled) s.unsettled = false;  // the fence settled an earlier arrive_posted()
    announce(me);
  }
  /// arrive() of a posted collective (rendezvous.hpp: Posted), without its fence: a plain
  /// store does not wait for the line its source polls, so that two collectives posted
  /// together cross to it as one line transfer, not two. A peer that suspended on `me` just
  /// before this store may miss it: settle() makes up for it, before `me` waits anywhere.
  void arrive_posted(int me, std::uint64_t target) {
    Slot& s = slot(me);
    s.phase.store(target, std::memory_order_release);
    if (s.awaited_by.load(std::memory_order_relaxed) > 0)
      wake_awaiting(me);
    else
      s.unsettled = true;
  }
  /// After arrive_posted(): orders the arrival before the read of awaited_by (the fence
  /// arrive() has), so that a peer that suspended on `me` meanwhile is resumed.
  void settle(int me) {
    Slot& s = slot(me);
    if (!s.unsettled) return;
    s.unsettled = false;
    s.phase.fetch_add(0, std::memory_order_seq_cst);
    announce(me);
  }
  /// Every member arrived at `target` or returned from its kernel (Team::drain).
  bool drained(std::span<const int> members, std::uint64_t target) const;
  /// arrive() at a barrier of `members` that `me` does not wait in yet (a staged collective
  /// over the whole group: rendezvous.hpp: PostedGroup): the arrival that completes it wakes
  /// its suspended members, as arrive_and_wait's does. Returns whether it completed it.
  bool arrive_at_barrier(int me, std::span<const int> members, std::uint64_t target) {
    arrive(me, target);
    for (int m : members)
      if (slot(m).phase.load(std::memory_order_acquire) < target) return false;
    if (sleepers_.load(std::memory_order_seq_cst) > 0) wake(members);
    return true;
  }
  /// Lets the other devices of `me`'s thread run once (on a fiber), or other threads: a
  /// device that polls for a peer (Pending::ready) gives its thread to the peer.
  void yield(int me);
  void await_arrival(int me, std::span<const int> members, std::uint64_t target);
  /// The wait of a barrier that `me` arrived at earlier (arrive_at_barrier, which said
  /// whether it was `complete` then): as arrive_and_wait's, suspended until the arrival that
  /// completes it, not woken by each.
  void await_barrier(int me, std::span<const int> members, std::uint64_t target, bool complete) {
    wait_for(me, members, target, false, complete || reached(members, target, me));
  }
  /// Waits, without arriving anywhere, until each of `readers` reached `target` or returned
  /// from its kernel: before `me` rewrites a staged copy that a point-to-point collective let
  /// them read (they are done once they arrived at their next collective). Throws as
  /// arrive_and_wait does.
  void await_readers(int me, std::span<const int> readers, std::uint64_t target);
  /// Leaves a collective that `me` abandons by an exception after publishing its buffers:
  /// goes on arriving at the collective's barriers [first, last] without doing its work,
  /// each time until every member arrived there too or returned from its kernel, so that no
  /// peer still reads the buffers when the caller unwinds and frees them. Ignores
  /// cancellation (every member drains the same way); returns early only when no local
  /// device is left running at all (then nobody can be reading).
  void drain(int me, std::span<const int> members, std::uint64_t first, std::uint64_t last,
             bool point_to_point = false) noexcept;
  /// Checks that every member published the same collective signature as `me` (for a staged
  /// collective, copy >= 0: the signature of that copy).
  void check_agreement(int me, std::span<const int> members, std::uint64_t target,
                       int copy = -1) const;

  /// Device `me` starts running on the calling thread.
  void start(int me) {
    slot(me).runner.store(&this_thread().tag, std::memory_order_relaxed);
    slot(me).start_history();
  }
  /// The kernel of `me` returned (normally or not): peers waiting on it learn so.
  void finish(int me);
  /// Records the first failure and wakes every waiting device, which then throws Cancelled.
  /// Returns true if this was the first failure.
  bool fail(std::exception_ptr error, int member = -1);
  /// Global id of the device that failed first (-1 if none).
  int error_device() const { return error_device_; }
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  /// The first failure, or nullptr. Read under the lock: a nested call's team can still be
  /// cancelled by its parent (fail() of the outer team) after this device's inner call joined.
  std::exception_ptr error() const {
    if (!cancelled()) return nullptr;
    std::lock_guard<SpinLock> guard(lock_);
    return error_;
  }

  // ---- teams that span processes (MPI) --------------------------------------------------
  bool distributed() const { return local_count_ != size_; }
  std::span<const int> local_members() const { return local_members_; }
  int local_leader() const { return local_begin_; }
  /// Leader only: the exchange of a collective with the other processes (ProcessExchange):
  /// every local member's input (`bytes` each), read by gathered(), or the reduction of `in`
  /// (true: the caller combines contribution(p) of every process p into `out`).
  void exchange_gather(int me, std::size_t bytes) {
    exchange_.gather(slot(me), &slot(local_begin_), local_count_, bytes);
  }
  bool exchange_reduce(int me, const void* in, void* out, std::size_t count, mpi::DType dtype,
                       mpi::ReduceOp op) {
    return exchange_.reduce(slot(me), in, out, count, dtype, op);
  }
  const unsigned char* contribution(int process) const { return exchange_.contribution(process); }
  /// After the exchange: every local member throws the leader's exchange failure, if any.
  void raise_if_exchange_failed(int me) const {
    if (exchange_.failed()) throw RemoteFailure(device_id(me), exchange_.error(slot(me)));
  }
  /// After exchange_gather(): member `member`'s input, `bytes` long.
  const unsigned char* gathered(int member, std::size_t bytes) const {
    return exchange_.gathered(member, bytes);
  }

  /// Nested pmap, leader of the nesting rendezvous only: creates the child team of outer x
  /// inner devices. A child of a cancelled team starts cancelled, and fail() cancels the
  /// current child, so that inner devices never wait for peers whose outer device left.
  void make_child(int size, std::span<const AxisBinding> axes, std::vector<int> device_ids,
                  int num_threads);
  /// The child team of the current nesting rendezvous (after its second barrier).
  std::shared_ptr<Team> child() const { return child_; }

 private:
  bool reached(std::span<const int> members, std::uint64_t target, int me);
  /// The wait of arrive_and_wait and await_arrival: spins, yields or suspends until `members`
  /// reached `target` (`complete`: they had when `me` arrived).
  void wait_for(int me, std::span<const int> members, std::uint64_t target, bool point_to_point,
                bool complete);
  /// The members short of `target`: all running (or about to start) on other threads than
  /// the caller's; some resumed and waiting for a thread, the others running elsewhere; or
  /// some suspended or queued on the caller's thread.
  enum class Awaited { running, resuming, blocked };
  Awaited awaited(std::span<const int> members, std::uint64_t target) const;
  void wake(std::span<const int> members);
  /// Resumes the members suspended in a point-to-point wait for `me` (Slot::awaits).
  void wake_awaiting(int me);
  /// After `me` stored a new phase: wakes whoever awaits it alone.
  void announce(int me) {
    if (slot(me).awaited_by.load(std::memory_order_seq_cst) > 0) wake_awaiting(me);
  }
  /// In a point-to-point wait, under the lock: records in `mine` the member it awaits, or
  /// returns false when none of `members` is short of `target` any more.
  bool await_one(Slot& mine, std::span<const int> members, std::uint64_t target);
  void wake_all_locked();
  void resume_locked(Slot& s);
  int count_finished() const;
  /// What a suspended device waits for: every member at the barrier (reached()); every member
  /// there or returned, while draining (drained(); no local device left running: return
  /// false, not an error); the readers of a staged copy (await_readers: also drained()).
  enum class Wait { barrier, drain, readers };
  /// On a fiber: lets the other ready fibers of its thread run, a few times, until the
  /// members reached `target` (true), else returns false (suspend then).
  bool yield_until(int me, std::span<const int> members, std::uint64_t target);
  /// Suspends `me` until `wait` is satisfied for the members and `target`. `point_to_point`:
  /// records which member it awaits (Slot::awaits), whose next arrival resumes it.
  bool suspend_until(int me, std::span<const int> members, std::uint64_t target, Wait wait,
                     bool point_to_point);
  /// Suspends `me`, whose Blocked scope holds the lock, until a peer resumes it.
  class Blocked;
  void suspend_locked(Slot& mine, Blocked& blocked);
  [[noreturn]] void raise_stuck(int me, std::span<const int> members, std::uint64_t target,
                                int returned) const;
  std::string describe_deadlock() const;

  int size_;
  int num_axes_ = 0;
  AxisBinding axes_[kMaxAxes];
  int strides_[kMaxAxes] = {};
  std::vector<int> device_ids_;
  std::unique_ptr<Slot[]> slots_;
  bool may_spin_;
  int local_begin_ = 0;
  int local_count_ = 0;
  std::vector<int> local_members_;
  ProcessExchange exchange_;
  std::uint64_t serial_;  // a fresh range per team (2^24 calls each), + 1 per reset()
  int nesting_ = 0;

  // Read by every device on its way out: apart from the lock's cache line.
  alignas(64) std::atomic<int> sleepers_{0};  // == blocked_, readable without the lock
  std::atomic<bool> cancelled_{false};
  std::atomic<int> calls_done_{0};  // devices whose call returned normally (last_call_done)
  alignas(64) mutable SpinLock lock_;
  int blocked_ = 0;                 // guarded by lock_
  std::exception_ptr error_;        // written once under lock_, read under it (error())
  int error_device_ = -1;
  std::shared_ptr<Team> child_;     // written under lock_ by the nesting leader
};

/// "psum over axis i on float32[3]": a collective as error messages name it.
std::string describe_op(const OpDesc& desc, std::string_view axes);
/// "device 3" or "devices [1, 2]".
std::string device_list(const std::vector<int>& ids);

/// A device's place in a team, and the per-device sequence of collectives.
struct Member {
  Team* team = nullptr;
  int index = 0;               ///< position in the team
  std::uint64_t phase = 0;     ///< phases completed by this device
  std::uint64_t staged = 0;    ///< staged collectives so far (which copy is next)
  /// Who may still read staged copy k: kNobody, kEveryone (a collective over the whole team
  /// read it) or one member (a ppermute's destination); done when it reached read_until[k],
  /// the collective two after the one that staged it: a reader completes a collective before
  /// it calls the next one, or at the latest before it starts the one after (it has at most
  /// two started collectives in flight).
  static constexpr int kNobody = -1;
  static constexpr int kEveryone = -2;
  int copy_reader[kStagedCopies] = {kNobody, kNobody, kNobody, kNobody};
  std::uint64_t read_until[kStagedCopies] = {0, 0, 0, 0};
  /// Phases of peers seen lately (a phase only grows): a copy whose reader was seen past
  /// read_until is free without reading the reader's line, which it writes at every
  /// collective. Two, for the two neighbours of a halo exchange.
  struct Seen {
    int member = -1;
    std::uint64_t phase = 0;
  };
  Seen seen[2];
  void note_seen(int member, std::uint64_t reached) {
    if (seen[1].member == member) {
      seen[1].phase = reached;
      return;
    }
    if (seen[0].member != member) seen[1] = seen[0];  // the older one goes
    seen[0] = {member, reached};
  }
  bool seen_at(int member, std::uint64_t target) const {
    return (seen[0].member == member && seen[0].phase >= target) ||
           (seen[1].member == member && seen[1].phase >= target);
  }
};

inline const void* const kSuspendedRunner = &kSuspendedRunner;
/// Resumed by a peer, waiting for a thread to continue it (any thread of the arena may).
inline const void* const kResumingRunner = &kResumingRunner;

}  // namespace pmap::detail
