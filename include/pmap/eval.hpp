/// @file eval.hpp
/// @brief pmap::eval: materialise an Eigen expression into an owning tensor.
#pragma once

#include "pmap/detail/tensor_traits.hpp"

namespace pmap {

/// @brief An owning `Eigen::Tensor` of the expression's scalar, rank and layout.
///
/// Return it from a kernel instead of an expression over a kernel-local tensor or a
/// collective's result, which would dangle (SPEC 2.2).
/// <!-- example-context: kernel -->
/// @code
///   return pmap::eval(x + ctx.psum(x));
/// @endcode
template <class E>
auto eval(const E& expr) {
  using Leaf = detail::output_leaf<E>;
  static_assert(Leaf::value, "pmap::eval takes an Eigen tensor expression or a scalar");
  return Eigen::Tensor<typename Leaf::scalar, Leaf::rank, Leaf::layout>(expr);
}

}  // namespace pmap
