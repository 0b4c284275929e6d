/// @file collectives.hpp
/// @brief The collectives of pmap::Context (SPEC 2.3): each a call of its work in
/// detail/reductions.hpp or detail/data_movement.hpp, over the engine of detail/rendezvous.hpp.
#pragma once

#include <utility>
#include <vector>

#include "pmap/context.hpp"
#include "pmap/detail/data_movement.hpp"
#include "pmap/detail/reductions.hpp"

namespace pmap {
template <class X>
auto Context::psum(const X& x, AxisNames axes, const Groups& groups) {
  using Acc = detail::psum_acc<typename detail::Operand<X>::T>;
  return detail::reduce<detail::OpKind::psum, Acc, X>(*this, x, axes, groups, "psum");
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
  using Acc = detail::pmean_acc<typename detail::Operand<X>::T>;
  return detail::reduce<detail::OpKind::pmean, Acc, X>(*this, x, axes, groups, "pmean");
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
  using T = typename detail::Operand<X>::T;
  return detail::reduce<detail::OpKind::pmax, T, X>(*this, x, axes, groups, "pmax");
}

template <class T, int R, int L>
Eigen::Tensor<T, R, L> Context::pmax(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                     const Groups& groups) {
  using X = Eigen::Tensor<T, R, L>;
  return detail::reduce<detail::OpKind::pmax, T, X>(*this, std::move(x), axes, groups, "pmax");
}

template <class X>
auto Context::pmin(const X& x, AxisNames axes, const Groups& groups) {
  using T = typename detail::Operand<X>::T;
  return detail::reduce<detail::OpKind::pmin, T, X>(*this, x, axes, groups, "pmin");
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
  return detail::all_gather<false>(*this, x, axes, axis, groups);
}

template <class X>
auto Context::all_gather(const X& x, AxisNames axes, int axis, tiled_t, const Groups& groups) {
  return detail::all_gather<true>(*this, x, axes, axis, groups);
}

template <class X>
auto Context::psum_scatter(const X& x, AxisNames axes, int scatter_dimension,
                           const Groups& groups) {
  return detail::scatter_sum<false>(*this, x, axes, scatter_dimension, groups);
}

template <class X>
auto Context::psum_scatter(const X& x, AxisNames axes, int scatter_dimension, tiled_t,
                           const Groups& groups) {
  return detail::scatter_sum<true>(*this, x, axes, scatter_dimension, groups);
}

template <class X>
auto Context::all_to_all(const X& x, AxisNames axes, int split_axis, int concat_axis,
                         const Groups& groups) {
  return detail::all_to_all<false, X>(*this, x, axes, split_axis, concat_axis, groups);
}

template <class X>
auto Context::all_to_all(const X& x, AxisNames axes, int split_axis, int concat_axis, tiled_t,
                         const Groups& groups) {
  return detail::all_to_all<true, X>(*this, x, axes, split_axis, concat_axis, groups);
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
  return detail::ppermute<X>(*this, x, axes, perm);
}

template <class T, int R, int L>
Eigen::Tensor<T, R, L> Context::ppermute(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                         const std::vector<std::pair<int, int>>& perm) {
  return detail::ppermute<Eigen::Tensor<T, R, L>>(*this, std::move(x), axes, perm);
}

template <class X>
auto Context::pshuffle(const X& x, AxisNames axes, const std::vector<int>& perm) {
  return detail::pshuffle<X>(*this, x, axes, perm);
}

template <class T, int R, int L>
Eigen::Tensor<T, R, L> Context::pshuffle(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                         const std::vector<int>& perm) {
  return detail::pshuffle<Eigen::Tensor<T, R, L>>(*this, std::move(x), axes, perm);
}

template <class X>
auto Context::pbroadcast(const X& x, AxisNames axes, int source) {
  return detail::pbroadcast<X>(*this, x, axes, source);
}

template <class T, int R, int L>
Eigen::Tensor<T, R, L> Context::pbroadcast(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                           int source) {
  return detail::pbroadcast<Eigen::Tensor<T, R, L>>(*this, std::move(x), axes, source);
}

}  // namespace pmap
