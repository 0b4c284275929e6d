#include "pmap/detail/errors.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "pmap/errors.hpp"

namespace pmap::detail {

std::string LeafPath::str() const {
  return (parent ? parent->str() : std::string("args")) + "[" + std::to_string(index) + "]";
}

std::string format_shape(const Shape& s) {
  if (s.rank == 1) return fmt::format("({},)", s.dims[0]);
  return fmt::format("({})", fmt::join(s.dims.begin(), s.dims.begin() + s.rank, ", "));
}

std::string format_typed_shape(const char* dtype, const Shape& s) {
  return fmt::format("{}[{}]", dtype, fmt::join(s.dims.begin(), s.dims.begin() + s.rank, ","));
}

void raise_value_error(const std::string& message) { throw ValueError(message); }

void raise_no_devices() {
  throw ValueError("'devices' argument to pmap must be non-empty, or None.");
}

void raise_no_arguments(const std::string& name) {
  throw ValueError(fmt::format(
      "{} wrapped function must be passed at least one argument containing an array, got none.",
      name));
}

void raise_rank_too_small(const std::string& name, int axis, const Shape& shape) {
  throw ValueError(fmt::format(
      "{} was requested to map its argument along axis {}, which implies that its rank should "
      "be at least {}, but is only {} (its shape is {})",
      name, axis, axis < 0 ? -axis : axis + 1, shape.rank, format_shape(shape)));
}

void raise_all_none(const std::string& name) {
  throw ValueError(fmt::format("{} must have at least one non-None value in in_axes", name));
}

void raise_no_mapped_leaf() {
  throw ValueError("pmap requires at least one argument with a mapped axis.");
}

void raise_inconsistent_sizes(const std::string& name, std::span<const LeafInfo> leaves) {
  struct Group {
    std::int64_t size;
    std::size_t count;
    const LeafInfo* first;
  };
  std::vector<Group> groups;  // in order of first appearance
  for (const LeafInfo& leaf : leaves) {
    const std::int64_t size = leaf.shape.dims[static_cast<std::size_t>(leaf.axis)];
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const Group& g) { return g.size == size; });
    if (it == groups.end())
      groups.push_back({size, 1, &leaf});
    else
      ++it->count;
  }
  std::stable_sort(groups.begin(), groups.end(),
                   [](const Group& a, const Group& b) { return a.count > b.count; });
  std::vector<std::string> lines;
  for (const Group& g : groups) {
    const std::string where = fmt::format("axis {} of {} of type {}", g.first->axis,
                                          g.first->path,
                                          format_typed_shape(g.first->dtype, g.first->shape));
    if (g.count == 1)
      lines.push_back(fmt::format("  * one axis had size {}: {}", g.size, where));
    else
      lines.push_back(fmt::format("  * {} axes ({} of them) had size {}, e.g. {}",
                                  lines.empty() ? "most" : "some", g.count, g.size, where));
  }
  throw ValueError(fmt::format("{} got inconsistent sizes for array axes to be mapped:\n{}", name,
                               fmt::join(lines, ";\n")));
}

void raise_empty_axis(const std::string& name, const LeafInfo& leaf) {
  throw ValueError(fmt::format(
      "{} cannot map an axis of size 0: axis {} of {} of type {} is empty, and a pmap needs one "
      "device per position",
      name, leaf.axis, leaf.path, format_typed_shape(leaf.dtype, leaf.shape)));
}

void raise_axis_size_mismatch(std::int64_t given, std::int64_t n, bool global) {
  throw ValueError(fmt::format("Specified axis_size {} doesn't match {} axis_size {}.", given,
                               global ? "global" : "received", n));
}

void raise_too_many_devices(std::int64_t needed, int available) {
  throw ValueError(fmt::format(
      "compiling computation that requires {} logical devices, but only {} devices are "
      "available (num_replicas={})",
      needed, available, needed));
}

void raise_devices_mismatch(std::int64_t n, std::size_t k) {
  throw ValueError(fmt::format(
      "Leading axis size of input to pmapped function must equal the number of local devices "
      "passed to pmap. Got axis_size={}, num_local_devices={}.",
      n, k));
}

void raise_out_axis(int axis, int output, int rank) {
  throw ValueError(fmt::format(
      "pmap out_axes specification {} is out of bounds for output {} of rank {}: it must be in "
      "[{}, {}]",
      axis, output, rank, -(rank + 1), rank));
}

void raise_output_shapes_differ(int output, int device_a, const Shape& a, int device_b,
                                const Shape& b) {
  throw DeviceError(device_b,
                    fmt::format("pmap output {} has shape {} on device {} but shape {} on device "
                                "{}; every device must return outputs of the same shape",
                                output, format_shape(a), device_a, format_shape(b), device_b));
}

void raise_not_replicated(int output, int device) {
  throw ValueError(fmt::format(
      "pmap out_axes=None requires output {} to be equal on every device, but device {} differs "
      "from device 0",
      output, device));
}

void raise_block_shapes_differ(const std::string& name, int output, int device, int a,
                               const Shape& shape_a, int b, const Shape& shape_b) {
  throw DeviceError(device, fmt::format("{} output {} has a block of shape {} on device {} but of "
                                        "shape {} on device {}; blocks may differ only along the "
                                        "dimensions out_specs[{}] splits",
                                        name, output, format_shape(shape_a), a,
                                        format_shape(shape_b), b, output));
}

void raise_not_replicated_along(const std::string& name, int output, const std::string& axis,
                                int i, int j) {
  throw ValueError(fmt::format("{} out_specs[{}] does not name mesh axis '{}', so output {} must "
                               "be equal along it, but device {} differs from device {}",
                               name, output, axis, output, i, j));
}

void raise_into_mismatch(int output, const char* expected_dtype, const Shape& expected,
                         const char* dtype, const Shape& actual) {
  throw ValueError(fmt::format(
      "pmap into: output {} must have shape {} and type {}, but the given output has shape {} "
      "and type {}",
      output, format_shape(expected), expected_dtype, format_shape(actual), dtype));
}

void raise_unbound_axis(const std::string& axis) {
  throw NameError(fmt::format("unbound axis name: {}", axis));
}

void raise_device_error(int device, const std::string& message) {
  throw DeviceError(device, message);
}

void raise_scatter_extent(std::int64_t extent, int n, bool tiled) {
  if (tiled)
    throw ValueError(fmt::format(
        "tiled reduce_scatter operand scatter dimension size {} must be divisible by shard_count {}",
        extent, n));
  throw ValueError(fmt::format(
      "reduce_scatter operand scatter dimension size {} must match shard count {}", extent, n));
}

void raise_all_to_all_extent(const std::string& axis, int n, std::int64_t extent, bool tiled) {
  if (tiled)
    throw ValueError(fmt::format("The size of all_to_all split_axis ({}) has to be divisible by "
                                 "the size of the named axis {} ({})",
                                 extent, axis, n));
  throw ValueError(fmt::format("all_to_all requires the size of the mapped axis {} to equal "
                               "x.shape[split_axis], but they are {} and {} respectively.",
                               axis, n, extent));
}

void raise_output_count_differs(int device, std::size_t count, int first_device,
                                std::size_t first_count) {
  throw DeviceError(device, fmt::format("pmap kernel returned {} outputs on device {} but {} on "
                                        "device {}",
                                        count, device, first_count, first_device));
}

}  // namespace pmap::detail
