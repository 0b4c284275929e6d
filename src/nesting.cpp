#include <fmt/format.h>

#include <cstring>
#include <exception>
#include <span>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pmap/detail/dispatch.hpp"
#include "pmap/detail/errors.hpp"
#include "pmap/detail/hash.hpp"

namespace pmap::detail {

// The nesting rendezvous: every outer device of the team calls the inner pmap. Either all of
// them get the child team, or none does: an outer device that got it runs its inner devices
// (which leave at once if the child is cancelled), so an inner device never waits for a peer
// whose outer device left without starting it. Hence the barriers here ignore cancellation
// (Team::drain): they complete when every outer device arrived, and fail on every device
// alike when one returned from its kernel instead.
namespace {

/// What every outer device of a nesting rendezvous must agree on: the call's kind and its
/// inner axes (their sizes as a shape, for the E14 text), and the inner devices per outer one.
struct NestedCall {
  Shape sizes;
  std::uint64_t signature = 0;
  int devices = 1;
};

NestedCall describe_nested(std::span<const AxisBinding> inner, const char* what) {
  NestedCall call;
  call.sizes.rank = static_cast<int>(inner.size());
  call.signature = hash_bytes(kHashSeed, what, std::strlen(what));
  for (std::size_t a = 0; a < inner.size(); ++a) {
    call.sizes.dims[a] = inner[a].size;
    call.signature = hash_bytes(hash_mix(call.signature, static_cast<std::uint64_t>(inner[a].size)),
                                inner[a].name.data(), inner[a].name.size());
    call.devices *= inner[a].size;
  }
  return call;
}

/// The leader's part: the child team of the outer devices times the inner axes' devices,
/// its axes the outer team's followed by `inner`, its devices the runtime's first ones.
void make_nested_child(Team& team, std::span<const AxisBinding> inner, int n,
                       const Runtime& runtime) {
  const int depth = team.num_axes();
  AxisBinding axes[kMaxAxes];
  for (int a = 0; a < depth; ++a) axes[a] = team.axis(a);
  for (std::size_t a = 0; a < inner.size(); ++a) axes[static_cast<std::size_t>(depth) + a] = inner[a];
  const int size = team.size() * n;
  std::vector<int> ids(static_cast<std::size_t>(size));
  for (int c = 0; c < size; ++c)
    ids[static_cast<std::size_t>(c)] = runtime.devices()[static_cast<std::size_t>(c)].id;
  team.make_child(size, std::span<const AxisBinding>(axes, static_cast<std::size_t>(depth) + inner.size()),
                  std::move(ids), runtime.num_threads());
}

}  // namespace

std::shared_ptr<Team> join_nested(Context& outer, std::span<const AxisBinding> inner,
                                  const char* what, const Runtime& runtime) {
  Access::complete_through(outer, nullptr);  // started collectives come first (SPEC 11)
  Member& me = Access::member(outer);
  Team& team = *me.team;
  if (team.distributed())
    raise_value_error(fmt::format(
        "{0}: a {0} nested inside a call across processes is not supported; map the "
        "processes' axis innermost or flatten the two axes into one",
        what));
  const int depth = team.num_axes();
  const int added = static_cast<int>(inner.size());
  if (depth + added > kMaxAxes)
    raise_value_error(fmt::format("{} nests at most {} axes", what, kMaxAxes));
  const NestedCall agreed = describe_nested(inner, what);
  const int n = agreed.devices;
  const std::string& first_name = inner.front().name;
  std::vector<int> everyone(static_cast<std::size_t>(team.size()));
  for (int m = 0; m < team.size(); ++m) everyone[static_cast<std::size_t>(m)] = m;
  team.publish(me.index, OpDesc{what, "", agreed.sizes},
               first_name.empty() ? std::string_view("None") : std::string_view(first_name),
               agreed.signature);
  const std::uint64_t base = me.phase;
  me.phase = base + kPhasesPerCollective;
  // Barrier 1: all outer devices are here (or one returned, and none will get a child).
  team.drain(me.index, everyone, base + 1, base + 1);
  for (int m : everyone)
    if (team.slot(m).phase.load(std::memory_order_acquire) < base + 1) {
      if (team.cancelled()) throw Cancelled{};
      team.arrive_and_wait(me.index, everyone, base + 1);  // raises E14 (or the deadlock)
    }
  team.check_agreement(me.index, everyone, base + 1);  // the same on every device
  std::exception_ptr failure;
  if (me.index == 0) {
    try {
      make_nested_child(team, inner, n, runtime);
    } catch (...) {
      failure = std::current_exception();  // still arrive: the others must not wait for us
    }
  }
  // Barrier 2: the child is published; every device that passed barrier 1 arrives here.
  team.drain(me.index, everyone, base + 2, base + 2);
  if (failure) std::rethrow_exception(failure);
  std::shared_ptr<Team> child = team.child();
  if (!child) throw Cancelled{};  // the leader failed to create it and reports why
  return child;
}

}  // namespace pmap::detail
