// The engine's paths (pmap/detail/rendezvous.hpp): compiled once here, the collectives'
// work reaching them through a PeerWork.
#include "pmap/detail/rendezvous.hpp"

#include "pmap/detail/cpu_relax.hpp"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>

namespace pmap::detail {

namespace {

/// Whether a collective over group `g` of one step reading `bytes` of each member, not in
/// place, is staged.
bool staged_path(const Team& team, const GroupInfo& g, std::size_t bytes) {
  const bool whole_team = g.members.size() == static_cast<std::size_t>(team.size());
  return !team.distributed() && team.size() > 1 && whole_team && bytes <= kStagedBytes;
}

/// The path of collective `c` over group `g` (the same on every member that agrees on it).
Path choose_path(const Team& team, const GroupInfo& g, const Collective& c) {
  if (team.distributed()) return Path::gathered;
  if (c.steps == 1 && !c.in_place && staged_path(team, g, c.bytes)) return Path::staged;
  return Path::in_place;
}

/// Before `me` rewrites staged copy `copy`: waits until whoever may still read it has moved
/// on. After a staged collective over the whole group nobody can (its barrier waited for every
/// member); after a point-to-point one, its reader may still be in it.
void await_copy_readers(Member& me, int copy) {
  const int reader = me.copy_reader[copy];
  if (reader == Member::kNobody) return;
  Team& team = *me.team;
  if (reader == Member::kEveryone) {
    team.await_readers(me.index, team.local_members(), me.read_until[copy]);
  } else if (!me.seen_at(reader, me.read_until[copy])) {
    team.await_readers(me.index, std::span<const int>(&reader, 1), me.read_until[copy]);
    me.note_seen(reader, team.slot(reader).phase.load(std::memory_order_relaxed));
  }
  me.copy_reader[copy] = Member::kNobody;
}

/// `me` stages collective `c` over `g` in copy `copy`, its phases starting at `base`: who may
/// read the copy, and until when (Member::read_until).
void note_copy_readers(Member& me, const GroupInfo& g, const Collective& c, int copy,
                       std::uint64_t base) {
  me.read_until[copy] = base + 2 * kPhasesPerCollective + 1;
  if (c.reader == Collective::kWholeGroup)
    me.copy_reader[copy] = Member::kEveryone;
  else
    me.copy_reader[copy] =
        c.reader >= 0 ? g.members[static_cast<std::size_t>(c.reader)] : Member::kNobody;
}

/// After a staged collective over the whole group whose phases start at `base`: every member
/// arrived at it, so is done with the copies of the collectives two before it and older.
void note_everyone_arrived(Member& me, std::uint64_t base) {
  for (int k = 0; k < kStagedCopies; ++k)
    if (me.read_until[k] <= base + 1) me.copy_reader[k] = Member::kNobody;
}

/// The first half of the staged path: the input copied into the next copy, the phases
/// counted, the description published.
int stage(Member& me, const GroupInfo& g, const Collective& c, std::uint64_t signature,
          const OpDescRef& desc, std::uint64_t& base, bool started = false) {
  Team& team = *me.team;
  const int copy = static_cast<int>(me.staged % kStagedCopies);
  await_copy_readers(me, copy);
  base = me.phase;
  team.publish_staged(me.index, desc, g.axis_label, signature, me.staged++, c.in, c.bytes,
                      started);
  note_copy_readers(me, g, c, copy, base);
  return copy;
}

/// The staged path of rendezvous() over the whole group: the input copied into the slot, one
/// barrier, the work over the peers' copies. A started one (rendezvous.hpp: PostedGroup) is
/// the same with the barrier's arrival and its wait apart (post_group, complete).
void meet_staged(Member& me, const GroupInfo& g, const Collective& c, std::uint64_t signature,
                 const OpDescRef& desc, const PeerWork& work) {
  std::uint64_t base = 0;
  const int copy = stage(me, g, c, signature, desc, base);
  Meeting meeting(me, g.members, 1);
  PeerSet peers(nullptr, *me.team, g, Path::staged, copy, c.bytes);
  meeting.run([&] {
    meeting.meet();
    meeting.check(copy);
    work(peers);
  });
  note_everyone_arrived(me, base);
}

/// The first half of a staged point-to-point collective (rendezvous.hpp: Posted).
Posted post_staged(Member& me, const GroupInfo& g, const Collective& c, std::uint64_t signature,
                   const OpDescRef& desc, bool started) {
  {
    const Slot& mine = me.team->slot(me.index);
    prefetch_for_write(&mine.phase);
    prefetch_for_write(&mine.small_copies);
  }
  std::uint64_t base = 0;
  const int copy = stage(me, g, c, signature, desc, base, started);
  const int source = c.source >= 0 ? g.members[static_cast<std::size_t>(c.source)] : -1;
  me.phase = base + kPhasesPerCollective;
  // The arrival as early as it can be, and nothing after it that reads back what was just
  // written in another width (a Posted built in memory field by field and returned in
  // registers): such a load waits until the store buffer drained, arrival included, which
  // waits for the line the source polls. The history, which only the end of the call reads,
  // is written after it, while the arrival travels.
  me.team->arrive_posted(me.index, base + 1);
  me.team->record_unread(me.index, base / kPhasesPerCollective, signature, desc, g.axis_label);
  return Posted{base, copy, source};
}

/// rendezvous() on `path`.
void meet_on(Member& me, Path path, const GroupInfo& g, const Collective& c, const PeerWork& work) {
  Team& team = *me.team;
  const std::uint64_t signature = c.signature ^ g.signature;
  const OpDescRef desc{c.name, c.dtype, c.shape};
  switch (path) {
    case Path::staged:
      if (c.source == Collective::kWholeGroup) {
        meet_staged(me, g, c, signature, desc, work);
      } else {  // both halves of a posted collective (rendezvous.hpp: Posted)
        const Posted posted = post_staged(me, g, c, signature, desc, false);
        complete(me, posted, c.bytes);
        PeerSet peers(nullptr, team, g, Path::staged, posted.copy, c.bytes);
        work(peers);
      }
      return;
    case Path::gathered: {
      team.publish(me.index, desc, g.axis_label, signature, c.in, c.out);
      Meeting meeting(me, team.local_members(), 3);
      PeerSet peers(&meeting, team, g, path, -1, c.bytes);
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
      PeerSet peers(&meeting, team, g, path, -1, c.bytes);
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

bool can_post(const Member& me, const GroupInfo& g, std::size_t bytes) {
  return staged_path(*me.team, g, bytes);  // one member's input read by another
}

Posted post(Member& me, const GroupInfo& g, const Collective& c, bool started) {
  PMAP_ASSERT(c.source != Collective::kWholeGroup && can_post(me, g, c.bytes));
  return post_staged(me, g, c, c.signature ^ g.signature, OpDescRef{c.name, c.dtype, c.shape},
                     started);
}

bool arrived(const Member& me, const Posted& posted) {
  if (posted.source < 0) return true;
  const Slot& s = me.team->slot(posted.source);
  return s.phase.load(std::memory_order_acquire) > posted.base ||
         s.finished.load(std::memory_order_acquire) || me.team->cancelled();
}

const void* complete(Member& me, const Posted& posted, std::size_t bytes) {
  Team& team = *me.team;
  const std::span<const int> awaited(&posted.source, posted.source >= 0 ? 1 : 0);
  const std::uint64_t target = posted.base + 1;
  std::exception_ptr failure;
  try {
    team.await_arrival(me.index, awaited, target);
    team.check_agreement(me.index, awaited, target, posted.copy);
    if (posted.source < 0) return nullptr;
    const Slot& source = team.slot(posted.source);
    me.note_seen(posted.source, source.phase.load(std::memory_order_relaxed));
    return source.staged_copy(posted.copy, bytes);
  } catch (...) {
    failure = std::current_exception();
  }
  // As Meeting::run: drained outside the handler (a drain may suspend).
  team.drain(me.index, awaited, target, target, true);
  std::rethrow_exception(failure);
}

PostedGroup post_group(Member& me, const GroupInfo& g, const Collective& c,
                       std::span<const int> members) {
  PMAP_ASSERT(c.source == Collective::kWholeGroup && c.steps == 1 && !c.in_place &&
              can_post(me, g, c.bytes));
  std::uint64_t base = 0;
  const int copy = stage(me, g, c, c.signature ^ g.signature,
                         OpDescRef{c.name, c.dtype, c.shape}, base, true);
  me.phase = base + kPhasesPerCollective;  // as Meeting does
  const bool complete = me.team->arrive_at_barrier(me.index, members, base + 1);
  return PostedGroup{base, copy, members, g.position, complete};
}

bool arrived(const Member& me, const PostedGroup& posted) {
  return me.team->cancelled() || me.team->drained(posted.members, posted.base + 1);
}

void complete(Member& me, const PostedGroup& posted, std::size_t bytes, PeerWork work) {
  Team& team = *me.team;
  const std::uint64_t target = posted.base + 1;
  std::exception_ptr failure;
  try {
    team.await_barrier(me.index, posted.members, target, posted.complete);
    team.check_agreement(me.index, posted.members, target, posted.copy);
    PeerSet peers(nullptr, team, posted.members, posted.position, Path::staged, posted.copy,
                  bytes);
    work(peers);
    note_everyone_arrived(me, posted.base);
    return;
  } catch (...) {
    failure = std::current_exception();
  }
  // As Meeting::run: drained outside the handler (a drain may suspend).
  team.drain(me.index, posted.members, target, target);
  std::rethrow_exception(failure);
}

void meet_peers(Member& me, const GroupInfo& g, const Collective& c, PeerWork work) {
  const Path path = choose_path(*me.team, g, c);
  traced(me, g, c, path, [&] { meet_on(me, path, g, c, work); });
}

}  // namespace pmap::detail
