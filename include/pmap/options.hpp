/// @file options.hpp
/// @brief Options of pmap(): axis name, size, devices, runtime.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pmap/runtime.hpp"

namespace pmap {

/// @brief How a mapped function binds its axis and where it runs (SPEC 2, 3.3, 3.4).
struct Options {
  std::string axis_name;                        ///< "" = anonymous (innermost axis only)
  std::optional<std::int64_t> axis_size;        ///< must equal the (global) axis size
  std::optional<std::vector<Device>> devices;   ///< nullopt = first n devices of the runtime
  Runtime* runtime = nullptr;                   ///< nullptr = Runtime::global()
  bool check_replicated = true;                 ///< verify out_axes=none outputs agree
  std::string name = "pmap";                    ///< the {name} in error messages
};

}  // namespace pmap
