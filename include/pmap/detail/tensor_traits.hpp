/// @file tensor_traits.hpp
/// @brief Compile-time facts about Eigen tensors, expressions and argument trees.
#pragma once

#include <array>
#include <complex>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <unsupported/Eigen/CXX11/Tensor>

#include "pmap/detail/shape.hpp"

namespace pmap::detail {

// ---- dtype names (numpy spelling) --------------------------------------------------------
template <class T>
constexpr const char* dtype_name() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, bool>) return "bool";
  else if constexpr (std::is_same_v<U, float>) return "float32";
  else if constexpr (std::is_same_v<U, double>) return "float64";
  else if constexpr (std::is_same_v<U, long double>) return "float128";
  else if constexpr (std::is_same_v<U, Eigen::half>) return "float16";
  else if constexpr (std::is_same_v<U, Eigen::bfloat16>) return "bfloat16";
  else if constexpr (std::is_same_v<U, std::complex<float>>) return "complex64";
  else if constexpr (std::is_same_v<U, std::complex<double>>) return "complex128";
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U>) {
    if constexpr (sizeof(U) == 1) return "int8";
    else if constexpr (sizeof(U) == 2) return "int16";
    else if constexpr (sizeof(U) == 4) return "int32";
    else return "int64";
  } else if constexpr (std::is_integral_v<U>) {
    if constexpr (sizeof(U) == 1) return "uint8";
    else if constexpr (sizeof(U) == 2) return "uint16";
    else if constexpr (sizeof(U) == 4) return "uint32";
    else return "uint64";
  } else {
    return "object";
  }
}

// ---- tensor leaves -----------------------------------------------------------------------
/// An argument leaf that is an Eigen::Tensor or a TensorMap of one (const or not).
template <class T>
struct tensor_leaf : std::false_type {};
template <class S, int R, int O, class I>
struct tensor_leaf<Eigen::Tensor<S, R, O, I>> : std::true_type {
  using scalar = S;
  static constexpr int rank = R;
  static constexpr int layout = (O & Eigen::RowMajor) ? Eigen::RowMajor : Eigen::ColMajor;
};
template <class S, int R, int O, class I, int MO, template <class> class MP>
struct tensor_leaf<Eigen::TensorMap<Eigen::Tensor<S, R, O, I>, MO, MP>>
    : tensor_leaf<Eigen::Tensor<S, R, O, I>> {};
template <class S, int R, int O, class I, int MO, template <class> class MP>
struct tensor_leaf<Eigen::TensorMap<const Eigen::Tensor<S, R, O, I>, MO, MP>>
    : tensor_leaf<Eigen::Tensor<S, R, O, I>> {};

template <class T>
inline constexpr bool is_tensor_leaf_v = tensor_leaf<std::remove_cvref_t<T>>::value;

/// What the kernel receives for a leaf mapped along one axis, or broadcast whole.
template <class T, bool Mapped>
using leaf_view_t = Eigen::TensorMap<const Eigen::Tensor<
    typename tensor_leaf<std::remove_cvref_t<T>>::scalar,
    // A mapped rank-0 leaf is E3 at run time; its (never built) view keeps rank 0.
    tensor_leaf<std::remove_cvref_t<T>>::rank - (Mapped && tensor_leaf<std::remove_cvref_t<T>>::rank > 0 ? 1 : 0),
    tensor_leaf<std::remove_cvref_t<T>>::layout>>;

// ---- argument trees: tensors, and vector/array/tuple of trees ------------------------------
template <class T>
struct is_tree : std::bool_constant<is_tensor_leaf_v<T>> {};
template <class T, class A>
struct is_tree<std::vector<T, A>> : is_tree<std::remove_cv_t<T>> {};
template <class T, std::size_t N>
struct is_tree<std::array<T, N>> : is_tree<std::remove_cv_t<T>> {};
template <class... Ts>
struct is_tree<std::tuple<Ts...>> : std::bool_constant<(is_tree<std::remove_cv_t<Ts>>::value && ...)> {};
template <class T>
inline constexpr bool is_tree_v = is_tree<std::remove_cvref_t<T>>::value;

/// The view type of a whole argument tree: the same container of leaf views.
template <class T, bool Mapped, class = void>
struct tree_view {
  using type = const T&;  // not a tree: broadcast by const reference
};
template <class T, bool Mapped>
struct tree_view<T, Mapped, std::enable_if_t<is_tensor_leaf_v<T>>> {
  using type = leaf_view_t<T, Mapped>;
};
template <class T, class A, bool Mapped>
struct tree_view<std::vector<T, A>, Mapped, std::enable_if_t<is_tree_v<T>>> {
  using type = std::vector<typename tree_view<std::remove_cv_t<T>, Mapped>::type>;
};
template <class T, std::size_t N, bool Mapped>
struct tree_view<std::array<T, N>, Mapped, std::enable_if_t<is_tree_v<T>>> {
  using type = std::array<typename tree_view<std::remove_cv_t<T>, Mapped>::type, N>;
};
template <class... Ts, bool Mapped>
struct tree_view<std::tuple<Ts...>, Mapped, std::enable_if_t<(is_tree_v<Ts> && ...)>> {
  using type = std::tuple<typename tree_view<std::remove_cv_t<Ts>, Mapped>::type...>;
};

// ---- outputs -----------------------------------------------------------------------------
template <class T>
inline constexpr bool is_arithmetic_scalar_v =
    std::is_arithmetic_v<T> || std::is_same_v<T, std::complex<float>> ||
    std::is_same_v<T, std::complex<double>> || std::is_same_v<T, Eigen::half> ||
    std::is_same_v<T, Eigen::bfloat16>;

template <class T>
inline constexpr bool is_tensor_expr_v =
    std::is_base_of_v<Eigen::TensorBase<std::remove_cvref_t<T>, Eigen::ReadOnlyAccessors>,
                      std::remove_cvref_t<T>>;

/// Scalar type, rank and layout of one output (a tensor expression or an arithmetic scalar).
template <class T, class = void>
struct output_leaf : std::false_type {};
template <class T>
struct output_leaf<T, std::enable_if_t<is_arithmetic_scalar_v<T>>> : std::true_type {
  using scalar = T;
  static constexpr int rank = 0;
  static constexpr int layout = Eigen::RowMajor;
};
template <class T>
struct output_leaf<T, std::enable_if_t<is_tensor_expr_v<T>>> : std::true_type {
  using traits = Eigen::internal::traits<std::remove_cvref_t<T>>;
  using scalar = std::remove_cv_t<typename traits::Scalar>;
  static constexpr int rank = traits::NumDimensions;
  static constexpr int layout = traits::Layout;
};

// ---- Eigen Core dense objects (SPEC 10) ------------------------------------------------------
/// Eigen::Matrix, Eigen::Array, Maps and expressions of them.
template <class T>
inline constexpr bool is_core_dense_v =
    std::is_base_of_v<Eigen::DenseBase<std::remove_cvref_t<T>>, std::remove_cvref_t<T>>;
/// Eigen::Matrix and Eigen::Array themselves (their own contiguous storage).
template <class T>
inline constexpr bool is_core_plain_v =
    std::is_base_of_v<Eigen::PlainObjectBase<std::remove_cvref_t<T>>, std::remove_cvref_t<T>>;

/// Eigen::Map and Eigen::Ref of a Core object.
template <class T>
struct is_core_map : std::false_type {};
template <class P, int O, class S>
struct is_core_map<Eigen::Map<P, O, S>> : std::true_type {};
template <class P, int O, class S>
struct is_core_map<Eigen::Ref<P, O, S>> : std::true_type {};
template <class T>
inline constexpr bool is_core_map_v = is_core_map<std::remove_cvref_t<T>>::value;

/// A Core object as a tensor: a vector (one dimension fixed to 1) is rank 1, anything else
/// rank 2, in its storage order.
template <class T>
struct core_shape {
  using P = typename std::remove_cvref_t<T>::PlainObject;
  static constexpr int rank = (P::RowsAtCompileTime == 1 || P::ColsAtCompileTime == 1) ? 1 : 2;
  static constexpr int layout = P::IsRowMajor ? Eigen::RowMajor : Eigen::ColMajor;
};

/// A Core kernel output: Matrix / Array / Map (expressions are evaluated by the kernel).
template <class T>
struct output_leaf<T, std::enable_if_t<is_core_dense_v<T>>> : std::true_type {
  using scalar = typename std::remove_cvref_t<T>::Scalar;
  static constexpr int rank = core_shape<T>::rank;
  static constexpr int layout = core_shape<T>::layout;
};

/// The storage of a Core object as a TensorMap of its rank and storage order: of the object
/// itself when it is a Matrix or Array, else of `plain`, the object evaluated into it.
template <class C>
auto core_as_tensor(const typename std::remove_cvref_t<C>::PlainObject& plain) {
  using P = typename std::remove_cvref_t<C>::PlainObject;
  constexpr int R = core_shape<C>::rank;
  using TM = Eigen::TensorMap<const Eigen::Tensor<typename P::Scalar, R, core_shape<C>::layout>>;
  if constexpr (R == 1)
    return TM(plain.data(), plain.size());
  else
    return TM(plain.data(), plain.rows(), plain.cols());
}

// ---- dangling expressions (SPEC 2.2) -------------------------------------------------------
/// True when an expression tree holds an owning Eigen tensor by reference.
template <class T>
struct holds_owning_tensor : std::false_type {};
template <class T>
struct holds_owning_tensor<const T> : holds_owning_tensor<T> {};
template <class T>
struct holds_owning_tensor<T&> : holds_owning_tensor<T> {};
template <class S, int R, int O, class I>
struct holds_owning_tensor<Eigen::Tensor<S, R, O, I>> : std::true_type {};
template <class S, class D, int O, class I>
struct holds_owning_tensor<Eigen::TensorFixedSize<S, D, O, I>> : std::true_type {};
template <class P, int O, template <class> class MP>
struct holds_owning_tensor<Eigen::TensorMap<P, O, MP>> : std::false_type {};
template <template <class...> class Node, class... Args>
struct holds_owning_tensor<Node<Args...>>
    : std::bool_constant<(holds_owning_tensor<Args>::value || ...)> {};
template <class Op, class Dims, class X, template <class> class MP>
struct holds_owning_tensor<Eigen::TensorReductionOp<Op, Dims, X, MP>> : holds_owning_tensor<X> {};
template <Eigen::DenseIndex D, class X>
struct holds_owning_tensor<Eigen::TensorChippingOp<D, X>> : holds_owning_tensor<X> {};
template <Eigen::DenseIndex R, Eigen::DenseIndex C, class X>
struct holds_owning_tensor<Eigen::TensorImagePatchOp<R, C, X>> : holds_owning_tensor<X> {};
template <Eigen::DenseIndex P, Eigen::DenseIndex R, Eigen::DenseIndex C, class X>
struct holds_owning_tensor<Eigen::TensorVolumePatchOp<P, R, C, X>> : holds_owning_tensor<X> {};
template <class X, template <class> class MP>
struct holds_owning_tensor<Eigen::TensorEvalToOp<X, MP>> : holds_owning_tensor<X> {};
template <class F, class X, int A, int B>
struct holds_owning_tensor<Eigen::TensorFFTOp<F, X, A, B>> : holds_owning_tensor<X> {};

/// An owning tensor returned by value is fine; only expressions over one dangle.
template <class T>
struct is_owning_tensor : std::false_type {};
template <class S, int R, int O, class I>
struct is_owning_tensor<Eigen::Tensor<S, R, O, I>> : std::true_type {};
template <class S, class D, int O, class I>
struct is_owning_tensor<Eigen::TensorFixedSize<S, D, O, I>> : std::true_type {};

/// An expression that would dangle once the kernel returns.
template <class T>
inline constexpr bool is_dangling_expr_v =
    is_tensor_expr_v<T> && !is_owning_tensor<std::remove_cvref_t<T>>::value &&
    holds_owning_tensor<std::remove_cvref_t<T>>::value;

}  // namespace pmap::detail
