/// @file errors.hpp
/// @brief Out-of-line [[noreturn]] helpers that build and throw the messages of SPEC 5.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "pmap/detail/tensor_traits.hpp"

namespace pmap::detail {

/// Where a leaf of a call's arguments is, for messages: "args[1][0]" is leaf 0 of argument 1.
struct LeafPath {
  const LeafPath* parent = nullptr;
  std::size_t index = 0;
  std::string str() const;
};

/// Thrown inside a device whose call was cancelled by another device's failure: the
/// device leaves, and the call reports the failure that cancelled it, never this.
/// Deliberately not a std::exception, so that kernels catching std::exception let it pass.
struct Cancelled {};

/// One mapped leaf of the arguments, for error messages.
struct LeafInfo {
  std::string path;  ///< "args[1][0]"
  const char* dtype = "";
  Shape shape;
  int axis = 0;      ///< normalised mapped axis
  int layout = Eigen::ColMajor;
  /// A slice along `axis` is strided in memory, so each device gets a staged copy.
  bool strided() const {
    return shape.rank > 1 && axis >= 0 && axis != (layout == Eigen::RowMajor ? 0 : shape.rank - 1);
  }
};

[[noreturn]] void raise_value_error(const std::string& message);
[[noreturn]] void raise_no_devices();                                             // E1
[[noreturn]] void raise_no_arguments(const std::string& name);                    // E2
[[noreturn]] void raise_rank_too_small(const std::string& name, int axis, const Shape& shape);  // E3
[[noreturn]] void raise_all_none(const std::string& name);                        // E4
[[noreturn]] void raise_no_mapped_leaf();                                         // E4b
[[noreturn]] void raise_inconsistent_sizes(const std::string& name,
                                           std::span<const LeafInfo> leaves);     // E5
/// The mapped axis has size 0: there is no device to run (and no output shape to return).
[[noreturn]] void raise_empty_axis(const std::string& name, const LeafInfo& leaf);
[[noreturn]] void raise_axis_size_mismatch(std::int64_t given, std::int64_t n,
                                           bool global);                          // E6
[[noreturn]] void raise_too_many_devices(std::int64_t needed, int available);     // E7
[[noreturn]] void raise_devices_mismatch(std::int64_t n, std::size_t k);          // E8
[[noreturn]] void raise_out_axis(int axis, int output, int rank);                 // E10
[[noreturn]] void raise_output_shapes_differ(int output, int device_a, const Shape& a,
                                             int device_b, const Shape& b);       // E12
[[noreturn]] void raise_not_replicated(int output, int device);                   // E13
/// shard_map: the blocks of output k disagree outside the dimensions its spec splits
/// (positions a, b in the mesh; `device` the global id of b).
[[noreturn]] void raise_block_shapes_differ(const std::string& name, int output, int device,
                                            int a, const Shape& shape_a, int b,
                                            const Shape& shape_b);
/// shard_map, check_replicated: output k differs between mesh positions i and j along `axis`.
[[noreturn]] void raise_not_replicated_along(const std::string& name, int output,
                                             const std::string& axis, int i, int j);
[[noreturn]] void raise_into_mismatch(int output, const char* expected_dtype,
                                      const Shape& expected, const char* dtype,
                                      const Shape& actual);
[[noreturn]] void raise_unbound_axis(const std::string& axis);                     // E11
/// psum_scatter: the scatter dimension is not the group size (untiled) or not a multiple.
[[noreturn]] void raise_scatter_extent(std::int64_t extent, int n, bool tiled);
/// all_to_all: the split axis is not the group size (untiled) or not a multiple of it.
[[noreturn]] void raise_all_to_all_extent(const std::string& axis, int n, std::int64_t extent,
                                          bool tiled);
/// A kernel returning a std::vector of outputs returned another count than the first device.
[[noreturn]] void raise_output_count_differs(int device, std::size_t count, int first_device,
                                             std::size_t first_count);
[[noreturn]] void raise_device_error(int device, const std::string& message);

}  // namespace pmap::detail
