// When a call ends: did its devices call the same collectives, in the same order?
//
// Every device of a group must call the same collectives in the same order with the same
// shapes (groups of one collective may differ from each other). A collective compares every
// member's signature when its group meets, so a device that disagrees is found there and
// then (Team::check_agreement), with one exception: a small ppermute, pshuffle or
// pbroadcast over the whole team, in which a device waits for its source alone and is read
// by its destination alone. A device that calls another collective, another shape or other
// pairs there, or none, where nobody reads it, goes unseen: every device therefore folds the
// position and signature of each such collective into its history (Team::record_unread) and
// keeps them with their descriptions (its trail). When the call ends, the devices'
// collective counts and histories are compared; where they differ, the trails tell the
// first collective that differs and what each device did there.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "pmap/detail/dispatch.hpp"

namespace pmap::detail {
namespace {

constexpr std::uint64_t kNowhere = std::numeric_limits<std::uint64_t>::max();

std::uint64_t collectives_called(const Slot& s) { return s.final_phase / kPhasesPerCollective; }

/// What a device did as its `position`-th collective, as far as its slot tells.
struct Step {
  enum Kind { unchecked, returned, checked };
  Kind kind = checked;
  const TrailEntry* entry = nullptr;  ///< of an unchecked one
  const TrailOp* op = nullptr;        ///< its description
};

Step step_at(const Slot& s, std::uint64_t position) {
  const auto it =
      std::lower_bound(s.trail.begin(), s.trail.end(), position,
                       [](const TrailEntry& e, std::uint64_t p) { return e.position < p; });
  if (it != s.trail.end() && it->position == position)
    return {Step::unchecked, &*it, &s.trail_op(*it)};
  if (collectives_called(s) <= position) return {Step::returned, nullptr, nullptr};
  return {Step::checked, nullptr, nullptr};
}

/// The first collective in which devices a and b differ, as their trails tell (kNowhere if
/// they agree as far as both were kept).
std::uint64_t first_difference(const Slot& a, const Slot& b) {
  std::size_t i = 0;
  std::size_t j = 0;
  for (;;) {
    const bool a_end = i == a.trail.size();
    const bool b_end = j == b.trail.size();
    if ((a_end && a.trail_full) || (b_end && b.trail_full)) return kNowhere;
    if (a_end && b_end) break;
    const std::uint64_t pa = a_end ? kNowhere : a.trail[i].position;
    const std::uint64_t pb = b_end ? kNowhere : b.trail[j].position;
    if (pa != pb) return std::min(pa, pb);  // one called an unchecked collective, not the other
    if (a.trail[i].signature != b.trail[j].signature) return pa;
    ++i;
    ++j;
  }
  // A device that called more than another called a checked collective last, where the
  // other returned: one over a group without the other, whose count alone tells.
  const std::uint64_t na = collectives_called(a);
  const std::uint64_t nb = collectives_called(b);
  return na == nb ? kNowhere : std::min(na, nb);
}

/// The devices that did the same as their `position`-th collective.
struct Side {
  Step step;
  std::uint64_t signature = 0;
  std::vector<int> ids;
  int first = 0;  ///< team index of its first device
};

std::string what_side_did(const Team& team, const Side& side, std::uint64_t position) {
  const std::string who = device_list(side.ids);
  switch (side.step.kind) {
    case Step::unchecked:
      return fmt::format("{} called {}", who,
                         describe_op(side.step.op->desc, side.step.op->axes));
    case Step::returned:
      return fmt::format("{}{} returned from its kernel without calling it", who,
                         side.ids.size() == 1 ? "" : " each");
    case Step::checked:
      break;
  }
  // Only the last collective's description is kept in the slot.
  const Slot& s = team.slot(side.first);
  if (collectives_called(s) == position + 1)
    return fmt::format("{} called {}", who, describe_op(s.desc, s.axes));
  return fmt::format("{} called another collective", who);
}

std::vector<Side> sides_at(const Team& team, int first, int n, std::uint64_t position) {
  std::vector<Side> sides;
  for (int m = first; m < first + n; ++m) {
    const Step step = step_at(team.slot(m), position);
    const std::uint64_t sig = step.entry ? step.entry->signature : 0;
    auto same = std::find_if(sides.begin(), sides.end(), [&](const Side& s) {
      return s.step.kind == step.kind && s.signature == sig;
    });
    if (same == sides.end()) same = sides.insert(sides.end(), Side{step, sig, {}, m});
    same->ids.push_back(team.device_id(m));
  }
  return sides;
}

[[noreturn]] void raise_different_collectives(const Team& team, int first, int n) {
  std::uint64_t position = kNowhere;
  for (int m = first + 1; m < first + n; ++m)
    position = std::min(position, first_difference(team.slot(first), team.slot(m)));
  if (position == kNowhere) {
    // Beyond the kept trails (kTrailEntries): the histories differ, not where.
    int other = first + 1;
    while (team.slot(other).history == team.slot(first).history) ++other;
    throw DeviceError(team.device_id(other),
                      fmt::format("device {} and device {} called different collectives after "
                                  "their first {} point-to-point collectives; "
                                  "every device of a group must call the same collectives in "
                                  "the same order with the same shapes",
                                  team.device_id(first), team.device_id(other), kTrailEntries));
  }
  const std::vector<Side> sides = sides_at(team, first, n, position);
  // The device reported: the first of the smallest side (of two alike, not the first's).
  const Side* odd = &sides.back();
  for (const Side& s : sides)
    if (s.ids.size() < odd->ids.size()) odd = &s;
  const Side* named = sides.front().step.kind == Step::unchecked ? &sides.front() : nullptr;
  for (const Side& s : sides)
    if (!named && s.step.kind == Step::unchecked) named = &s;
  const TrailOp* op = named ? named->step.op : nullptr;
  if (sides.size() == 2 && op &&
      (sides[0].step.kind == Step::returned || sides[1].step.kind == Step::returned)) {
    const Side& returned = sides[0].step.kind == Step::returned ? sides[0] : sides[1];
    throw DeviceError(
        team.device_id(odd->first),
        fmt::format("{} over axis {}: {} called it, but {}", op->desc.name, op->axes,
                    device_list(named->ids), what_side_did(team, returned, position)));
  }
  std::string what;
  for (std::size_t k = 0; k < sides.size(); ++k) {
    if (k > 0) what += k + 1 == sides.size() ? (k == 1 ? ", but " : ", and ") : ", ";
    what += what_side_did(team, sides[k], position);
  }
  bool alike = sides.size() >= 2;
  for (const Side& s : sides)
    alike = alike && s.step.kind == Step::unchecked &&
            describe_op(s.step.op->desc, s.step.op->axes) ==
                describe_op(sides[0].step.op->desc, sides[0].step.op->axes);
  throw DeviceError(team.device_id(odd->first),
                    fmt::format("{}: {}; every device of a group must call the same collectives "
                                "in the same order with the same shapes{}",
                                op ? op->desc.name : "collectives", what,
                                alike ? " (these differ in their pairs, permutation, source or "
                                        "groups)"
                                      : ""));
}

/// Devices [first, first + n) returned normally: compares them.
void check_range(const Team& team, int first, int n) {
  const Slot& reference = team.slot(first);
  for (int m = first + 1; m < first + n; ++m) {
    const Slot& s = team.slot(m);
    if (s.final_phase != reference.final_phase || s.history != reference.history) [[unlikely]]
      raise_different_collectives(team, first, n);
  }
}

}  // namespace

void check_same_collectives(Team& team, int first, int n) {
  if (team.distributed()) return;  // teams across processes meet every member (gathered path)
  check_range(team, first, n);
  if (team.last_call_done(n) && n != team.size()) check_range(team, 0, team.size());
}

}  // namespace pmap::detail
