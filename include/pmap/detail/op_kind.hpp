/// @file op_kind.hpp
/// @brief The kinds of collective: part of every collective's signature, and the operation
/// of the reduction kernels.
#pragma once

#include <cstdint>

namespace pmap::detail {

enum class OpKind : std::uint64_t {
  psum = 1, pmean, pmax, pmin, pargmax, pargmin, all_gather, psum_scatter, all_to_all,
  ppermute, pbroadcast, ragged_all_to_all
};

}  // namespace pmap::detail
