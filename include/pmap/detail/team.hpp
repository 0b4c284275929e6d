/// @file team.hpp
/// @brief Where a collective meets its peers: the rendezvous engine shared by every
/// collective and by nested pmap.
///
/// A Team is the set of logical devices of one call (for a nested call: the whole grid of
/// outer x inner devices). Each device owns one Slot. A collective is a sequence of phases;
/// in each phase a device publishes "I reached phase k" in its slot and waits until every
/// member of its group has too. Buffers are published in the slot before the first phase and
/// read in place by the peers. A device that has to wait spins briefly when every device of
/// the team can hold a thread, otherwise it suspends its oneTBB task (resumable tasks), so
/// its worker thread runs other devices meanwhile.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <oneapi/tbb/spin_mutex.h>
#include <oneapi/tbb/task.h>

#include "pmap/axes.hpp"
#include "pmap/detail/distributed.hpp"
#include "pmap/errors.hpp"
#include "pmap/detail/pool.hpp"
#include "pmap/detail/tensor_traits.hpp"
#include "pmap/runtime.hpp"

namespace pmap::detail {

/// A collective could not complete because another process failed or disagreed.
class RemoteFailure : public DeviceError {
 public:
  using DeviceError::DeviceError;
};

/// Thrown inside a device whose call was cancelled by another device's failure.
/// Deliberately not a std::exception, so that kernels catching std::exception let it pass.
struct Cancelled {};

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

/// What a device is doing in a collective: enough to check that the members agree and
/// to name the collective in error messages.
/// Inputs up to this size are copied into the device's slot before a collective over the whole
/// team, alternating between two copies: peers then read the copy, not the caller's buffer,
/// and the collective needs one barrier instead of two (the one before the next such
/// collective ensures nobody still reads a copy when it is written again). Above it, peers
/// read the caller's buffer in place and a second barrier releases it.
inline constexpr std::size_t kStagedBytes = 8 * 1024;

/// A buffer a device no longer needs (a donated input, or a tensor passed to
/// Context::donate), kept in the device's slot for its next result of the same type and size:
/// a chain `v = ctx.ppermute(std::move(v), ...)` then alternates between two buffers instead
/// of mapping fresh memory for every result, also from one call to the next.
struct SpareBuffer {
  virtual ~SpareBuffer() = default;
};
template <class Tensor>
struct SpareOf final : SpareBuffer {
  explicit SpareOf(Tensor&& x) : tensor(std::move(x)) {}
  Tensor tensor;
};

struct OpDesc {
  const char* name = "";           ///< "psum"
  std::uint64_t signature = 0;     ///< kind, dtype, shape, axes, groups, parameters
  const char* dtype = "";
  Shape shape;
  int phases = 2;                  ///< barriers this collective takes
};

/// One device's place in a Team, in three groups of cache lines: what the peers read on every
/// collective (the phase word they poll, and the signature and buffers published before the
/// first phase: the poll that sees the new phase brings them along in the same line transfer);
/// what only error messages read; and the suspension state.
struct alignas(64) Slot {
  std::atomic<std::uint64_t> phase{0};  ///< phases this device has completed
  std::atomic<bool> finished{false};    ///< the kernel returned (or was cancelled)
  /// The thread running this device (its thread_tag), kSuspendedRunner while suspended,
  /// kResumingRunner once resumed until a thread continues it, nullptr before it starts: a
  /// waiting peer spins only while that can help.
  std::atomic<const void*> runner{nullptr};
  // Published before the first phase of a collective, read by peers after it.
  std::atomic<std::uint64_t> signature{0};
  const void* in = nullptr;
  void* out = nullptr;
  /// Signature of the staged collective whose copy is staging->bytes[k] (with its ordinal).
  std::atomic<std::uint64_t> staged_signature[2] = {0, 0};
  alignas(64) const void* extra = nullptr;
  OpDesc desc;
  char axes[64] = {};
  /// Two copies of small inputs (see kStagedBytes), allocated on first use by the owner.
  struct alignas(64) Staging {
    unsigned char bytes[2][kStagedBytes];
  };
  std::unique_ptr<Staging> staging;
  /// The owner's spare buffers, oldest first (Access::keep_spare). They outlive the call:
  /// a Team is kept by its Mapped for the next call with the same devices.
  std::vector<std::unique_ptr<SpareBuffer>> spares;
  // Guarded by Team::lock_.
  alignas(64) bool suspended = false;
  tbb::task::suspend_point resume_point = nullptr;
  std::atomic<bool> awake{false};  ///< PMAP_DEVICE_THREADS: the blocked thread may go on
  bool waiting = false;  ///< inside Team::wait (for error messages)
  // Owner only (Team::arrive_and_wait, when devices may spin).
  std::chrono::steady_clock::time_point departed{};  ///< left its previous barrier
  std::chrono::steady_clock::duration phase_length{};  ///< average time between barriers
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
  int num_axes() const { return num_axes_; }
  const AxisBinding& axis(int a) const { return axes_[a]; }
  /// Index of member `m` along axis `a`.
  int index_on(int m, int a) const { return (m / strides_[a]) % axes_[a].size; }
  int stride(int a) const { return strides_[a]; }
  int device_id(int m) const { return device_ids_[static_cast<std::size_t>(m)]; }
  Slot& slot(int m) { return slots_[static_cast<std::size_t>(m)]; }
  const Slot& slot(int m) const { return slots_[static_cast<std::size_t>(m)]; }

  /// Phase k of the current collective of `me`: publish, wake waiting peers, wait until every
  /// member reached it. Throws Cancelled if another device failed, DeviceError (E14) if a
  /// member returned from its kernel or called a different collective.
  void arrive_and_wait(int me, std::span<const int> members, std::uint64_t target);
  /// Leaves a collective that `me` abandons by an exception after publishing its buffers:
  /// goes on arriving at the collective's barriers [first, last] without doing its work,
  /// each time until every member arrived there too or returned from its kernel, so that no
  /// peer still reads the buffers when the caller unwinds and frees them. Ignores
  /// cancellation (every member drains the same way); returns early only when no local
  /// device is left running at all (then nobody can be reading).
  void drain(int me, std::span<const int> members, std::uint64_t first,
             std::uint64_t last) noexcept;
  /// Checks that every member published the same collective signature as `me` (for a staged
  /// collective, parity >= 0: the signature of that copy).
  void check_agreement(int me, std::span<const int> members, std::uint64_t target,
                       int parity = -1) const;

  /// The kernel of `me` returned (normally or not): peers waiting on it learn so.
  void finish(int me);
  /// Records the first failure and wakes every waiting device, which then throws Cancelled.
  /// Returns true if this was the first failure.
  bool fail(std::exception_ptr error, int member = -1);
  /// Global id of the device that failed first (-1 if none).
  int error_device() const { return error_device_; }
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  std::exception_ptr error() const { return error_; }

  // ---- teams that span processes (MPI) --------------------------------------------------
  bool distributed() const { return local_count_ != size_; }
  std::span<const int> local_members() const { return local_members_; }
  int local_leader() const { return local_begin_; }
  /// Leader only: header round, then every member's input (`bytes` each) into gathered().
  void exchange_gather(int me, std::size_t bytes);
  /// Leader only: header round, then an in-place MPI allreduce of `data`.
  void exchange_reduce(int me, void* data, std::size_t count, mpi::DType dtype, mpi::ReduceOp op);
  /// After the exchange: every local member throws the leader's exchange failure, if any.
  void raise_if_exchange_failed(int me) const;
  const unsigned char* gathered() const { return gathered_.data(); }

  /// Nested pmap, leader of the nesting rendezvous only: creates the child team of outer x
  /// inner devices. A child of a cancelled team starts cancelled, and fail() cancels the
  /// current child, so that inner devices never wait for peers whose outer device left.
  void make_child(int size, std::span<const AxisBinding> axes, std::vector<int> device_ids,
                  int num_threads);
  /// The child team of the current nesting rendezvous (after its second barrier).
  std::shared_ptr<Team> child() const { return child_; }

 private:
  bool reached(std::span<const int> members, std::uint64_t target, int me);
  /// Every member arrived at `target` or returned from its kernel (Team::drain).
  bool drained(std::span<const int> members, std::uint64_t target) const;
  /// The members short of `target`: all running (or about to start) on other threads than
  /// the caller's; some resumed and waiting for a thread, the others running elsewhere; or
  /// some suspended or queued on the caller's thread.
  enum class Peers { running, resuming, blocked };
  Peers awaited_peers(std::span<const int> members, std::uint64_t target) const;
  void wake(std::span<const int> members);
  void wake_all_locked();
  void resume_locked(Slot& s);
  int count_finished() const;
  /// Suspends `me` until the members reached `target`. While draining: until drained(), and
  /// returns false instead of throwing when no local device is left running.
  bool suspend_until(int me, std::span<const int> members, std::uint64_t target,
                     bool draining = false);
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
  std::vector<unsigned char> send_, gathered_;  // written by the local leader only
  std::string exchange_error_;

  // Read by every device on its way out: apart from the lock's cache line.
  alignas(64) std::atomic<int> sleepers_{0};  // == blocked_, readable without the lock
  std::atomic<bool> cancelled_{false};
  alignas(64) tbb::spin_mutex lock_;
  int blocked_ = 0;                 // guarded by lock_
  std::exception_ptr error_;        // written once under lock_, read after the join
  int error_device_ = -1;
  std::shared_ptr<Team> child_;     // written under lock_ by the nesting leader
};

/// A device's place in a team, and the per-device sequence of collectives.
struct Member {
  Team* team = nullptr;
  int index = 0;               ///< position in the team
  std::uint64_t phase = 0;     ///< phases completed by this device
  std::uint64_t staged = 0;    ///< staged collectives so far (which copy is next)
};

/// One byte per thread: its address tells threads apart (Slot::runner).
inline thread_local char thread_tag = 0;
inline const void* const kSuspendedRunner = &kSuspendedRunner;
/// Resumed by a peer, waiting for a thread to continue it (any thread of the arena may).
inline const void* const kResumingRunner = &kResumingRunner;

/// The device the current fiber runs (nullptr outside of kernels). Kept fiber-correct:
/// devices set and restore it around their kernel, Team restores it after a suspension.
inline thread_local void* current_device = nullptr;

}  // namespace pmap::detail
