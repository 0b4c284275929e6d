// The texts of a team's errors (team.hpp): a collective the devices of a group disagree on
// (E14), a device that returned while its peers wait in a collective, a deadlock.
#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pmap/detail/team.hpp"
#include "pmap/errors.hpp"

namespace pmap::detail {
namespace {

/// A tree collective's leaves as a slot describes them (Slot::leaf_signatures, or a staged
/// copy's, StagedDesc).
struct Leaves {
  const char* dtype;
  int count;
  const std::uint64_t* signatures;
};

/// For two tree collectives: where the trees first differ ("; the trees first differ at
/// leaf 2 (depth first)"), or nothing when that is beyond the leaves the slots describe.
std::string first_differing_leaf(const Leaves& a, const Leaves& b) {
  if (std::strcmp(a.dtype, "tree") != 0 || std::strcmp(b.dtype, "tree") != 0) return {};
  const int common = std::min({a.count, b.count, Slot::kDescribedLeaves});
  int k = 0;
  while (k < common && a.signatures[k] == b.signatures[k]) ++k;
  if (k == common && (k == Slot::kDescribedLeaves || a.count == b.count)) return {};
  return fmt::format("; the trees first differ at leaf {} (depth first)", k);
}

}  // namespace

std::string device_list(const std::vector<int>& ids) {
  if (ids.size() == 1) return fmt::format("device {}", ids[0]);
  return fmt::format("devices [{}]", fmt::join(ids, ", "));
}

std::string describe_op(const OpDesc& desc, std::string_view axes) {
  return fmt::format("{} over axis {} on {}", desc.name, axes,
                     format_typed_shape(desc.dtype, desc.shape));
}

void Team::check_agreement(int me, std::span<const int> members, std::uint64_t target,
                           int copy) const {
  auto signature = [copy](const Slot& s) {
    return copy < 0 ? s.signature.load(std::memory_order_acquire)
                    : s.staged_signature[copy].load(std::memory_order_acquire);
  };
  // A started collective as its copy describes it: the slot's latest description may be of a
  // collective started after it.
  auto by_copy = [copy](const Slot& s) {
    return copy >= 0 && s.staged_desc_valid[copy].load(std::memory_order_relaxed);
  };
  auto described = [&](const Slot& s) {
    return by_copy(s) ? describe_op(s.staged_desc[copy].desc, s.staged_desc[copy].axes)
                      : describe_op(s.desc, s.axes);
  };
  auto leaves = [&](const Slot& s) {
    if (!by_copy(s)) return Leaves{s.desc.dtype, s.leaf_count, s.leaf_signatures};
    const Slot::StagedDesc& d = s.staged_desc[copy];
    return Leaves{d.desc.dtype, d.leaf_count, d.leaf_signatures};
  };
  const Slot& mine = slot(me);
  const std::uint64_t sig = signature(mine);
  for (int m : members) {
    const Slot& s = slot(m);
    const std::uint64_t theirs = signature(s);
    if (theirs == sig) continue;
    // The peer's description is stable while the copy was not staged again, or, of its
    // latest collective, while it has not moved past this one.
    const bool described_by_copy = by_copy(s);
    std::string peer = described(s);
    const bool stable = described_by_copy ? signature(s) == theirs
                                          : s.phase.load(std::memory_order_acquire) <= target;
    if (!stable) peer = "a different collective";
    const char* name = by_copy(mine) ? mine.staged_desc[copy].desc.name : mine.desc.name;
    throw DeviceError(device_id(me),
                      fmt::format("{}: device {} called {}, but device {} called {}; every device "
                                  "of a group must call the same collectives in the same order "
                                  "with the same shapes{}",
                                  name, device_id(me), described(mine), device_id(m), peer,
                                  stable ? first_differing_leaf(leaves(mine), leaves(s))
                                         : std::string()));
  }
}

void Team::raise_stuck(int me, std::span<const int> members, std::uint64_t target,
                       int returned) const {
  std::vector<int> waiting;
  for (int m : members)
    if (!slot(m).finished.load(std::memory_order_acquire) ||
        slot(m).phase.load(std::memory_order_acquire) >= target)
      waiting.push_back(device_id(m));
  const Slot& mine = slot(me);
  throw DeviceError(device_id(me),
                    fmt::format("{} over axis {}: {} waiting in it, but device {} returned from "
                                "its kernel without calling it",
                                mine.desc.name, mine.axes,
                                device_list(waiting) + (waiting.size() == 1 ? " is" : " are"),
                                device_id(returned)));
}

std::string Team::describe_deadlock() const {
  std::map<std::string, std::vector<int>> waits;
  std::vector<int> returned;
  for (int m : local_members_) {
    const Slot& s = slot(m);
    if (s.finished.load(std::memory_order_acquire))
      returned.push_back(device_id(m));
    else
      waits[describe_op(s.desc, s.axes)].push_back(device_id(m));
  }
  std::string what = "devices wait for each other in collectives that can never complete:";
  for (const auto& [op, ids] : waits) what += fmt::format(" {} in {};", device_list(ids), op);
  if (!returned.empty()) what += fmt::format(" {} returned from the kernel;", device_list(returned));
  what.pop_back();
  return what;
}

}  // namespace pmap::detail
