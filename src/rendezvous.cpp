// The engine's paths (pmap/detail/rendezvous.hpp): compiled once here, the collectives'
// work reaching them through a PeerWork.
#include "pmap/detail/rendezvous.hpp"

#include <cstddef>
#include <cstdint>
#include <span>

namespace pmap::detail {

namespace {

/// The path of collective `c` over group `g` (the same on every member that agrees on it).
Path choose_path(const Team& team, const GroupInfo& g, const Collective& c) {
  if (team.distributed()) return Path::gathered;
  const bool whole_team = g.members.size() == static_cast<std::size_t>(team.size());
  if (c.steps == 1 && !c.in_place && team.size() > 1 && whole_team && c.bytes <= kStagedBytes)
    return Path::staged;
  return Path::in_place;
}

/// Before `me` rewrites staged copy `parity`: waits until whoever may still read it has moved
/// on. After a staged collective over the whole group nobody can (its barrier waited for every
/// member); after a point-to-point one, its reader may still be in it.
void await_copy_readers(Member& me, int parity) {
  const int reader = me.copy_reader[parity];
  if (reader == Member::kNobody) return;
  Team& team = *me.team;
  if (reader == Member::kEveryone)
    team.await_readers(me.index, team.local_members(), me.read_until[parity]);
  else
    team.await_readers(me.index, std::span<const int>(&reader, 1), me.read_until[parity]);
  me.copy_reader[parity] = Member::kNobody;
}

/// After the staged collective `c` of `me` on copy `parity`, whose phases start at `base`:
/// who may read which copy, and until when (they are done when they arrive at their next
/// collective).
void note_copy_readers(Member& me, const GroupInfo& g, const Collective& c, int parity,
                              std::uint64_t base) {
  me.read_until[parity] = base + kPhasesPerCollective + 1;
  if (c.source == Collective::kWholeGroup) {
    me.copy_reader[parity] = Member::kEveryone;
    me.copy_reader[1 - parity] = Member::kNobody;  // every member arrived here: done with it
  } else if (c.reader == Collective::kWholeGroup) {
    me.copy_reader[parity] = Member::kEveryone;
  } else {
    me.copy_reader[parity] =
        c.reader >= 0 ? g.members[static_cast<std::size_t>(c.reader)] : Member::kNobody;
  }
}

/// The staged path of rendezvous(): the input copied into the slot, one barrier (or, point
/// to point, a wait for the source alone), the work over the peers' copies.
void meet_staged(Member& me, const GroupInfo& g, const Collective& c, std::uint64_t signature,
                 const OpDesc& desc, const PeerWork& work) {
  Team& team = *me.team;
  const bool point_to_point = c.source != Collective::kWholeGroup;
  const int source = c.source >= 0 ? g.members[static_cast<std::size_t>(c.source)] : -1;
  const std::span<const int> awaited = point_to_point
                                           ? std::span<const int>(&source, source >= 0 ? 1 : 0)
                                           : std::span<const int>(g.members);
  await_copy_readers(me, static_cast<int>(me.staged & 1));
  const std::uint64_t base = me.phase;
  if (point_to_point) team.record_unread(me.index, base / kPhasesPerCollective, signature, desc,
                                         g.axis_label);
  const int parity =
      team.publish_staged(me.index, desc, g.axis_label, signature, me.staged++, c.in, c.bytes);
  Meeting meeting(me, awaited, 1, point_to_point);
  PeerSet peers(meeting, g, Path::staged, parity, c.bytes);
  meeting.run([&] {
    meeting.meet();
    meeting.check(parity);
    work(peers);
  });
  note_copy_readers(me, g, c, parity, base);
}

/// rendezvous() on `path`.
void meet_on(Member& me, Path path, const GroupInfo& g, const Collective& c, const PeerWork& work) {
  Team& team = *me.team;
  const std::uint64_t signature = c.signature ^ g.signature;
  const OpDesc desc{c.name, c.dtype, c.shape};
  switch (path) {
    case Path::staged:
      meet_staged(me, g, c, signature, desc, work);
      return;
    case Path::gathered: {
      team.publish(me.index, desc, g.axis_label, signature, c.in, c.out);
      Meeting meeting(me, team.local_members(), 3);
      PeerSet peers(meeting, g, path, -1, c.bytes);
      meeting.run([&] {
        meeting.meet();
        meeting.check();
        if (me.index == team.local_leader()) team.exchange_gather(me.index, c.bytes);
        meeting.meet();
        if (team.cancelled()) throw Cancelled{};  // the leader may have left without it
        team.raise_if_exchange_failed(me.index);
        work(peers);
      });
      return;
    }
    case Path::in_place: {
      team.publish(me.index, desc, g.axis_label, signature, c.in, c.out);
      Meeting meeting(me, g.members, c.steps + 1);
      PeerSet peers(meeting, g, path, -1, c.bytes);
      meeting.run([&] {
        meeting.meet();
        meeting.check();
        work(peers);
      });
      return;
    }
  }
}

}  // namespace

void meet_peers(Member& me, const GroupInfo& g, const Collective& c, PeerWork work) {
  const Path path = choose_path(*me.team, g, c);
  traced(me, g, c, path, [&] { meet_on(me, path, g, c, work); });
}

}  // namespace pmap::detail
