/// @file mapped_sink.hpp
/// @brief What the sinks of a call's outputs share (the call's facts, an output's shape), and
/// the part of a mapped output's sink that depends only on its result type (MappedSink),
/// compiled in the library for the common ones (sinks.hpp has the sinks themselves).
#pragma once

#include <array>
#include <cstring>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "pmap/axes.hpp"
#include "pmap/detail/blocks.hpp"
#include "pmap/detail/pool.hpp"
#include "pmap/detail/errors.hpp"
#include "pmap/detail/hash.hpp"
#include "pmap/detail/memory.hpp"
#include "pmap/detail/once.hpp"
#include "pmap/detail/process_blocks.hpp"
#include "pmap/detail/tensor_traits.hpp"
#include "pmap/runtime.hpp"

namespace pmap::detail {

template <class O>
Shape output_shape(const O& value) {
  using U = std::remove_cvref_t<O>;
  if constexpr (is_arithmetic_scalar_v<U>) {
    return Shape{};
  } else if constexpr (requires { value.dimensions(); }) {
    return shape_of_dims(value.dimensions(), output_leaf<U>::rank);
  } else {
    Eigen::DefaultDevice device;
    Eigen::TensorEvaluator<const U, Eigen::DefaultDevice> evaluator(value, device);
    return shape_of_dims(evaluator.dimensions(), output_leaf<U>::rank);
  }
}

/// "float32", or "float32 (ColMajor)" for a column-major tensor: into() names the layout
/// too, since a result of the wrong layout has the right shape and scalar type.
template <class T>
std::string layout_tagged_dtype(int layout) {
  return std::string(dtype_name<T>()) + (layout == Eigen::ColMajor ? " (ColMajor)" : "");
}

/// Facts shared by the sinks of one call.
struct CallInfo {
  int n = 0;
  const Device* devices = nullptr;  ///< device i of this call is devices[i]
  MeshShape mesh;                   ///< the call's devices as a grid (pmap: one axis of n)
  const std::string* name = nullptr;  ///< the {name} of messages
  bool shard = false;               ///< shard_map's messages (pmap's otherwise)
  /// A shard_map across processes: the global mesh, of which `mesh` is this process's box
  /// (whose first device is at global mesh position `first_position`).
  const ProcessSpan* span = nullptr;
  int first_position = 0;
  int id(int i) const { return devices[i].id; }
  /// Mesh position of call device i, for messages.
  int position(int i) const { return first_position + i; }
};

/// An Eigen::Tensor or TensorMap of scalar T and layout L: its elements lie in memory, in
/// the result's order.
template <class V, class T, int L>
inline constexpr bool in_memory_v = false;
template <class T, int R, int O, class I, class T2, int L>
inline constexpr bool in_memory_v<Eigen::Tensor<T, R, O, I>, T2, L> =
    std::is_same_v<T, T2> && (O & Eigen::RowMajor) == (L & Eigen::RowMajor);
template <class P, int O, template <class> class M, class T2, int L>
inline constexpr bool in_memory_v<Eigen::TensorMap<P, O, M>, T2, L> = in_memory_v<std::remove_const_t<P>, T2, L>;

template <class O, class S>
class Sink;

/// What a mapped output's sink does that depends only on the result's scalar, rank and
/// layout, not on the kernel's output type: one per result type, whatever the expressions
/// that produce it, and compiled once in the library for the common ones (src/sinks.cpp).
template <class T, int R, int L>
class MappedSink {
 public:
  using Result = Eigen::Tensor<T, R + 1, L>;

  MappedSink(const CallInfo& call, int axis, int index) : call_(call), index_(index) {
    if (axis < -(R + 1) || axis > R) raise_out_axis(axis, index, R);
    axis_ = axis < 0 ? axis + R + 1 : axis;
  }

  /// Written by the devices already: nothing left for the pass after the call.
  void plan() {
    if (call_.n == 0 && !bound_) result_ = Result(dsizes<T, R + 1, L>(insert_axis(Shape{R}, axis_, 0)));
  }
  bool pass(bool) const { return false; }
  std::size_t bytes() const { return 0; }
  void compare(int) {}
  void place(int, int, int) {}
  void raise_mismatch() const {}
  Result take() { return std::move(result_); }

 protected:
  /// Before device i writes an output of shape s: the first to come allocates the result
  /// (or checks the caller's target); each checks its shape against the first's.
  void begin(int i, const Shape& s);
  /// Block i of the result, copied from an array of shape_ in layout L run by run: no Eigen
  /// assignment to a strided slice to instantiate per output type. place_block (layout.hpp)
  /// with memmove or element by element instead of memcpy: a kernel may return a view of
  /// the target.
  void copy_block(int i, const T* from);
  /// The caller-owned result must have the shape, scalar type and layout the call returns
  /// for a device output of shape s.
  void check_target(const Shape& s) const;

  Eigen::DSizes<Eigen::DenseIndex, R + 1> position(int i) const {
    Eigen::DSizes<Eigen::DenseIndex, R + 1> at;
    for (int a = 0; a < R + 1; ++a) at[a] = a == axis_ ? i : 0;
    return at;
  }
  Eigen::DSizes<Eigen::DenseIndex, R + 1> extent_one() const {
    return dsizes<T, R + 1, L>(insert_axis(shape_, axis_, 1));
  }

  const CallInfo& call_;
  int index_;
  int axis_ = 0;
  Once once_;
  Result result_;
  T* data_ = nullptr;
  Shape full_, shape_;
  int owner_ = 0;
  bool bound_ = false;
  bool target_typed_ = false;  ///< the bound target has this output's scalar, rank and layout
  bool target_rejected_ = false;
  Shape target_shape_;
  std::string target_dtype_;
};

template <class T, int R, int L>
void MappedSink<T, R, L>::begin(int i, const Shape& s) {
  if (Once::Owner owner = once_.claim()) {
    shape_ = s;
    owner_ = i;
    full_ = insert_axis(s, axis_, call_.n);
    if (bound_) {
      try {
        check_target(s);
      } catch (...) {
        target_rejected_ = true;
        owner.publish();  // published as rejected: every device raises the same error
        throw;
      }
    } else {
      result_ = Result(dsizes<T, R + 1, L>(full_));
      data_ = result_.data();
      prepare_result(data_, static_cast<std::size_t>(full_.size()) * sizeof(T));
    }
    owner.publish();
  }
  if (target_rejected_) check_target(s);  // every device fails like the first one
  if (!(s == shape_)) raise_output_shapes_differ(index_, call_.id(owner_), shape_, call_.id(i), s);
}

template <class T, int R, int L>
void MappedSink<T, R, L>::copy_block(int i, const T* from) {
  if (shape_.size() == 0) return;
  const Split3 split = split_around(insert_axis(shape_, axis_, 1), axis_, L);
  const std::int64_t run = split.inner, step = run * call_.n;
  T* to = data_ + i * run;
  for (std::int64_t o = 0; o < split.outer; ++o) {
    if (run < 16)
      for (std::int64_t k = 0; k < run; ++k) to[o * step + k] = from[o * run + k];
    else
      std::memmove(to + o * step, from + o * run, static_cast<std::size_t>(run) * sizeof(T));
  }
}

template <class T, int R, int L>
void MappedSink<T, R, L>::check_target(const Shape& s) const {
  const Shape expected = insert_axis(s, axis_, call_.n);
  if (!target_typed_ || !(expected == target_shape_))
    raise_into_mismatch(index_, layout_tagged_dtype<T>(L).c_str(), expected, target_dtype_.c_str(),
                        target_shape_);
}

/// The result types whose MappedSink the library compiles (src/sinks.cpp): float and double
/// device outputs of rank 0 to 2, the tensors in either layout. Only these: declaring one
/// instantiates its class in every program (12 ms of parse each).
#define PMAP_COMMON_MAPPED_SINKS(X, T)                                                         \
  X(T, 0, Eigen::RowMajor) X(T, 1, Eigen::RowMajor) X(T, 1, Eigen::ColMajor)                   \
  X(T, 2, Eigen::RowMajor) X(T, 2, Eigen::ColMajor)
#define PMAP_EXTERN_MAPPED_SINK(T, R, L) extern template class MappedSink<T, R, L>;
PMAP_COMMON_MAPPED_SINKS(PMAP_EXTERN_MAPPED_SINK, float)
PMAP_COMMON_MAPPED_SINKS(PMAP_EXTERN_MAPPED_SINK, double)
#undef PMAP_EXTERN_MAPPED_SINK

}  // namespace pmap::detail
