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
std::shared_ptr<Team> join_nested(Context& outer, std::span<const AxisBinding> inner,
                                  const char* what, const Runtime& runtime) {
  Access::complete_through(outer, nullptr);  // started collectives come first (SPEC 11)
  Member& me = Access::member(outer);
  Team& team = *me.team;
  if (team.distributed())
    raise_value_error("pmap: a pmap nested inside a multi-process pmap is not supported; map "
                      "the processes' axis innermost or flatten the two axes into one");
  const int depth = team.num_axes();
  const int added = static_cast<int>(inner.size());
  if (depth + added > kMaxAxes)
    raise_value_error(fmt::format("{} nests at most {} axes", what, kMaxAxes));
  // What every outer device must agree on: the call's kind and its inner axes.
  Shape sizes{added, {}};
  std::uint64_t signature = hash_bytes(kHashSeed, what, std::strlen(what));
  int n = 1;
  for (int a = 0; a < added; ++a) {
    const AxisBinding& axis = inner[static_cast<std::size_t>(a)];
    sizes.dims[static_cast<std::size_t>(a)] = axis.size;
    signature = hash_bytes(hash_mix(signature, static_cast<std::uint64_t>(axis.size)),
                           axis.name.data(), axis.name.size());
    n *= axis.size;
  }
  const std::string& first_name = inner.front().name;
  std::vector<int> everyone(static_cast<std::size_t>(team.size()));
  for (int m = 0; m < team.size(); ++m) everyone[static_cast<std::size_t>(m)] = m;
  team.publish(me.index, OpDesc{what, "", sizes},
               first_name.empty() ? std::string_view("None") : std::string_view(first_name),
               signature);
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
      AxisBinding axes[kMaxAxes];
      for (int a = 0; a < depth; ++a) axes[a] = team.axis(a);
      for (int a = 0; a < added; ++a) axes[depth + a] = inner[static_cast<std::size_t>(a)];
      const int size = team.size() * n;
      std::vector<int> ids(static_cast<std::size_t>(size));
      for (int c = 0; c < size; ++c)
        ids[static_cast<std::size_t>(c)] = runtime.devices()[static_cast<std::size_t>(c)].id;
      team.make_child(size, std::span<const AxisBinding>(axes, static_cast<std::size_t>(depth + added)),
                      std::move(ids), runtime.num_threads());
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
