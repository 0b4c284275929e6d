#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "pmap/context.hpp"
#include "pmap/detail/errors.hpp"

namespace pmap {
namespace detail {

void resolve_axes(const Team& team, const AxisNames& axes, std::vector<int>& out) {
  out.clear();
  if (axes.innermost()) {
    out.push_back(team.num_axes() - 1);
    return;
  }
  for (const std::string& name : axes.names()) {
    int found = -1;
    if (!name.empty())
      for (int a = team.num_axes() - 1; a >= 0; --a)  // inner bindings shadow outer ones
        if (team.axis(a).name == name) {
          found = a;
          break;
        }
    if (found < 0) raise_unbound_axis(name);
    out.push_back(found);
  }
}

namespace {

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  return (h ^ v) * 0x100000001b3ULL + 0x9e3779b97f4a7c15ULL;
}

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
  using detail::GroupInfo;
  const detail::Team& team = *member_.team;
  if (!group_cache_) group_cache_ = std::make_unique<GroupInfo>();
  GroupInfo& g = *group_cache_;
  thread_local std::vector<int> ids;
  detail::resolve_axes(team, axes, ids);
  if (equal_sizes)
    for (const auto& grp : groups)
      if (grp.size() != groups.front().size()) {
        std::vector<std::size_t> sizes;
        for (const auto& x : groups) sizes.push_back(x.size());
        detail::raise_value_error(
            fmt::format("{} requires axis_index_groups of equal size, got sizes [{}]", op,
                        fmt::join(sizes, ", ")));
      }
  if (!g.members.empty() && ids == g.axes && groups == g.groups) return g;  // same as last time

  g.axes = ids;
  g.groups = groups;
  g.axis_label = detail::axis_label(team, ids);
  g.axis_size = 1;
  for (int a : ids) g.axis_size *= team.axis(a).size;
  // This device's flattened index over the named axes, and its team index with them zeroed.
  int mine = 0;
  int base = member_.index;
  for (int a : ids) {
    const int idx = team.index_on(member_.index, a);
    mine = mine * team.axis(a).size + idx;
    base -= idx * team.stride(a);
  }
  auto member_of = [&](int flat) {
    int m = base;
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
      m += (flat % team.axis(*it).size) * team.stride(*it);
      flat /= team.axis(*it).size;
    }
    return m;
  };

  std::uint64_t sig = 0xcbf29ce484222325ULL;
  for (int a : ids) sig = detail::mix(sig, static_cast<std::uint64_t>(a));
  g.members.clear();
  if (groups.empty()) {
    for (int f = 0; f < g.axis_size; ++f) g.members.push_back(member_of(f));
    g.position = mine;
  } else {
    std::vector<int> seen(static_cast<std::size_t>(g.axis_size), 0);
    bool valid = true;
    for (const auto& grp : groups)
      for (int f : grp) {
        if (f < 0 || f >= g.axis_size || seen[static_cast<std::size_t>(f)]++) valid = false;
        sig = detail::mix(sig, static_cast<std::uint64_t>(f) + 1);
      }
    for (int s : seen) valid = valid && s == 1;
    if (!valid) {
      g.members.clear();
      detail::raise_value_error("axis_index_groups must cover all indices exactly once");
    }
    for (const auto& grp : groups) {
      auto it = std::find(grp.begin(), grp.end(), mine);
      if (it == grp.end()) continue;
      for (int f : grp) g.members.push_back(member_of(f));
      g.position = static_cast<int>(it - grp.begin());
      break;
    }
  }
  g.signature = sig;
  return g;
}

}  // namespace pmap
