/// @file buffers.hpp
/// @brief A collective's operand and result buffers: inputs as contiguous memory (tensors in
/// place, expressions evaluated once, donated tensors taken over), results in fresh memory
/// or in the device's spare buffers (the pool of Access::take_spare / keep_spare).
#pragma once

#include <type_traits>
#include <utility>

#include <unsupported/Eigen/CXX11/Tensor>

#include "pmap/context.hpp"
#include "pmap/detail/memory.hpp"
#include "pmap/detail/outputs.hpp"
#include "pmap/detail/shape.hpp"
#include "pmap/detail/tensor_traits.hpp"

namespace pmap::detail {

/// A collective's input as contiguous memory: tensors and TensorMaps in place, expressions
/// evaluated once, scalars by address. An owning tensor passed as an rvalue is moved in, and
/// its storage (like an evaluated expression's) may become the result: see owns_storage().
template <class X>
class Operand {
  using Leaf = output_leaf<std::remove_cvref_t<X>>;
  static_assert(Leaf::value,
                "pmap collectives take an Eigen tensor, TensorMap, tensor expression or "
                "arithmetic scalar");

 public:
  using T = typename Leaf::scalar;
  static constexpr int rank = Leaf::rank;
  static constexpr int layout = Leaf::layout;
  static constexpr bool is_scalar = is_arithmetic_scalar_v<std::remove_cvref_t<X>>;

  explicit Operand(const X& x) : shape_(shape_in_place(x)) {
    if constexpr (is_scalar) {
      scalar_ = x;
      data_ = &scalar_;
    } else if constexpr (in_place) {
      data_ = x.data();
    } else {
      owned_ = x;
      data_ = owned_.data();
      shape_ = shape_of_dims(owned_.dimensions(), rank);
    }
  }
  /// Takes over a donated tensor: its storage is the input and may become the result.
  explicit Operand(Eigen::Tensor<T, rank, layout>&& x) : owned_(std::move(x)) {
    data_ = owned_.data();
    // A rank-0 tensor's dimensions are an empty DSizes, which GCC 12 at -O1 takes for an
    // uninitialised argument (-Wmaybe-uninitialized); its shape is the default one anyway.
    if constexpr (rank > 0) shape_ = shape_of_dims(owned_.dimensions(), rank);
  }
  Operand(const Operand&) = delete;
  Operand& operator=(const Operand&) = delete;

  const T* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  /// True when the input lives in storage of its own (an evaluated expression or a donated
  /// tensor), which nobody reads once the collective returns: take() hands it over.
  bool owns_storage() const { return !is_scalar && data_ == owned_.data() && data_ != nullptr; }
  Eigen::Tensor<T, rank, layout> take() { return std::move(owned_); }

 private:
  /// Tensors and TensorMaps are read where they are.
  static constexpr bool in_place =
      !is_scalar && (is_tensor_leaf_v<X> || is_owning_tensor<std::remove_cvref_t<X>>::value);
  /// The shape of an input read in place (built where it is kept: a shape is kMaxRank
  /// dimensions); the default one otherwise, until the constructor knows it.
  static Shape shape_in_place(const X& x) {
    if constexpr (in_place)
      return shape_of_dims(x.dimensions(), rank);
    else
      return Shape{};
  }

  const T* data_ = nullptr;
  Shape shape_;
  T scalar_{};
  Eigen::Tensor<T, rank, layout> owned_;
};

/// An output tensor of scalar U, rank R and layout L with the given shape.
template <class U, int R, int L>
Eigen::Tensor<U, R, L> make_result(const Shape& s) {
  Eigen::Tensor<U, R, L> result(dsizes<U, R, L>(s));
  prepare_result(result.data(), static_cast<std::size_t>(s.size()) * sizeof(U));
  return result;
}

/// make_result, in the device's spare buffer when it has the right type and size.
template <class U, int R, int L>
Eigen::Tensor<U, R, L> make_result(Context& ctx, const Shape& s) {
  auto spare = Access::take_spare<Eigen::Tensor<U, R, L>>(ctx, s.size());
  if (spare.data() == nullptr) return make_result<U, R, L>(s);
  spare.resize(dsizes<U, R, L>(s));  // same element count: keeps the storage
  return spare;
}

/// After a collective: a donated (or evaluated) input nobody reads any more becomes the
/// device's spare buffer.
template <class X>
void recycle(Context& ctx, Operand<X>& op) {
  if constexpr (!Operand<X>::is_scalar)
    if (op.owns_storage()) Access::keep_spare(ctx, op.take());
}

}  // namespace pmap::detail
