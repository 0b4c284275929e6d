/// @file sinks.hpp
/// @brief The sinks of a call's outputs (outputs.hpp): a mapped output written by each device
/// straight into its place in the result, and a block output (replicated or shard_map) kept
/// per device and assembled once every device returned (SPEC 2.2, 3.2).
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
#include "pmap/detail/mapped_sink.hpp"
#include "pmap/detail/memory.hpp"
#include "pmap/detail/once.hpp"
#include "pmap/detail/process_blocks.hpp"
#include "pmap/detail/tensor_traits.hpp"
#include "pmap/runtime.hpp"

namespace pmap::detail {

/// A mapped output: the device axis is inserted at `axis`; each device writes its place.
template <class O>
class Sink<O, int>
    : public MappedSink<typename output_leaf<std::remove_cvref_t<O>>::scalar,
                        output_leaf<std::remove_cvref_t<O>>::rank,
                        output_leaf<std::remove_cvref_t<O>>::layout> {
  using Tr = output_leaf<std::remove_cvref_t<O>>;
  using T = typename Tr::scalar;
  static constexpr int R = Tr::rank;
  static constexpr int L = Tr::layout;
  using Base = MappedSink<T, R, L>;

 public:
  using typename Base::Result;

  Sink(const CallInfo& call, int axis, int index) : Base(call, axis, index) {}

  /// Writes into a caller-owned result instead of allocating one. Its shape is checked
  /// against what the call returns: here when that is known in advance (scalar outputs),
  /// else by the first device to finish, before anything is written.
  template <class Target>
  void bind(Target& target) {
    using TT = tensor_leaf<std::remove_cvref_t<Target>>;
    this->target_shape_ = shape_of_dims(target.dimensions(), TT::rank);
    this->target_dtype_ = layout_tagged_dtype<typename TT::scalar>(TT::layout);
    if constexpr (std::is_same_v<typename TT::scalar, T> && TT::rank == R + 1 && TT::layout == L) {
      this->data_ = target.data();  // nullptr for an empty target, which is still a valid one
      this->target_typed_ = true;
    }
    this->bound_ = true;
    if constexpr (R == 0) this->check_target(Shape{});
  }

  template <class V>
  void write(int i, const V& value) {
    if constexpr (is_core_dense_v<V>) {
      const typename V::PlainObject& plain = value;  // the object itself, or evaluated
      write(i, core_as_tensor<V>(plain));
    } else {
      write_tensor(i, value);
    }
  }

 private:
  template <class V>
  void write_tensor(int i, const V& value) {
    this->begin(i, output_shape(value));
    T* const data = this->data_;
    if constexpr (is_arithmetic_scalar_v<std::remove_cvref_t<V>>) {
      data[i] = value;
    } else if constexpr (in_memory_v<std::remove_cvref_t<V>, T, L>) {
      this->copy_block(i, value.data());
    } else {
      const Shape& shape = this->shape_;
      const bool contiguous = (L == Eigen::RowMajor) ? this->axis_ == 0 : this->axis_ == R;
      if (contiguous)
        Eigen::TensorMap<Eigen::Tensor<T, R, L>>(data + shape.size() * i, dsizes<T, R, L>(shape)) =
            value;
      else  // a slice of extent 1 along the device axis, not chip(): GCC 12 -Warray-bounds
        Eigen::TensorMap<Eigen::Tensor<T, R + 1, L>>(data, dsizes<T, R + 1, L>(this->full_))
            .slice(this->position(i), this->extent_one()) = value.reshape(this->extent_one());
    }
  }
};

/// An output assembled once every device returned: each device's value is kept; plan()
/// finds the result's shape from every block, then the devices, in parallel, compare their
/// value with their replica along each mesh axis the partition does not name (compare())
/// and the first of each set of replicas copies its block into the result (place()).
/// shard_map's outputs, and pmap's replicated ones (out_axes none: nothing split over a
/// one-axis mesh).
template <class O>
class BlockSink {
  using Tr = output_leaf<std::remove_cvref_t<O>>;
  using T = typename Tr::scalar;
  static constexpr int R = Tr::rank;
  static constexpr int L = Tr::layout;

 public:
  using Result = Eigen::Tensor<T, R, L>;

  BlockSink(const CallInfo& call, const Partition& partition, int index)
      : call_(&call), partition_(partition), index_(index),
        values_(static_cast<std::size_t>(call.n)), mismatch_(static_cast<std::size_t>(call.n)) {}
  /// Not noexcept: a rank-0 Eigen::Tensor allocates its element even when default
  /// constructed, and an allocation that fails here must reach the caller as bad_alloc.
  BlockSink(BlockSink&& other)
      : call_(other.call_), partition_(other.partition_), index_(other.index_),
        values_(std::move(other.values_)), mismatch_(std::move(other.mismatch_)) {}

  /// The caller-owned result is checked in plan() and written by place().
  template <class Target>
  void bind(Target& target) {
    using TT = tensor_leaf<std::remove_cvref_t<Target>>;
    target_shape_ = shape_of_dims(target.dimensions(), TT::rank);
    target_dtype_ = layout_tagged_dtype<typename TT::scalar>(TT::layout);
    bound_ = true;
    if constexpr (std::is_same_v<typename TT::scalar, T> && TT::rank == R && TT::layout == L) {
      target_ = target.data();  // nullptr for an empty target, which is still a valid one
      target_typed_ = true;
    }
  }

  /// Keeps device i's value: an owning tensor of the result's type returned by value is
  /// moved (its storage is then the block place() copies, with no copy of its own).
  template <class V>
  void write(int i, V&& value) requires(std::is_same_v<std::remove_cvref_t<V>, Result> &&
                                        !std::is_lvalue_reference_v<V>) {
    values_[static_cast<std::size_t>(i)] = std::move(value);
  }
  template <class V>
  void write(int i, const V& value) {
    Result& slot = values_[static_cast<std::size_t>(i)];
    if constexpr (is_core_dense_v<V>) {
      const typename V::PlainObject& plain = value;  // the object itself, or evaluated
      slot = core_as_tensor<V>(plain);
    } else if constexpr (is_arithmetic_scalar_v<std::remove_cvref_t<V>>) {
      slot = Result();
      slot() = value;
    } else {
      slot = value;
    }
  }

  /// On the caller, after every device returned: the blocks agree outside the split
  /// dimensions (E12), the result's shape is their concatenation, the target matches it.
  void plan() {
    const MeshShape& mesh = call_->mesh;
    const int n = call_->n;
    Shape full = shape(0);
    for (int d = 0; d < R; ++d) {
      const auto u = static_cast<std::size_t>(d);
      const bool split = d < partition_.rank && partition_.count[u] > 0;
      const int k = split ? partition_.blocks(d, mesh) : 1;
      // The first device holding each block along d fixes that block's extent.
      std::vector<int> first(static_cast<std::size_t>(k), -1);
      for (int i = 0; i < n; ++i) {
        const int b = split ? partition_.block_index(d, mesh, i) : 0;
        int& f = first[static_cast<std::size_t>(b)];
        if (f < 0) f = i;
        else if (shape(i).dims[u] != shape(f).dims[u]) raise_shapes(f, i);
      }
      full.dims[u] = 0;
      for (int b = 0; b < k; ++b) full.dims[u] += shape(first[static_cast<std::size_t>(b)]).dims[u];
      starts_[u].assign(static_cast<std::size_t>(k), 0);
      for (int b = 1; b < k; ++b)
        starts_[u][static_cast<std::size_t>(b)] =
            starts_[u][static_cast<std::size_t>(b - 1)] + shape(first[static_cast<std::size_t>(b - 1)]).dims[u];
    }
    full_ = full;
    if (bound_) {
      if (!target_typed_ || !(target_shape_ == full))
        raise_into_mismatch(index_, layout_tagged_dtype<T>(L).c_str(), full, target_dtype_.c_str(),
                            target_shape_);
      data_ = target_;
    } else if (placed_by_copy()) {
      result_ = Result(dsizes<T, R, L>(full));
      data_ = result_.data();
      prepare_result(data_, static_cast<std::size_t>(full.size()) * sizeof(T));
    }
  }

  /// Device i: its value against its replica one step down each axis the partition does not
  /// name (bitwise); the first mismatch is kept for raise_mismatch().
  void compare(int i) {
    const MeshShape& mesh = call_->mesh;
    for (int a = 0; a < mesh.num_axes; ++a) {
      const int c = mesh.coord(i, a);
      if (c == 0 || partition_.names(a)) continue;
      const int j = i - c * mesh.stride(a);
      const Result& mine = values_[static_cast<std::size_t>(i)];
      const Result& theirs = values_[static_cast<std::size_t>(j)];
      if (mine.size() > 0 &&  // no memcmp on an empty tensor's nullptr
          std::memcmp(mine.data(), theirs.data(), static_cast<std::size_t>(mine.size()) * sizeof(T)) != 0) {
        mismatch_[static_cast<std::size_t>(i)] = {j, a};
        return;
      }
    }
  }

  /// Device i, if it is the first of its replicas: part `part` of `parts` of its block into
  /// the result (the block cut along its outermost dimension in memory).
  void place(int i, int part, int parts) {
    if (!first_replica(i)) return;
    const Result& v = values_[static_cast<std::size_t>(i)];
    if (!placed_by_copy() || v.size() == 0) return;  // take() moves device 0's value
    Block block{full_, {}, shape(i)};
    for (int d = 0; d < R; ++d) {
      const auto u = static_cast<std::size_t>(d);
      if (d < partition_.rank && partition_.count[u] > 0)
        block.start[u] = starts_[u][static_cast<std::size_t>(partition_.block_index(d, call_->mesh, i))];
    }
    const auto size = static_cast<std::size_t>(v.size()) * sizeof(T);
    const T* from = v.data();
    if constexpr (R > 0) {
      const auto outer = static_cast<std::size_t>(L == Eigen::RowMajor ? 0 : R - 1);
      const std::int64_t extent = block.extent.dims[outer];
      const std::int64_t lo = extent * part / parts, hi = extent * (part + 1) / parts;
      if (lo == hi) return;
      from += lo * (v.size() / extent);
      block.start[outer] += lo;
      block.extent.dims[outer] = hi - lo;
    } else if (part > 0) {
      return;
    }
    copy_into_block(data_, from, block, L, streams(size));
  }

  /// After compare() on every device: the check_replicated error of the first device (in
  /// mesh order) that differs from its replica.
  void raise_mismatch() const {
    for (int i = 0; i < call_->n; ++i) {
      const Mismatch& m = mismatch_[static_cast<std::size_t>(i)];
      if (m.peer < 0) continue;
      if (!call_->shard) raise_not_replicated(index_, i);
      raise_not_replicated_along(*call_->name, index_, *call_->mesh.names[static_cast<std::size_t>(m.axis)],
                                 call_->position(i), call_->position(m.peer));
    }
  }

  /// Across processes (call.span), after plan(): this process block's shape and, when other
  /// processes hold the same block and `check`, the hash of each distinct device block.
  OutputDigest digest(bool check) const {
    OutputDigest d{index_, partition_, full_, {}, {}};
    if (!check || !call_->span->replicated(partition_)) return d;
    for (int i = 0; i < call_->n; ++i) {
      if (!first_replica(i)) continue;
      const Result& v = values_[static_cast<std::size_t>(i)];
      d.devices.push_back(i);
      d.hashes.push_back(hash_bytes(kHashSeed, v.data(), static_cast<std::size_t>(v.size()) * sizeof(T)));
    }
    return d;
  }

  /// Whether the pass after the call has work: copies, or (check) replicas to compare.
  bool pass(bool check) const {
    if (placed_by_copy()) return true;
    if (!check) return false;
    for (int a = 0; a < call_->mesh.num_axes; ++a)
      if (!partition_.names(a) && call_->mesh.sizes[static_cast<std::size_t>(a)] > 1) return true;
    return false;
  }

  /// Bytes the pass reads: every device's value.
  std::size_t bytes() const {
    std::size_t b = 0;
    for (const Result& v : values_) b += static_cast<std::size_t>(v.size()) * sizeof(T);
    return b;
  }

  Result take() {
    if (placed_by_copy()) return std::move(result_);
    return std::move(values_[0]);
  }

 private:
  struct Mismatch {
    int peer = -1, axis = 0;
  };
  Shape shape(int i) const { return output_shape(values_[static_cast<std::size_t>(i)]); }
  /// Device i is the first of its replicas (coordinate 0 on every axis the partition omits).
  bool first_replica(int i) const {
    const MeshShape& mesh = call_->mesh;
    for (int a = 0; a < mesh.num_axes; ++a)
      if (mesh.coord(i, a) != 0 && !partition_.names(a)) return false;
    return true;
  }
  /// A result that is device 0's value whole (nothing split, nothing bound) is moved, not copied.
  bool placed_by_copy() const { return bound_ || partition_.rank > 0; }

  [[noreturn]] void raise_shapes(int first, int i) const {
    if (!call_->shard) raise_output_shapes_differ(index_, call_->id(first), shape(first), call_->id(i), shape(i));
    raise_block_shapes_differ(*call_->name, index_, call_->id(i), call_->position(first), shape(first),
                              call_->position(i), shape(i));
  }

  const CallInfo* call_;
  Partition partition_;
  int index_;
  std::vector<Result> values_;
  std::vector<Mismatch> mismatch_;
  std::array<std::vector<std::int64_t>, kMaxRank> starts_;  ///< block starts along each dim
  Shape full_;
  Result result_;
  T* data_ = nullptr;
  T* target_ = nullptr;
  bool bound_ = false;
  bool target_typed_ = false;
  Shape target_shape_;
  std::string target_dtype_;
};

/// A replicated pmap output (out_axes none): device 0's value, checked against the others.
template <class O>
class Sink<O, none_t> : public BlockSink<O> {
 public:
  Sink(const CallInfo& call, none_t, int index) : BlockSink<O>(call, Partition{}, index) {}
};

/// A shard_map output: blocks concatenated along the split dimensions, replicated along the
/// mesh axes the partition does not name.
template <class O>
class Sink<O, Partition> : public BlockSink<O> {
 public:
  Sink(const CallInfo& call, const Partition& partition, int index)
      : BlockSink<O>(call, partition, index) {}
};

}  // namespace pmap::detail
