/// @file rendezvous.hpp
/// @brief Where a collective meets its peers: the one engine under every collective.
///
/// A collective works as follows. The device describes it (a Collective: kind, dtype,
/// shape, parameters, its input and output buffers) and publishes that in its team slot:
/// the signature its peers compare, the buffers they read. It then meets its group at a
/// barrier (Team::arrive_and_wait), checks that every member published the same signature
/// (E14 otherwise), and runs the collective's work: a few lines of data movement over a
/// Peers view, `input(k)` and `output(k)` of member k and `sync()` between two steps. A last
/// barrier tells it that nobody reads its buffers any more, and it returns.
///
/// The engine picks one of three paths, the same on every member of a group (they agree on
/// the signature, which decides it):
/// - staged: small inputs of a collective over the whole team are copied into the slot, one
///   of two copies by parity; peers read the copy, so the one barrier before the work is
///   the only one (the next staged collective's barrier keeps a copy from being rewritten
///   while it is read). A collective in which each device reads one peer (ppermute,
///   pshuffle, pbroadcast) waits for that peer alone instead of a barrier, and a device that
///   rewrites a copy such a collective let a peer read first waits for that reader
///   (await_copy_readers);
/// - in place: peers read the caller's buffers; 2 barriers, plus one per sync();
/// - gathered: across processes, the local devices meet, their leader exchanges every input
///   with the other processes in one MPI call, and each device reads what it needs from the
///   gathered copy (reductions over the whole team take the hierarchical reduction of
///   reductions.hpp instead, over the same Meeting).
///
/// Whatever the path, every collective advances the phases by kPhasesPerCollective, and a
/// device that leaves by an exception drains the barriers first (Meeting::run).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <span>
#include <utility>

#include "pmap/detail/assert.hpp"
#include "pmap/context.hpp"
#include "pmap/detail/op_kind.hpp"
#include "pmap/detail/shape.hpp"
#include "pmap/detail/team.hpp"
#include "pmap/detail/tensor_traits.hpp"

namespace pmap::detail {

/// Signature of a collective: kind, dtype, shape and the collective's own parameters.
std::uint64_t op_signature(OpKind kind, const char* dtype, const Shape& shape,
                           std::initializer_list<std::int64_t> params);

/// What one device calls: everything the engine needs to publish it and meet its peers.
struct Collective {
  const char* name = "";        ///< "psum"
  std::uint64_t signature = 0;  ///< op_signature(); the group's is added by the engine
  const char* dtype = "";
  Shape shape;                  ///< of the input
  std::size_t bytes = 0;        ///< of the input
  const void* in = nullptr;
  void* out = nullptr;
  int steps = 1;  ///< steps of the in-place work: it calls Peers::sync() steps - 1 times
  /// `in` points at other buffers the peers read too (a tree's table of leaves): never
  /// staged, whatever its size.
  bool in_place = false;
  /// A collective in which each device reads one peer's input (ppermute, pshuffle,
  /// pbroadcast): the group position of the one it reads (`source`) and of the one that
  /// reads it (`reader`), -1 for nobody, kWholeGroup for every member (pbroadcast's source
  /// is read by all). Staged, such a collective waits for its source alone.
  static constexpr int kWholeGroup = -2;
  int source = kWholeGroup;
  int reader = kWholeGroup;
};

/// Describes a collective of `name` and `kind` over an input of scalar T.
template <class T>
Collective describe(const char* name, OpKind kind, const Shape& shape,
                    std::initializer_list<std::int64_t> params, const T* in, void* out,
                    int steps = 1) {
  return Collective{name,  op_signature(kind, dtype_name<T>(), shape, params),
                    dtype_name<T>(), shape, static_cast<std::size_t>(shape.size()) * sizeof(T),
                    in,    out,
                    steps};
}

/// The base of a collective's leaf class (data_movement.hpp, reductions.hpp, trees.hpp):
/// the Collective the leaf describes, set once by its constructor, which a tree reads leaf
/// by leaf (input, bytes, signature) and a lone leaf hands to the engine.
class Described {
 public:
  const Collective& describe() const { return described_; }
  const void* input() const { return described_.in; }
  std::size_t bytes() const { return described_.bytes; }
  std::uint64_t signature() const { return described_.signature; }

 protected:
  Described() = default;
  ~Described() = default;
  Described(const Described&) = delete;
  Described& operator=(const Described&) = delete;
  Collective described_;
};

/// The parameters of a collective that has a tiled and an untiled form, the same for every
/// leaf of a tree: its group and its axes (all_gather: `axis`; psum_scatter: `axis`, the
/// scatter dimension; all_to_all: `axis` split, `concat_axis` concatenated). Leaf<X> is the
/// collective over one operand of type X.
template <template <bool, class> class LeafT, bool Tiled>
struct AxesOp {
  const GroupInfo* g;
  int axis;
  int concat_axis = 0;
  template <class X>
  using Leaf = LeafT<Tiled, X>;
};

/// One device's part in one collective: the members it meets and the barriers so far. Every
/// path is a sequence of meet() calls and work, run by run().
class Meeting {
 public:
  /// @param point_to_point `members` are the peers `me` reads, not its group
  /// (Team::arrive_and_wait).
  Meeting(Member& me, std::span<const int> members, int phases, bool point_to_point = false)
      : team_(*me.team),
        me_(me.index),
        members_(members),
        base_(me.phase),
        phases_(phases),
        point_to_point_(point_to_point) {
    PMAP_ASSERT(phases >= 1 && phases <= static_cast<int>(kPhasesPerCollective));
    me.phase = base_ + kPhasesPerCollective;  // whichever path this is
  }
  Meeting(const Meeting&) = delete;
  Meeting& operator=(const Meeting&) = delete;

  /// The collective's next barrier.
  void meet() {
    PMAP_ASSERT(met_ < phases_);
    team_.arrive_and_wait(me_, members_, base_ + static_cast<std::uint64_t>(++met_),
                          point_to_point_);
  }
  /// After the first barrier: every member published this collective (E14 otherwise); for a
  /// staged collective, parity >= 0 names its copy.
  void check(int parity = -1) const { team_.check_agreement(me_, members_, base_ + 1, parity); }

  /// Runs body(), then the barriers it left. Leaving by an exception, first drains them
  /// (Team::drain) outside the handler: a drain may suspend, which a handler must not.
  template <class Body>
  void run(Body&& body) {
    std::exception_ptr failure;
    try {
      body();
      while (met_ < phases_) meet();
    } catch (...) {
      failure = std::current_exception();
    }
    if (failure) {
      team_.drain(me_, members_, base_ + 1, base_ + static_cast<std::uint64_t>(phases_),
                  point_to_point_);
      std::rethrow_exception(failure);
    }
  }

  Team& team() const { return team_; }

 private:
  Team& team_;
  int me_;
  std::span<const int> members_;
  std::uint64_t base_;
  int phases_;
  bool point_to_point_;
  int met_ = 0;
};

/// The engine's paths (see the top of this file).
enum class Path { staged, in_place, gathered };

/// What a collective's work sees of its group, untyped: member k's input and output, and
/// sync() between two steps. Peers<T> is the typed view the collectives' work reads.
class PeerSet {
 public:
  /// `meeting`: of the in-place path, whose sync() is a barrier of it; `copy`: of the staged
  /// path, the peers' copy.
  PeerSet(Meeting* meeting, const Team& team, const GroupInfo& g, Path path, int copy,
          std::size_t bytes)
      : PeerSet(meeting, team, g.members, g.position, path, copy, bytes) {}
  /// `members`: the group in group order, `position`: this device's in it.
  PeerSet(Meeting* meeting, const Team& team, std::span<const int> members, int position,
          Path path, int copy, std::size_t bytes)
      : meeting_(meeting), team_(team), members_(members), position_(position), path_(path),
        copy_(copy), bytes_(bytes) {}

  int size() const { return static_cast<int>(members_.size()); }
  /// This device's position in the group.
  int position() const { return position_; }
  const void* input(int k) const {
    const Slot& s = team_.slot(member(k));
    switch (path_) {
      case Path::staged:
        return s.staged_copy(copy_, bytes_);
      case Path::gathered:
        return team_.gathered(member(k), bytes_);
      case Path::in_place:
        break;
    }
    return s.published_in();
  }
  /// Member k's result buffer (in place only: a split reduction copies its peers' chunks).
  const void* output(int k) const {
    PMAP_ASSERT(path_ == Path::in_place);
    return team_.slot(member(k)).published_out();
  }
  /// Gathered path only: the input of team member m, of any group (the exchange carried
  /// every device's), and the number of team members.
  const void* team_input(int m) const {
    PMAP_ASSERT(path_ == Path::gathered);
    return team_.gathered(m, bytes_);
  }
  int team_size() const { return team_.size(); }
  /// A barrier between two steps of the work (in place only).
  void sync() {
    PMAP_ASSERT(path_ == Path::in_place && meeting_ != nullptr);
    meeting_->meet();
  }

 private:
  int member(int k) const { return members_[static_cast<std::size_t>(k)]; }

  Meeting* meeting_;
  const Team& team_;
  std::span<const int> members_;
  int position_;
  Path path_;
  int copy_;
  std::size_t bytes_;
};

/// A PeerSet whose inputs are arrays of T.
template <class T>
class Peers {
 public:
  explicit Peers(PeerSet& set) : set_(set) {}
  int size() const { return set_.size(); }
  int position() const { return set_.position(); }
  const T* input(int k) const { return static_cast<const T*>(set_.input(k)); }
  const void* output(int k) const { return set_.output(k); }
  const T* team_input(int m) const { return static_cast<const T*>(set_.team_input(m)); }
  int team_size() const { return set_.team_size(); }
  void sync() { set_.sync(); }

 private:
  PeerSet& set_;
};

/// A collective's work over its peers, by reference and type-erased: the engine's paths are
/// compiled once, in the library (src/rendezvous.cpp), not for every collective of a program.
class PeerWork {
 public:
  template <class F>
  explicit PeerWork(const F& f)
      : f_(&f), call_([](const void* g, PeerSet& peers) { (*static_cast<const F*>(g))(peers); }) {}
  void operator()(PeerSet& peers) const { call_(f_, peers); }

 private:
  const void* f_;
  void (*call_)(const void*, PeerSet&);
};

/// Runs collective `c` of `me` over group `g` on the path the engine chooses (the same on
/// every member: see the top of this file): publish, meet, work(peers), meet; while a trace
/// records, as one slice of the device's track.
void meet_peers(Member& me, const GroupInfo& g, const Collective& c, PeerWork work);

/// A staged point-to-point collective (a ppermute, pshuffle or pbroadcast of at most
/// kStagedBytes over the whole team, in one process) between its two halves. Posted: its input
/// is in its staged copy and its arrival published, so that the device that reads it can go
/// on; completed: the device waited for its own source and checked that it posted the same
/// collective (E14). A blocking one is both halves at once; a started one (SPEC 11) is posted
/// when it starts and completed when the device waits for it.
struct Posted {
  std::uint64_t base = 0;  ///< the device's phases before it
  int copy = 0;            ///< its staged copy, and its source's
  int source = -1;         ///< the team member whose copy it reads; -1: none
};
/// Whether a point-to-point collective of `me` over `g` whose input is `bytes` long can be
/// posted (it takes the staged path).
bool can_post(const Member& me, const GroupInfo& g, std::size_t bytes);
/// The first half of point-to-point collective `c` (can_post) of `me` over `g`; `started`: by a *_start
/// member, so that later collectives may be published before it completes.
Posted post(Member& me, const GroupInfo& g, const Collective& c, bool started);
/// Whether complete(posted) would not wait: its source arrived (or returned without it).
bool arrived(const Member& me, const Posted& posted);
/// The second half of `posted`, whose input is `bytes` long: the copy of the source once it
/// posted the same collective (nullptr without a source). Throws as a collective does
/// (Cancelled, E14).
const void* complete(Member& me, const Posted& posted, std::size_t bytes);

/// A staged collective over the whole team (a psum, all_gather, psum_scatter or all_to_all
/// of at most kStagedBytes per member, in one process), started (SPEC 11), between its two
/// halves. Posted: its input is in its staged copy and its arrival at the collective's one
/// barrier published, without waiting there, so that its peers need not wait for this
/// device to reach its wait(); completed: the device waited until every member arrived,
/// checked that they posted the same collective (E14) and ran the work over their copies. The
/// blocking collective is both halves at once (the staged path of meet_peers), with the same
/// copies, checks and work and one arrive_and_wait for the barrier.
struct PostedGroup {
  std::uint64_t base = 0;        ///< the device's phases before it
  int copy = 0;                  ///< its staged copy, and every member's
  std::span<const int> members;  ///< the group in group order (kept by the caller)
  int position = 0;              ///< this device's position in it
  bool complete = false;         ///< its arrival completed the barrier: no member to wait for
};
/// The first half of staged collective `c` (can_post, over the whole team) of `me` over `g`,
/// whose members in group order are `members`: the same as g.members, kept by the caller
/// until the collective completes (the device's group lookup is rewritten by later ones).
PostedGroup post_group(Member& me, const GroupInfo& g, const Collective& c,
                       std::span<const int> members);
/// Whether complete(posted) would not wait: every member arrived (or returned without it).
bool arrived(const Member& me, const PostedGroup& posted);
/// The second half of `posted`, whose inputs are `bytes` long: work(peers) over the members'
/// copies once every one posted the same collective. Throws as a collective does (Cancelled,
/// E14).
void complete(Member& me, const PostedGroup& posted, std::size_t bytes, PeerWork work);

/// Runs meet(), the whole of collective `c` of `me` over `g` on `path`; while a trace
/// records, as one slice of the device's track (also when it ends by an exception).
template <class Meet>
void traced(Member& me, const GroupInfo& g, const Collective& c, Path path, Meet&& meet) {
  if (!tracing::recording()) [[likely]] {
    meet();
    return;
  }
  const std::int64_t begin = tracing::now();
  const tracing::CollectiveEvent event{c.name, g.axis_label, static_cast<int>(g.members.size()),
                                       g.position, g.members.front(), c.bytes,
                                       static_cast<int>(path), me.phase};
  try {
    meet();
  } catch (...) {
    tracing::collective(*me.team, me.index, event, begin);
    throw;
  }
  tracing::collective(*me.team, me.index, event, begin);
}

/// Runs collective `c` of this device over group `g`: publish, meet, work(peers), meet.
template <class T, class Work>
void rendezvous(Context& ctx, const GroupInfo& g, const Collective& c, Work&& work) {
  const auto typed = [&work](PeerSet& set) {
    Peers<T> peers(set);
    work(peers);
  };
  meet_peers(Access::member(ctx), g, c, PeerWork(typed));
}

/// complete() of `posted` with a typed work(Peers<T>&).
template <class T, class Work>
void complete_typed(Context& ctx, const PostedGroup& posted, std::size_t bytes, Work&& work) {
  const auto typed = [&work](PeerSet& set) {
    Peers<T> peers(set);
    work(peers);
  };
  complete(Access::member(ctx), posted, bytes, PeerWork(typed));
}

/// Runs one leaf's collective (a leaf class, as Described): one rendezvous over g, the leaf's
/// work over the peers' inputs.
template <class T, class Leaf>
void meet_one(Context& ctx, const GroupInfo& g, const Collective& c, Leaf& leaf) {
  const int n = static_cast<int>(g.members.size());
  rendezvous<T>(ctx, g, c, [&](Peers<T>& peers) { leaf.work(n, [&](int k) { return peers.input(k); }); });
}

}  // namespace pmap::detail
