#include "pmap/detail/dispatch.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "pmap/logging.hpp"

namespace pmap::detail {

TeamCache::~TeamCache() { delete team_.exchange(nullptr); }

void TeamCache::give(Team* team) { delete team_.exchange(team, std::memory_order_acq_rel); }

TeamLease::~TeamLease() {
  if (cache_) cache_->give(team_);
}

TeamLease::TeamLease(TeamCache& cache, const Runtime& runtime, const std::string& axis_name,
                     int n, int processes, const CallInfo& call)
    : cache_(&cache), team_(cache.take()), base_(runtime.process_index() * n) {
  const int global = n * processes;
  if (team_ && team_->size() == global) {
    team_->reset();
    return;
  }
  delete team_;
  team_ = nullptr;
  // Global device ids: this process's from the call (the devices option), the others' in
  // runtime order.
  std::vector<int> ids(static_cast<std::size_t>(global));
  for (int c = 0; c < global; ++c)
    ids[static_cast<std::size_t>(c)] = c >= base_ && c < base_ + n
                                           ? call.id(c - base_)
                                           : runtime.devices()[static_cast<std::size_t>(c)].id;
  const AxisBinding axis{axis_name, global};
  team_ = new Team(global, std::span(&axis, 1), std::move(ids), runtime.num_threads(), base_, n);
}

TeamLease::TeamLease(TeamCache& cache, const Runtime& runtime, std::span<const AxisBinding> axes,
                     const CallInfo& call)
    : cache_(&cache), team_(cache.take()), base_(call.span ? call.span->base() : 0) {
  // Across processes the team is the global mesh's, of which this process runs its box.
  const int global = call.span ? call.span->processes() * call.span->local() : call.n;
  if (team_ && team_->size() == global) {
    team_->reset();
    return;
  }
  delete team_;
  std::vector<int> ids(static_cast<std::size_t>(global));
  for (int c = 0; c < global; ++c)
    ids[static_cast<std::size_t>(c)] = c >= base_ && c < base_ + call.n
                                           ? call.id(c - base_)
                                           : runtime.devices()[static_cast<std::size_t>(c)].id;
  team_ = new Team(global, axes, std::move(ids), runtime.num_threads(), base_, call.n);
}

TeamLease::TeamLease(Context& outer, std::span<const AxisBinding> inner, const char* what,
                     const Runtime& runtime)
    : child_(join_nested(outer, inner, what, runtime)) {
  int n = 1;
  for (const AxisBinding& axis : inner) n *= axis.size;
  base_ = first_device(runtime, &outer, n);
  team_ = child_.get();
}

int first_device(const Runtime& runtime, const Context* outer, int n) {
  return (outer ? Access::member(*outer).index : runtime.process_index()) * n;
}

void rethrow_failure(const Team& team, int processes) {
  if (processes > 1)
    finish_distributed_call(team);
  else if (std::exception_ptr error = team.error())
    std::rethrow_exception(error);
}

void hint_strided_slices(const std::string& name, const std::vector<LeafInfo>& leaves) {
  for (const LeafInfo& leaf : leaves)
    if (leaf.strided())
      logger()->info(
          "{}: {} is {} {}, so its slices along axis {} are strided in memory and copied for "
          "every device on every call; a {} tensor (mapped along axis {}) is passed without "
          "copying",
          name, leaf.path, format_typed_shape(leaf.dtype, leaf.shape),
          leaf.layout == Eigen::RowMajor ? "RowMajor" : "ColMajor", leaf.axis,
          leaf.layout == Eigen::RowMajor ? "ColMajor" : "RowMajor",
          leaf.layout == Eigen::RowMajor ? leaf.shape.rank - 1 : 0);
}

void check_devices_option(const std::optional<std::vector<Device>>& devices,
                          const Runtime& runtime) {
  if (!devices) return;
  if (devices->empty()) raise_no_devices();
  const auto all = runtime.devices();
  for (std::size_t i = 0; i < devices->size(); ++i) {
    const Device& d = (*devices)[i];
    if (std::find(all.begin(), all.end(), d) == all.end())
      raise_value_error(fmt::format("pmap devices: {} is not a device of the runtime, which has "
                                    "{} devices",
                                    d.to_string(), all.size()));
    for (std::size_t j = 0; j < i; ++j)
      if ((*devices)[j] == d)
        raise_value_error(fmt::format("pmap devices must be distinct, but {} appears twice",
                                      d.to_string()));
  }
}

void log_dispatch(const std::string& name, int n, const Device* devices,
                  const std::vector<LeafInfo>& leaves, double microseconds) {
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back(devices[i].id);
  std::vector<std::string> shapes;
  for (const LeafInfo& leaf : leaves)
    shapes.push_back(format_typed_shape(leaf.dtype, leaf.shape) +
                     (leaf.layout == Eigen::RowMajor ? " RowMajor" : " ColMajor"));
  logger()->debug("{}: axis_size={} devices=[{}] args=[{}] took {:.1f} us", name, n,
                  fmt::join(ids, ", "), fmt::join(shapes, ", "), microseconds);
}

}  // namespace pmap::detail
