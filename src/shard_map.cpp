#include "pmap/shard_map.hpp"

#include <fmt/format.h>

#include "pmap/detail/errors.hpp"

namespace pmap::detail {

std::vector<ResolvedSpec> resolve_specs(const Mesh& mesh, const std::vector<PartitionSpec>& specs,
                                        const char* kind, const std::string& name) {
  std::vector<ResolvedSpec> out;
  out.reserve(specs.size());
  for (std::size_t k = 0; k < specs.size(); ++k) {
    const PartitionSpec& spec = specs[k];
    if (spec.dims.size() > static_cast<std::size_t>(kMaxRank))
      raise_value_error(fmt::format("{} {}[{}] has {} entries, but tensors have at most {} dimensions",
                                    name, kind, k, spec.dims.size(), kMaxRank));
    ResolvedSpec r;
    r.entries = static_cast<int>(spec.dims.size());
    r.partition.rank = r.entries;
    std::vector<int> used;
    for (std::size_t d = 0; d < spec.dims.size(); ++d) {
      for (const std::string& axis : spec.dims[d]) {
        const int a = mesh.find_axis(axis);
        if (a < 0) raise_unbound_axis(axis);
        for (int u : used)
          if (u == a)
            raise_value_error(fmt::format("{} {}[{}] uses mesh axis '{}' twice; each mesh axis may "
                                          "split at most one dimension, once",
                                          name, kind, k, axis));
        used.push_back(a);
        auto& count = r.partition.count[d];
        r.partition.axes[d][static_cast<std::size_t>(count++)] = a;
        r.splits = true;
      }
    }
    out.push_back(r);
  }
  return out;
}

void raise_spec_count(const std::string& name, const char* kind, std::size_t count,
                      std::size_t expected, const char* what) {
  raise_value_error(fmt::format("{} got {} {} for {} {}; pass one per {}, or a single one for all",
                                name, count, kind, expected, what,
                                std::string_view(kind) == "in_specs" ? "argument" : "output"));
}

void raise_spec_rank(const std::string& name, const char* kind, std::size_t k, int entries,
                     const std::string& what, const char* dtype, const Shape& shape) {
  const std::string typed = dtype ? fmt::format(" ({})", format_typed_shape(dtype, shape)) : "";
  raise_value_error(fmt::format("{} {}[{}] has {} entries, but {} has rank {}{}; a spec may have "
                                "at most one entry per dimension",
                                name, kind, k, entries, what, shape.rank, typed));
}

void raise_spec_splits_non_tensor(const std::string& name, std::size_t k, const char* dtype) {
  raise_value_error(fmt::format("{} in_specs[{}] splits args[{}], which is not a tensor (type {}); "
                                "a non-tensor argument is broadcast and takes P()",
                                name, k, k, dtype));
}

void check_inner_mesh(const Context& outer, const Mesh& mesh, const std::string& name) {
  const Team& team = *Access::member(outer).team;
  for (const auto& [axis, size] : mesh.axes())
    for (int a = 0; a < team.num_axes(); ++a)
      if (team.axis(a).name == axis)
        raise_value_error(fmt::format("{}: the inner mesh's axis '{}' is already bound by an "
                                      "enclosing pmap or shard_map; an inner mesh needs axis "
                                      "names of its own",
                                      name, axis));
  const std::int64_t needed = static_cast<std::int64_t>(team.size()) * mesh.size();
  if (needed > mesh.runtime().device_count()) raise_too_many_devices(needed, mesh.runtime().device_count());
}

Block process_block_of(const Mesh& mesh, const PartitionSpec& spec, const Shape& global,
                       const char* dtype) {
  const std::string name = "process_block";
  const ResolvedSpec r = resolve_specs(mesh, {spec}, "spec", name)[0];
  if (r.entries > global.rank) raise_spec_rank(name, "spec", 0, r.entries, "the tensor", dtype, global);
  const Runtime& runtime = mesh.runtime();
  if (runtime.process_count() == 1) return Block{global, {}, global};
  MeshShape shape;
  shape.num_axes = static_cast<int>(mesh.axes().size());
  for (std::size_t a = 0; a < mesh.axes().size(); ++a) {
    shape.sizes[a] = mesh.axes()[a].second;
    shape.names[a] = &mesh.axes()[a].first;
  }
  bool in_order = true;
  for (int i = 0; in_order && i < mesh.size(); ++i) in_order = mesh.devices()[static_cast<std::size_t>(i)].id == i;
  const ProcessSpan span(shape, runtime.process_count(), runtime.local_device_count(),
                         runtime.process_index(), in_order, name);
  span.check();
  span.check_contiguous(r.partition, "spec", "the tensor");
  return span.block(r.partition, global);
}

}  // namespace pmap::detail
