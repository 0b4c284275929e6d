/// @file slot.hpp
/// @brief One device's place in a Team: what its peers read, what error messages read, what
/// only the device itself touches, and its suspension state.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include "pmap/detail/fibers.hpp"
#include "pmap/detail/shape.hpp"

namespace pmap::detail {

/// Inputs up to this size are copied into the device's slot before a collective over the whole
/// team, in turn into one of kStagedCopies copies: peers then read the copy, not the caller's
/// buffer, and the collective needs one barrier instead of two (a device rewrites a copy only
/// once whoever may read it reached the collective two after it: see Member::read_until).
/// Above it, peers read the caller's buffer in place and a second barrier releases it.
inline constexpr std::size_t kStagedBytes = 8 * 1024;
/// Staged copies per device: a device has at most two started collectives in flight
/// (Access::make_room), so that a peer that reached its collective two after one of them is
/// done reading that one's copy; four copies let a device run that far ahead of its readers
/// before it waits for them.
inline constexpr int kStagedCopies = 4;
/// Staged inputs up to this size (a halo point, a scalar) are copied into one cache line of
/// the slot that holds all kStagedCopies of them, next to the phase's line: the two
/// ppermutes of a halo exchange then reach their destination in one line transfer, not two.
inline constexpr std::size_t kSmallStagedBytes = 16;

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

/// What a device is doing in a collective, for error messages.
struct OpDesc {
  const char* name = "";  ///< "psum"
  const char* dtype = "";
  Shape shape;
};

/// An OpDesc as a collective passes it to be published: its shape by reference, not copied
/// (a shape is kMaxRank dimensions, most of them past the rank).
struct OpDescRef {
  const char* name;
  const char* dtype;
  const Shape& shape;
  OpDescRef(const char* n, const char* t, const Shape& s) : name(n), dtype(t), shape(s) {}
  OpDescRef(const OpDesc& d) : name(d.name), dtype(d.dtype), shape(d.shape) {}  // NOLINT
};

/// to = from, but for the dimensions past the rank, which nobody reads (a staged collective
/// describes itself twice per call: Slot::describe, Slot::describe_staged).
inline void copy_desc(OpDesc& to, const OpDescRef& from) {
  to.name = from.name;
  to.dtype = from.dtype;
  to.shape.rank = from.shape.rank;
  std::copy_n(from.shape.dims.begin(), from.shape.rank, to.shape.dims.begin());
}

/// A collective that not every member of its group compared when they met (a ppermute,
/// pshuffle or pbroadcast over the whole team, which waits for its source alone), as E14
/// names it when the devices of a call turn out to have called different ones
/// (check_same_collectives): its description, kept once per distinct collective of a call.
struct TrailOp {
  std::uint64_t signature = 0;
  OpDesc desc;
  char axes[32] = {};
};
/// One unchecked collective of a call: where it was in the device's sequence, its signature
/// and its description (an index into Slot::trail_ops). 24 bytes: a stencil's loop adds one
/// per ppermute, so that the description of each (a Shape) is not copied each time.
struct TrailEntry {
  std::uint64_t position = 0;  ///< how many collectives the device called before it
  std::uint64_t signature = 0;
  std::uint32_t op = 0;
};

/// A device keeps its first this many unchecked collectives of a call (TrailEntry); past
/// them, only their signatures' hash (Slot::history) tells the devices apart.
inline constexpr std::size_t kTrailEntries = 4096;

/// One device's place in a Team, in cache lines by who touches them: what the peers read on
/// every collective (the phase word they poll, and the signature and buffers published before
/// the first phase: the poll that sees the new phase brings them along in the same line
/// transfer; the small staged copies in the next line; the in-place buffers and awaited_by,
/// which the owner reads at every arrival, in a third); what only error messages read; what
/// only the owner uses; and the suspension state, guarded by the team's lock.
struct alignas(128) Slot {
  // ---- read by peers ------------------------------------------------------------------------
  std::atomic<std::uint64_t> phase{0};  ///< phases this device has completed
  std::atomic<bool> finished{false};    ///< the kernel returned (or was cancelled)
  /// The thread running this device (its ThreadState::tag), kSuspendedRunner while suspended,
  /// kResumingRunner once resumed until a thread continues it, nullptr before it starts: a
  /// waiting peer spins only while that can help.
  std::atomic<const void*> runner{nullptr};
  /// Of the collective published last (Team::publish), read by peers after its first phase.
  std::atomic<std::uint64_t> signature{0};
  /// Signature of the staged collective whose copy is staged_copy(k) (with its ordinal), in
  /// the phase's line: the poll that sees a staged collective arrive brings it along.
  std::atomic<std::uint64_t> staged_signature[kStagedCopies] = {0, 0, 0, 0};
  /// The staged copies of inputs up to kSmallStagedBytes (stage()).
  alignas(64) unsigned char small_copies[kStagedCopies][kSmallStagedBytes] = {};
  /// The buffers of an in-place collective (above kStagedBytes: one more line is nothing).
  alignas(64) const void* in = nullptr;
  void* out = nullptr;
  /// Peers suspended until this device arrives anywhere (Slot::awaits): its arrival wakes
  /// them. Read by the device at every arrival, so not in the phase's line, which a waiting
  /// peer polls: the read would wait for the line to come back.
  std::atomic<int> awaited_by{0};

  const void* published_in() const { return in; }
  void* published_out() const { return out; }
  /// Staged copy `copy` of an input `bytes` long.
  const unsigned char* staged_copy(int copy, std::size_t bytes) const {
    return bytes <= kSmallStagedBytes ? small_copies[copy] : staged_->bytes[copy];
  }

  // ---- read by error messages -------------------------------------------------------------
  /// staged_desc[k] describes copy k's collective (a started one), in desc's line.
  alignas(64) std::atomic<bool> staged_desc_valid[kStagedCopies] = {false, false, false, false};
  OpDesc desc;
  char axes[64] = {};
  /// Of a tree collective (desc.dtype "tree"): its leaf count and the signatures of its
  /// first kDescribedLeaves leaves, depth first, so that E14 names the first leaf in which
  /// two trees differ.
  static constexpr int kDescribedLeaves = 16;
  int leaf_count = 0;
  std::uint64_t leaf_signatures[kDescribedLeaves] = {};
  /// Describes collective `sig`, unless desc describes it already: a loop that calls
  /// one collective again does not rewrite what only error messages read.
  void describe(const OpDescRef& d, std::string_view axis_label, std::uint64_t sig) {
    if (sig == described_as && d.name == desc.name) return;
    described_as = sig;
    copy_desc(desc, d);
    const std::size_t len = std::min(axis_label.size(), sizeof(axes) - 1);
    std::memcpy(axes, axis_label.data(), len);
    axes[len] = '\0';
  }
  /// The started collective of each copy, as E14 names it: a device with collectives in
  /// flight has published later ones (desc) by the time a peer compares an older one. Not
  /// valid (staged_desc_valid) for a blocking one, which desc describes until the device
  /// calls the next.
  struct StagedDesc {
    OpDesc desc;
    char axes[32] = {};
    int leaf_count = 0;  ///< of a tree, as leaf_count and leaf_signatures
    std::uint64_t leaf_signatures[kDescribedLeaves] = {};
  };
  StagedDesc staged_desc[kStagedCopies];
  /// The signatures of the collectives that desc and staged_desc describe (written by the
  /// owner only).
  std::uint64_t described_as = 0;
  std::uint64_t staged_described_as[kStagedCopies] = {};
  void describe_staged(int copy, const OpDescRef& d, std::string_view axis_label,
                       std::uint64_t sig) {
    StagedDesc& s = staged_desc[copy];
    if (sig == staged_described_as[copy] && d.name == s.desc.name &&
        staged_desc_valid[copy].load(std::memory_order_relaxed))
      return;
    staged_described_as[copy] = sig;
    staged_desc_valid[copy].store(true, std::memory_order_relaxed);
    copy_desc(s.desc, d);
    const std::size_t len = std::min(axis_label.size(), sizeof(s.axes) - 1);
    std::memcpy(s.axes, axis_label.data(), len);
    s.axes[len] = '\0';
    if (std::strcmp(d.dtype, "tree") == 0) {  // describe_tree() wrote the leaves just before
      s.leaf_count = leaf_count;
      std::copy_n(leaf_signatures, std::min(leaf_count, kDescribedLeaves), s.leaf_signatures);
    }
  }

  // ---- the owner's --------------------------------------------------------------------------
  /// Copies `bytes` of `in` into copy `copy` (see kStagedBytes), allocated on first use.
  void stage(int copy, const void* data, std::size_t bytes) {
    if (bytes == 0) return;
    if (bytes <= kSmallStagedBytes) {
      std::memcpy(small_copies[copy], data, bytes);
      return;
    }
    if (!staged_) staged_ = std::make_unique<StagedCopies>();
    std::memcpy(staged_->bytes[copy], data, bytes);
  }
  /// The owner's spare buffers, oldest first (Access::keep_spare). They outlive the call:
  /// a Team is kept by its Mapped for the next call with the same devices.
  std::vector<std::unique_ptr<SpareBuffer>> spares;
  /// Left its previous barrier, when that phase is timed (Team::wait_for samples phases).
  std::chrono::steady_clock::time_point departed{};
  std::chrono::steady_clock::duration phase_length{};  ///< average time between barriers
  std::uint32_t phases_left = 0;  ///< phases it left; Team::wait_for times one in 16
  /// Arrived by Team::arrive_posted since its last fence (Team::settle).
  bool unsettled = false;
  /// Tracing: "i=3" or "x=1,y=0", written by the device when its first traced kernel starts.
  char trace_coordinates[48] = {};
  /// Phases completed when the kernel returned normally (Member::phase): the devices of a
  /// call compare them afterwards (check_same_collectives).
  std::uint64_t final_phase = 0;
  /// This call's unchecked collectives (Team::record_unread): their positions and signatures
  /// folded in call order, and the first kTrailEntries of them (TrailEntry). The devices
  /// compare them when the call ends.
  std::uint64_t history = 0;
  std::vector<TrailEntry> trail;
  std::vector<TrailOp> trail_ops;
  bool trail_full = false;
  void start_history() {
    history = 0;
    trail.clear();
    trail_ops.clear();
    trail_full = false;
  }
  void note_unchecked(std::uint64_t position, std::uint64_t sig, const OpDescRef& d,
                      std::string_view axis_label) {
    if (trail.size() == kTrailEntries) {
      trail_full = true;
      return;
    }
    trail.push_back({position, sig, describe_unchecked(sig, d, axis_label)});
  }
  const TrailOp& trail_op(const TrailEntry& e) const { return trail_ops[e.op]; }

  // ---- suspension, guarded by Team::lock_ ---------------------------------------------------
  alignas(64) bool suspended = false;
  /// Suspended in a point-to-point wait (a ppermute's source, a staged copy's reader): the
  /// member whose next arrival resumes it; -1 in a barrier, which its last arrival completes.
  int awaits = -1;
  fibers::Fiber* fiber = nullptr;  ///< the suspended device's fiber
  std::atomic<bool> awake{false};  ///< PMAP_DEVICE_THREADS: the blocked thread may go on

 private:
  struct alignas(64) StagedCopies {
    unsigned char bytes[kStagedCopies][kStagedBytes];
  };
  std::unique_ptr<StagedCopies> staged_;

  /// The index of collective `sig`'s description in trail_ops: one of the last few kept, or
  /// a new one (a loop calls a few distinct collectives many times).
  std::uint32_t describe_unchecked(std::uint64_t sig, const OpDescRef& d,
                                   std::string_view axis_label) {
    constexpr std::size_t kRecent = 8;
    const std::size_t n = trail_ops.size();
    for (std::size_t k = n; k > 0 && k + kRecent > n; --k)
      if (trail_ops[k - 1].signature == sig) return static_cast<std::uint32_t>(k - 1);
    TrailOp& op = trail_ops.emplace_back();
    op.signature = sig;
    copy_desc(op.desc, d);
    const std::size_t len = std::min(axis_label.size(), sizeof(op.axes) - 1);
    std::memcpy(op.axes, axis_label.data(), len);
    return static_cast<std::uint32_t>(n);
  }
};

}  // namespace pmap::detail
