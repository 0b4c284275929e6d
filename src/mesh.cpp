#include "pmap/mesh.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "pmap/detail/blocks.hpp"
#include "pmap/detail/errors.hpp"

namespace pmap {

Mesh::Mesh(std::vector<std::pair<std::string, int>> axes, Runtime* runtime)
    : axes_(std::move(axes)), runtime_(runtime ? runtime : &Runtime::global()) {
  check_axes();
  std::int64_t n = 1;
  for (const auto& axis : axes_) n *= axis.second;
  const auto all = runtime_->devices();
  if (n > static_cast<std::int64_t>(all.size()))
    detail::raise_value_error(fmt::format("Mesh needs {} devices, but only {} devices are available",
                                          n, all.size()));
  devices_.assign(all.begin(), all.begin() + n);
}

Mesh::Mesh(std::vector<std::pair<std::string, int>> axes, std::vector<Device> devices,
           Runtime* runtime)
    : axes_(std::move(axes)), devices_(std::move(devices)),
      runtime_(runtime ? runtime : &Runtime::global()) {
  check_axes();
  std::int64_t n = 1;
  for (const auto& axis : axes_) n *= axis.second;
  if (static_cast<std::int64_t>(devices_.size()) != n)
  {
    std::vector<std::string> shape;
    for (const auto& [name, size] : axes_) shape.push_back(fmt::format("'{}': {}", name, size));
    detail::raise_value_error(fmt::format("Mesh of shape {{{}}} needs {} devices, but was given {}",
                                          fmt::join(shape, ", "), n, devices_.size()));
  }
  const auto all = runtime_->devices();
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    const Device& d = devices_[i];
    if (std::find(all.begin(), all.end(), d) == all.end())
      detail::raise_value_error(fmt::format(
          "Mesh devices: {} is not a device of the runtime, which has {} devices", d.to_string(),
          all.size()));
    for (std::size_t j = 0; j < i; ++j)
      if (devices_[j] == d)
        detail::raise_value_error(fmt::format("Mesh devices must be distinct, but {} appears twice",
                                              d.to_string()));
  }
}

void Mesh::check_axes() const {
  if (axes_.empty()) detail::raise_value_error("Mesh needs at least one axis");
  if (axes_.size() > static_cast<std::size_t>(detail::kMaxMeshAxes))
    detail::raise_value_error(fmt::format("Mesh has {} axes, but at most {} are supported",
                                          axes_.size(), detail::kMaxMeshAxes));
  for (std::size_t a = 0; a < axes_.size(); ++a) {
    const auto& [name, size] = axes_[a];
    if (name.empty()) detail::raise_value_error(fmt::format("Mesh axis {} has an empty name", a));
    if (size < 1)
      detail::raise_value_error(
          fmt::format("Mesh axis '{}' has size {}, but a mesh axis needs at least 1 device", name, size));
    for (std::size_t b = 0; b < a; ++b)
      if (axes_[b].first == name)
        detail::raise_value_error(
            fmt::format("Mesh axis names must be distinct, but '{}' appears twice", name));
  }
}

int Mesh::find_axis(std::string_view name) const {
  for (std::size_t a = 0; a < axes_.size(); ++a)
    if (axes_[a].first == name) return static_cast<int>(a);
  return -1;
}

int Mesh::axis_size(std::string_view name) const {
  const int a = find_axis(name);
  if (a < 0) detail::raise_unbound_axis(std::string(name));
  return axes_[static_cast<std::size_t>(a)].second;
}

std::vector<std::string> Mesh::axis_names() const {
  std::vector<std::string> names;
  for (const auto& axis : axes_) names.push_back(axis.first);
  return names;
}

}  // namespace pmap
