/// @file collectives.hpp
/// @brief The collectives of pmap::Context (SPEC 2.3): each a call of its work in
/// detail/reductions.hpp or detail/data_movement.hpp, over the engine of detail/rendezvous.hpp.
#pragma once

#include <utility>
#include <vector>

#include "pmap/context.hpp"
#include "pmap/detail/data_movement.hpp"
#include "pmap/detail/reductions.hpp"
#include "pmap/detail/trees.hpp"

namespace pmap {
template <class X>
auto Context::psum(const X& x, AxisNames axes, const Groups& groups) {
  if constexpr (detail::is_operand_tree_v<X>) {
    return detail::reduce_tree<detail::OpKind::psum>(*this, x, axes, groups, "psum");
  } else if constexpr (detail::is_core_dense_v<X>) {
    return detail::core_collective(x, [&](const auto& t) { return psum(t, axes, groups); });
  } else {
    using Acc = detail::psum_acc<typename detail::Operand<X>::T>;
    return detail::reduce<detail::OpKind::psum, Acc, X>(*this, x, axes, groups, "psum");
  }
}

template <class T, int R, int L>
Eigen::Tensor<detail::psum_acc<T>, R, L> Context::psum(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                                       const Groups& groups) {
  using X = Eigen::Tensor<T, R, L>;
  return detail::reduce<detail::OpKind::psum, detail::psum_acc<T>, X>(*this, std::move(x), axes,
                                                                      groups, "psum");
}

template <class X>
auto Context::pmean(const X& x, AxisNames axes, const Groups& groups) {
  if constexpr (detail::is_operand_tree_v<X>) {
    return detail::reduce_tree<detail::OpKind::pmean>(*this, x, axes, groups, "pmean");
  } else if constexpr (detail::is_core_dense_v<X>) {
    return detail::core_collective(x, [&](const auto& t) { return pmean(t, axes, groups); });
  } else {
    using Acc = detail::pmean_acc<typename detail::Operand<X>::T>;
    return detail::reduce<detail::OpKind::pmean, Acc, X>(*this, x, axes, groups, "pmean");
  }
}

template <class T, int R, int L>
Eigen::Tensor<detail::pmean_acc<T>, R, L> Context::pmean(Eigen::Tensor<T, R, L>&& x,
                                                         AxisNames axes, const Groups& groups) {
  using X = Eigen::Tensor<T, R, L>;
  return detail::reduce<detail::OpKind::pmean, detail::pmean_acc<T>, X>(*this, std::move(x), axes,
                                                                        groups, "pmean");
}

template <class X>
auto Context::pmax(const X& x, AxisNames axes, const Groups& groups) {
  if constexpr (detail::is_operand_tree_v<X>) {
    return detail::reduce_tree<detail::OpKind::pmax>(*this, x, axes, groups, "pmax");
  } else if constexpr (detail::is_core_dense_v<X>) {
    return detail::core_collective(x, [&](const auto& t) { return pmax(t, axes, groups); });
  } else {
    using T = typename detail::Operand<X>::T;
    return detail::reduce<detail::OpKind::pmax, T, X>(*this, x, axes, groups, "pmax");
  }
}

template <class T, int R, int L>
Eigen::Tensor<T, R, L> Context::pmax(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                     const Groups& groups) {
  using X = Eigen::Tensor<T, R, L>;
  return detail::reduce<detail::OpKind::pmax, T, X>(*this, std::move(x), axes, groups, "pmax");
}

template <class X>
auto Context::pmin(const X& x, AxisNames axes, const Groups& groups) {
  if constexpr (detail::is_operand_tree_v<X>) {
    return detail::reduce_tree<detail::OpKind::pmin>(*this, x, axes, groups, "pmin");
  } else if constexpr (detail::is_core_dense_v<X>) {
    return detail::core_collective(x, [&](const auto& t) { return pmin(t, axes, groups); });
  } else {
    using T = typename detail::Operand<X>::T;
    return detail::reduce<detail::OpKind::pmin, T, X>(*this, x, axes, groups, "pmin");
  }
}

template <class T, int R, int L>
Eigen::Tensor<T, R, L> Context::pmin(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                     const Groups& groups) {
  using X = Eigen::Tensor<T, R, L>;
  return detail::reduce<detail::OpKind::pmin, T, X>(*this, std::move(x), axes, groups, "pmin");
}

template <class T, int R, int L>
void Context::donate(Eigen::Tensor<T, R, L>&& t) {
  Eigen::Tensor<T, R, L> owned(std::move(t));  // t is left empty either way
  detail::Access::keep_spare(*this, std::move(owned));
}

template <class X>
auto Context::pargmax(const X& x, AxisNames axes) {
  return detail::arg_reduce<true>(*this, x, axes, "pargmax");
}

template <class X>
auto Context::pargmin(const X& x, AxisNames axes) {
  return detail::arg_reduce<false>(*this, x, axes, "pargmin");
}

template <class X>
auto Context::all_gather(const X& x, AxisNames axes, int axis, const Groups& groups) {
  if constexpr (detail::is_operand_tree_v<X>) {
    static_assert(!detail::has_core_leaf<X>(),
                  "pmap: all_gather changes the rank of its operands, which an Eigen Matrix / Array leaf cannot hold: "
                  "wrap the data in an Eigen::TensorMap");
    return detail::all_gather_tree<false>(*this, x, axes, axis, groups);
  } else {
    static_assert(!detail::is_core_dense_v<X>,
                  "pmap: all_gather changes the rank of its operand, which an Eigen Matrix / Array cannot hold: "
                  "wrap the data in an Eigen::TensorMap, e.g. "
                  "Eigen::TensorMap<const Eigen::Tensor<float, 2>>(m.data(), m.rows(), m.cols())");
    return detail::all_gather<false>(*this, x, axes, axis, groups);
  }
}

template <class X>
auto Context::all_gather(const X& x, AxisNames axes, int axis, tiled_t, const Groups& groups) {
  if constexpr (detail::is_operand_tree_v<X>) {
    static_assert(!detail::has_core_leaf<X>(),
                  "pmap: all_gather changes the rank of its operands, which an Eigen Matrix / Array leaf cannot hold: "
                  "wrap the data in an Eigen::TensorMap");
    return detail::all_gather_tree<true>(*this, x, axes, axis, groups);
  } else {
    static_assert(!detail::is_core_dense_v<X>,
                  "pmap: all_gather changes the rank of its operand, which an Eigen Matrix / Array cannot hold: "
                  "wrap the data in an Eigen::TensorMap, e.g. "
                  "Eigen::TensorMap<const Eigen::Tensor<float, 2>>(m.data(), m.rows(), m.cols())");
    return detail::all_gather<true>(*this, x, axes, axis, groups);
  }
}

template <class X>
auto Context::psum_scatter(const X& x, AxisNames axes, int scatter_dimension,
                           const Groups& groups) {
  if constexpr (detail::is_operand_tree_v<X>) {
    static_assert(!detail::has_core_leaf<X>(),
                  "pmap: psum_scatter changes the rank of its operands, which an Eigen Matrix / Array leaf cannot hold: "
                  "wrap the data in an Eigen::TensorMap");
    return detail::scatter_sum_tree<false>(*this, x, axes, scatter_dimension, groups);
  } else {
    static_assert(!detail::is_core_dense_v<X>,
                  "pmap: psum_scatter changes the rank of its operand, which an Eigen Matrix / Array cannot hold: "
                  "wrap the data in an Eigen::TensorMap, e.g. "
                  "Eigen::TensorMap<const Eigen::Tensor<float, 2>>(m.data(), m.rows(), m.cols())");
    return detail::scatter_sum<false>(*this, x, axes, scatter_dimension, groups);
  }
}

template <class X>
auto Context::psum_scatter(const X& x, AxisNames axes, int scatter_dimension, tiled_t,
                           const Groups& groups) {
  if constexpr (detail::is_operand_tree_v<X>) {
    static_assert(!detail::has_core_leaf<X>(),
                  "pmap: psum_scatter changes the rank of its operands, which an Eigen Matrix / Array leaf cannot hold: "
                  "wrap the data in an Eigen::TensorMap");
    return detail::scatter_sum_tree<true>(*this, x, axes, scatter_dimension, groups);
  } else {
    static_assert(!detail::is_core_dense_v<X>,
                  "pmap: psum_scatter changes the rank of its operand, which an Eigen Matrix / Array cannot hold: "
                  "wrap the data in an Eigen::TensorMap, e.g. "
                  "Eigen::TensorMap<const Eigen::Tensor<float, 2>>(m.data(), m.rows(), m.cols())");
    return detail::scatter_sum<true>(*this, x, axes, scatter_dimension, groups);
  }
}

template <class X>
auto Context::all_to_all(const X& x, AxisNames axes, int split_axis, int concat_axis,
                         const Groups& groups) {
  if constexpr (detail::is_operand_tree_v<X>) {
    static_assert(!detail::has_core_leaf<X>(),
                  "pmap: all_to_all changes the rank of its operands, which an Eigen Matrix / Array leaf cannot hold: "
                  "wrap the data in an Eigen::TensorMap");
    return detail::all_to_all_tree<false>(*this, x, axes, split_axis, concat_axis, groups);
  } else {
    static_assert(!detail::is_core_dense_v<X>,
                  "pmap: all_to_all changes the rank of its operand, which an Eigen Matrix / Array cannot hold: "
                  "wrap the data in an Eigen::TensorMap, e.g. "
                  "Eigen::TensorMap<const Eigen::Tensor<float, 2>>(m.data(), m.rows(), m.cols())");
    return detail::all_to_all<false, X>(*this, x, axes, split_axis, concat_axis, groups);
  }
}

template <class X>
auto Context::all_to_all(const X& x, AxisNames axes, int split_axis, int concat_axis, tiled_t,
                         const Groups& groups) {
  if constexpr (detail::is_operand_tree_v<X>) {
    static_assert(!detail::has_core_leaf<X>(),
                  "pmap: all_to_all changes the rank of its operands, which an Eigen Matrix / Array leaf cannot hold: "
                  "wrap the data in an Eigen::TensorMap");
    return detail::all_to_all_tree<true>(*this, x, axes, split_axis, concat_axis, groups);
  } else {
    static_assert(!detail::is_core_dense_v<X>,
                  "pmap: all_to_all changes the rank of its operand, which an Eigen Matrix / Array cannot hold: "
                  "wrap the data in an Eigen::TensorMap, e.g. "
                  "Eigen::TensorMap<const Eigen::Tensor<float, 2>>(m.data(), m.rows(), m.cols())");
    return detail::all_to_all<true, X>(*this, x, axes, split_axis, concat_axis, groups);
  }
}

template <class T, int R, int L>
Eigen::Tensor<T, R, L> Context::all_to_all(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                           int split_axis, int concat_axis, const Groups& groups) {
  return detail::all_to_all<false, Eigen::Tensor<T, R, L>>(*this, std::move(x), axes, split_axis,
                                                         concat_axis, groups);
}

template <class T, int R, int L>
Eigen::Tensor<T, R, L> Context::all_to_all(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                           int split_axis, int concat_axis, tiled_t,
                                           const Groups& groups) {
  return detail::all_to_all<true, Eigen::Tensor<T, R, L>>(*this, std::move(x), axes, split_axis,
                                                        concat_axis, groups);
}

template <class X>
auto Context::ppermute(const X& x, AxisNames axes, const std::vector<std::pair<int, int>>& perm) {
  if constexpr (detail::is_operand_tree_v<X>) {
    return detail::permute_tree(*this, x, detail::ppermute_op(*this, axes, perm));
  } else if constexpr (detail::is_core_dense_v<X>) {
    return detail::core_collective(x, [&](const auto& t) { return ppermute(t, axes, perm); });
  } else {
    return detail::ppermute<X>(*this, x, axes, perm);
  }
}

template <class T, int R, int L>
Eigen::Tensor<T, R, L> Context::ppermute(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                         const std::vector<std::pair<int, int>>& perm) {
  return detail::ppermute<Eigen::Tensor<T, R, L>>(*this, std::move(x), axes, perm);
}

template <class X>
auto Context::pshuffle(const X& x, AxisNames axes, const std::vector<int>& perm) {
  if constexpr (detail::is_operand_tree_v<X>) {
    return detail::permute_tree(*this, x, detail::pshuffle_op(*this, axes, perm));
  } else if constexpr (detail::is_core_dense_v<X>) {
    return detail::core_collective(x, [&](const auto& t) { return pshuffle(t, axes, perm); });
  } else {
    return detail::pshuffle<X>(*this, x, axes, perm);
  }
}

template <class T, int R, int L>
Eigen::Tensor<T, R, L> Context::pshuffle(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                         const std::vector<int>& perm) {
  return detail::pshuffle<Eigen::Tensor<T, R, L>>(*this, std::move(x), axes, perm);
}

template <class X>
auto Context::pbroadcast(const X& x, AxisNames axes, int source) {
  if constexpr (detail::is_operand_tree_v<X>) {
    return detail::permute_tree(*this, x, detail::pbroadcast_op(*this, axes, source));
  } else if constexpr (detail::is_core_dense_v<X>) {
    return detail::core_collective(x, [&](const auto& t) { return pbroadcast(t, axes, source); });
  } else {
    return detail::pbroadcast<X>(*this, x, axes, source);
  }
}

template <class T, int R, int L>
Eigen::Tensor<T, R, L> Context::pbroadcast(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                           int source) {
  return detail::pbroadcast<Eigen::Tensor<T, R, L>>(*this, std::move(x), axes, source);
}

// Donated trees: the same collectives, with the tree forwarded to its leaves.
template <detail::DonatedTree X>
auto Context::psum(X&& x, AxisNames axes, const Groups& groups) {
  return detail::reduce_tree<detail::OpKind::psum>(*this, std::forward<X>(x), axes, groups, "psum");
}

template <detail::DonatedTree X>
auto Context::pmean(X&& x, AxisNames axes, const Groups& groups) {
  return detail::reduce_tree<detail::OpKind::pmean>(*this, std::forward<X>(x), axes, groups, "pmean");
}

template <detail::DonatedTree X>
auto Context::pmax(X&& x, AxisNames axes, const Groups& groups) {
  return detail::reduce_tree<detail::OpKind::pmax>(*this, std::forward<X>(x), axes, groups, "pmax");
}

template <detail::DonatedTree X>
auto Context::pmin(X&& x, AxisNames axes, const Groups& groups) {
  return detail::reduce_tree<detail::OpKind::pmin>(*this, std::forward<X>(x), axes, groups, "pmin");
}

template <detail::DonatedTree X>
auto Context::all_to_all(X&& x, AxisNames axes, int split_axis, int concat_axis, const Groups& groups) {
  static_assert(!detail::has_core_leaf<X>(),
                "pmap: all_to_all changes the rank of its operands, which an Eigen Matrix / Array leaf cannot hold: "
                "wrap the data in an Eigen::TensorMap");
  return detail::all_to_all_tree<false>(*this, std::forward<X>(x), axes, split_axis, concat_axis, groups);
}

template <detail::DonatedTree X>
auto Context::all_to_all(X&& x, AxisNames axes, int split_axis, int concat_axis, tiled_t,
                         const Groups& groups) {
  static_assert(!detail::has_core_leaf<X>(),
                "pmap: all_to_all changes the rank of its operands, which an Eigen Matrix / Array leaf cannot hold: "
                "wrap the data in an Eigen::TensorMap");
  return detail::all_to_all_tree<true>(*this, std::forward<X>(x), axes, split_axis, concat_axis, groups);
}

template <detail::DonatedTree X>
auto Context::ppermute(X&& x, AxisNames axes, const std::vector<std::pair<int, int>>& perm) {
  return detail::permute_tree(*this, std::forward<X>(x), detail::ppermute_op(*this, axes, perm));
}

template <detail::DonatedTree X>
auto Context::pshuffle(X&& x, AxisNames axes, const std::vector<int>& perm) {
  return detail::permute_tree(*this, std::forward<X>(x), detail::pshuffle_op(*this, axes, perm));
}

template <detail::DonatedTree X>
auto Context::pbroadcast(X&& x, AxisNames axes, int source) {
  return detail::permute_tree(*this, std::forward<X>(x), detail::pbroadcast_op(*this, axes, source));
}

}  // namespace pmap
