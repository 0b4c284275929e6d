/// @file mesh.hpp
/// @brief Device meshes and partition specs of shard_map (SPEC 9).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "pmap/axes.hpp"
#include "pmap/runtime.hpp"

namespace pmap {

/// @brief Devices arranged as a named n-dimensional array, row-major (JAX's Mesh).
///
/// Example: 8 devices as 2 (data) x 4 (model):
/// @code
///   pmap::Mesh mesh({{"data", 2}, {"model", 4}});
///   std::string name = mesh.devices()[5].to_string();   // the device at data 1, model 1
/// @endcode
class Mesh {
 public:
  /// @brief Axes in order, major to minor, each {name, size}, over the first prod(sizes)
  /// devices of the runtime (nullptr = Runtime::global()). ValueError for a size < 1,
  /// duplicate or empty names, or more devices than the runtime has.
  Mesh(std::vector<std::pair<std::string, int>> axes, Runtime* runtime = nullptr);
  /// @brief The same over exactly `devices`, in that order (one per mesh position, distinct,
  /// all of the runtime).
  Mesh(std::vector<std::pair<std::string, int>> axes, std::vector<Device> devices,
       Runtime* runtime = nullptr);

  /// @brief Number of devices.
  int size() const { return static_cast<int>(devices_.size()); }
  /// @brief Size of the named axis; NameError `unbound axis name: {name}` if absent.
  int axis_size(std::string_view name) const;
  /// @brief The axis names, major to minor.
  std::vector<std::string> axis_names() const;
  /// @brief The devices, row-major over the axes.
  std::span<const Device> devices() const { return devices_; }
  /// @brief The axes as given: {name, size}, major to minor.
  const std::vector<std::pair<std::string, int>>& axes() const { return axes_; }
  /// @brief Position of the named axis, -1 if the mesh has none of that name.
  int find_axis(std::string_view name) const;
  Runtime& runtime() const { return *runtime_; }

 private:
  void check_axes() const;
  std::vector<std::pair<std::string, int>> axes_;
  std::vector<Device> devices_;
  Runtime* runtime_;
};

/// @brief How a tensor is split: entry d lists the mesh axes dimension d is split over
/// (major to minor; empty = not split). Missing trailing entries are not split.
struct PartitionSpec {
  std::vector<std::vector<std::string>> dims;
  friend bool operator==(const PartitionSpec&, const PartitionSpec&) = default;
};

namespace detail {
inline std::vector<std::string> spec_entry(none_t) { return {}; }
inline std::vector<std::string> spec_entry(const char* name) { return {std::string(name)}; }
inline std::vector<std::string> spec_entry(std::string_view name) { return {std::string(name)}; }
inline std::vector<std::string> spec_entry(const std::string& name) { return {name}; }
inline std::vector<std::string> spec_entry(std::vector<std::string> names) { return names; }
}  // namespace detail

/// @brief A PartitionSpec: each entry a mesh axis name, pmap::none, or a
/// std::vector<std::string> of names (major to minor). P() replicates.
///
/// Example: rows split over "data", columns over "model" then "x":
/// @code
///   pmap::PartitionSpec spec = pmap::P("data", std::vector<std::string>{"model", "x"});
/// @endcode
template <class... E>
PartitionSpec P(E&&... entries) {
  return PartitionSpec{{detail::spec_entry(std::forward<E>(entries))...}};
}

/// @brief Options of shard_map().
struct ShardOptions {
  bool check_replicated = true;    ///< outputs must agree along mesh axes their spec omits
  std::string name = "shard_map";  ///< the {name} in error messages
};

}  // namespace pmap
