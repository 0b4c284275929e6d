#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "pmap/context.hpp"
#include "pmap/detail/errors.hpp"
#include "pmap/detail/hash.hpp"

namespace pmap {
namespace detail {

void resolve_axes(const Team& team, const AxisNames& axes, std::vector<int>& out) {
  out.clear();
  if (axes.innermost()) {
    out.push_back(team.num_axes() - 1);
    return;
  }
  for (std::size_t k = 0; k < axes.size(); ++k) {
    const std::string_view name = axes.name(k);
    int found = -1;
    if (!name.empty())
      for (int a = team.num_axes() - 1; a >= 0; --a)  // inner bindings shadow outer ones
        if (team.axis(a).name == name) {
          found = a;
          break;
        }
    if (found < 0) raise_unbound_axis(std::string(name));
    out.push_back(found);
  }
}

namespace {

std::string axis_label(const Team& team, const std::vector<int>& axes) {
  auto name = [&](int a) {
    const std::string& n = team.axis(a).name;
    return n.empty() ? std::string("None") : n;
  };
  if (axes.size() == 1) return name(axes[0]);
  std::vector<std::string> names;
  for (int a : axes) names.push_back(fmt::format("'{}'", name(a)));
  return fmt::format("({})", fmt::join(names, ", "));
}

void check_equal_sizes(const Groups& groups, const char* op) {
  for (const auto& grp : groups)
    if (grp.size() != groups.front().size()) {
      std::vector<std::size_t> sizes;
      for (const auto& x : groups) sizes.push_back(x.size());
      raise_value_error(fmt::format("{} requires axis_index_groups of equal size, got sizes [{}]",
                                    op, fmt::join(sizes, ", ")));
    }
}

/// The team members along a set of named axes, as one flattened axis (row-major in the
/// listed order), seen from one member: its own flat index, and the member at any other.
class AxisGrid {
 public:
  AxisGrid(const Team& team, const std::vector<int>& axes, int member)
      : team_(team), axes_(axes), base_(member) {
    for (int a : axes) {
      const int idx = team.index_on(member, a);
      mine_ = mine_ * team.axis(a).size + idx;
      size_ *= team.axis(a).size;
      base_ -= idx * team.stride(a);  // the member with the named axes' indices zeroed
    }
  }
  int size() const { return size_; }
  int mine() const { return mine_; }
  int member(int flat) const {
    int m = base_;
    for (auto it = axes_.rbegin(); it != axes_.rend(); ++it) {
      m += (flat % team_.axis(*it).size) * team_.stride(*it);
      flat /= team_.axis(*it).size;
    }
    return m;
  }

 private:
  const Team& team_;
  const std::vector<int>& axes_;
  int base_;
  int mine_ = 0;
  int size_ = 1;
};

/// The axes and groups of a collective, hashed; groups must cover [0, size) exactly once.
std::uint64_t group_signature(const std::vector<int>& axes, const Groups& groups, int size) {
  std::uint64_t sig = kHashSeed;
  for (int a : axes) sig = hash_mix(sig, static_cast<std::uint64_t>(a));
  if (groups.empty()) return sig;
  std::vector<int> seen(static_cast<std::size_t>(size), 0);
  bool valid = true;
  for (const auto& grp : groups)
    for (int f : grp) {
      if (f < 0 || f >= size || seen[static_cast<std::size_t>(f)]++) valid = false;
      sig = hash_mix(sig, static_cast<std::uint64_t>(f) + 1);
    }
  for (int s : seen) valid = valid && s == 1;
  if (!valid) raise_value_error("axis_index_groups must cover all indices exactly once");
  return sig;
}

}  // namespace
}  // namespace detail

int Context::axis_index(AxisNames axes) const {
  thread_local std::vector<int> ids;
  detail::resolve_axes(*member_.team, axes, ids);
  int index = 0;
  for (int a : ids)
    index = index * member_.team->axis(a).size + member_.team->index_on(member_.index, a);
  return index;
}

int Context::axis_size(AxisNames axes) const {
  thread_local std::vector<int> ids;
  detail::resolve_axes(*member_.team, axes, ids);
  int size = 1;
  for (int a : ids) size *= member_.team->axis(a).size;
  return size;
}

const detail::GroupInfo& Context::group(const AxisNames& axes, const Groups& groups,
                                        bool equal_sizes, const char* op) {
  // Every collective asks for its group first: the ones this device started before it run
  // now (SPEC 11's order), before anything here is read (they ask for groups too).
  if (!started_.empty()) detail::Access::complete_through(*this, nullptr);
  const detail::Team& team = *member_.team;
  if (!group_cache_) group_cache_ = std::make_unique<detail::GroupInfo>();
  detail::GroupInfo& g = *group_cache_;
  const std::string_view spelling = detail::Access::spelling(axes);
  if (!g.members.empty() && groups.empty() && g.groups.empty() && spelling == g.spelled)
    return g;  // named as last time (a loop's collectives)
  thread_local std::vector<int> ids;
  detail::resolve_axes(team, axes, ids);
  if (equal_sizes) detail::check_equal_sizes(groups, op);
  if (!g.members.empty() && ids == g.axes && groups == g.groups) {  // same as last time
    g.spelled = spelling;
    return g;
  }

  const detail::AxisGrid grid(team, ids, member_.index);
  g.members.clear();  // stays empty (not cached) if the groups are invalid
  g.signature = detail::group_signature(ids, groups, grid.size());
  g.axes = ids;
  g.groups = groups;
  g.axis_label = detail::axis_label(team, ids);
  g.axis_size = grid.size();
  g.spelled = spelling;
  if (groups.empty()) {
    for (int f = 0; f < grid.size(); ++f) g.members.push_back(grid.member(f));
    g.position = grid.mine();
    return g;
  }
  for (const auto& grp : groups) {
    auto it = std::find(grp.begin(), grp.end(), grid.mine());
    if (it == grp.end()) continue;
    for (int f : grp) g.members.push_back(grid.member(f));
    g.position = static_cast<int>(it - grp.begin());
    break;
  }
  return g;
}

}  // namespace pmap
