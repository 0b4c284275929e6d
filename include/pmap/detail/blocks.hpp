/// @file blocks.hpp
/// @brief The one mapping engine's geometry: the mesh of a call, how a tensor is split over
/// it (a Partition), the block each device gets (SPEC 9's rule), and the views of blocks.
///
/// Both front-ends speak it: shard_map resolves its PartitionSpecs to Partitions; pmap is a
/// one-axis mesh of n whose mapped dimension (of size n) is split into blocks of one and
/// squeezed.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <unsupported/Eigen/CXX11/Tensor>

#include "pmap/detail/layout.hpp"
#include "pmap/detail/shape.hpp"
#include "pmap/detail/tensor_traits.hpp"

namespace pmap::detail {

inline constexpr int kMaxMeshAxes = 8;

/// The devices of one call as a row-major grid of named axes (pmap: one axis of n).
struct MeshShape {
  int num_axes = 1;
  std::array<int, kMaxMeshAxes> sizes{};
  std::array<const std::string*, kMaxMeshAxes> names{};  ///< owned by the Mesh or Options
  int size() const {
    int n = 1;
    for (int a = 0; a < num_axes; ++a) n *= sizes[static_cast<std::size_t>(a)];
    return n;
  }
  int stride(int a) const {
    int s = 1;
    for (int b = num_axes - 1; b > a; --b) s *= sizes[static_cast<std::size_t>(b)];
    return s;
  }
  /// Coordinate of call device i along axis a.
  int coord(int i, int a) const { return (i / stride(a)) % sizes[static_cast<std::size_t>(a)]; }
  static MeshShape line(int n, const std::string* name) {
    MeshShape m;
    m.sizes[0] = n;
    m.names[0] = name;
    return m;
  }
};

/// How one tensor is split: dimension d over the mesh axes axes[d][0..count[d]) (major to
/// minor); the axes no dimension names replicate it.
struct Partition {
  int rank = 0;
  std::array<int, kMaxRank> count{};
  std::array<std::array<int, kMaxMeshAxes>, kMaxRank> axes{};

  bool names(int axis) const {
    for (int d = 0; d < rank; ++d)
      for (int j = 0; j < count[static_cast<std::size_t>(d)]; ++j)
        if (axes[static_cast<std::size_t>(d)][static_cast<std::size_t>(j)] == axis) return true;
    return false;
  }
  /// Number of blocks along d.
  int blocks(int d, const MeshShape& mesh) const {
    int k = 1;
    for (int j = 0; j < count[static_cast<std::size_t>(d)]; ++j)
      k *= mesh.sizes[static_cast<std::size_t>(axes[static_cast<std::size_t>(d)][static_cast<std::size_t>(j)])];
    return k;
  }
  /// The block index of call device i along d (its coordinates on axes[d], row-major).
  int block_index(int d, const MeshShape& mesh, int i) const {
    int b = 0;
    for (int j = 0; j < count[static_cast<std::size_t>(d)]; ++j) {
      const int a = axes[static_cast<std::size_t>(d)][static_cast<std::size_t>(j)];
      b = b * mesh.sizes[static_cast<std::size_t>(a)] + mesh.coord(i, a);
    }
    return b;
  }
};

/// Block b of k along a dimension of size s: s / k elements, one more for the first s % k
/// blocks, each after the blocks before it (SPEC 9).
struct Range {
  std::int64_t start = 0, extent = 0;
};
inline Range block_range(std::int64_t s, std::int64_t k, std::int64_t b) {
  const std::int64_t q = s / k, r = s % k;
  return {b * q + std::min(b, r), q + (b < r ? 1 : 0)};
}

/// Where one device's block lies in a tensor of shape `full`.
struct Block {
  Shape full;
  std::array<std::int64_t, kMaxRank> start{};
  Shape extent;  ///< the block's shape (same rank as full)
};

/// The block of call device i of a tensor of shape `full` split by `p`.
inline Block block_of(const Shape& full, const Partition& p, const MeshShape& mesh, int i) {
  Block b{full, {}, full};
  for (int d = 0; d < p.rank && d < full.rank; ++d) {
    if (p.count[static_cast<std::size_t>(d)] == 0) continue;
    const Range r = block_range(full.dims[static_cast<std::size_t>(d)], p.blocks(d, mesh),
                                p.block_index(d, mesh, i));
    b.start[static_cast<std::size_t>(d)] = r.start;
    b.extent.dims[static_cast<std::size_t>(d)] = r.extent;
  }
  return b;
}

/// pmap's block: position i of dimension d (extent one there, to be squeezed).
inline Block slice_of(const Shape& full, int d, std::int64_t i) {
  Block b{full, {}, full};
  b.start[static_cast<std::size_t>(d)] = i;
  b.extent.dims[static_cast<std::size_t>(d)] = 1;
  return b;
}

/// Offset of the block's first element in the full tensor.
inline std::int64_t block_offset(const Block& b, int layout) {
  const auto st = strides_of(b.full, layout);
  std::int64_t off = 0;
  for (int d = 0; d < b.full.rank; ++d) off += b.start[static_cast<std::size_t>(d)] * st[static_cast<std::size_t>(d)];
  return off;
}

/// A block is one run of memory when, from the innermost dimension outwards, whole
/// dimensions are followed by at most one partial one and then only extents of one (or it
/// is empty).
inline bool block_contiguous(const Block& b, int layout) {
  if (b.extent.size() == 0) return true;
  bool partial = false;
  for (int i = 0; i < b.full.rank; ++i) {
    const auto d = static_cast<std::size_t>(layout == Eigen::RowMajor ? b.full.rank - 1 - i : i);
    if (partial) {
      if (b.extent.dims[d] != 1) return false;
    } else if (b.extent.dims[d] != b.full.dims[d]) {
      partial = true;
    }
  }
  return true;
}

/// The box that copies between a block of the full tensor (`full_side` true: src) and a
/// dense tensor of the block's shape, in memory order.
inline Box block_box(const Block& b, int layout, bool from_full) {
  const auto full_st = strides_of(b.full, layout);
  const auto dense_st = strides_of(b.extent, layout);
  Box box;
  box.rank = b.full.rank;
  for (int i = 0; i < box.rank; ++i) {
    const auto d = static_cast<std::size_t>(layout == Eigen::RowMajor ? i : box.rank - 1 - i);
    const auto u = static_cast<std::size_t>(i);
    box.extent[u] = b.extent.dims[d];
    box.src_stride[u] = from_full ? full_st[d] : dense_st[d];
    box.dst_stride[u] = from_full ? dense_st[d] : full_st[d];
  }
  return box;
}

/// Copies `block` out of `full` into the dense `dst`.
template <class T>
void copy_from_block(T* dst, const T* full, const Block& block, int layout) {
  copy_box(dst, full + block_offset(block, layout), block_box(block, layout, true), false);
}
/// Copies the dense `src` into `block` of `full`.
template <class T>
void copy_into_block(T* full, const T* src, const Block& block, int layout, bool stream) {
  copy_box(full + block_offset(block, layout), src, block_box(block, layout, false), stream);
}

/// Staging buffers of one device for blocks that are strided in memory.
class Staging {
 public:
  template <class T>
  T* allocate(std::int64_t count) {
    buffers_.push_back(std::make_unique<unsigned char[]>(
        static_cast<std::size_t>(count) * sizeof(T)));
    return reinterpret_cast<T*>(buffers_.back().get());
  }

 private:
  std::vector<std::unique_ptr<unsigned char[]>> buffers_;
};

/// The view a kernel receives of `block` of a tensor leaf: zero-copy when the block is one
/// run of memory, else a staged copy. Squeeze: the block has extent one along `squeeze`,
/// which the view drops (pmap).
template <bool Squeeze, class Leaf>
auto block_view(const Leaf& leaf, const Block& block, int squeeze, Staging& staging) {
  using Tr = tensor_leaf<std::remove_cvref_t<Leaf>>;
  using T = typename Tr::scalar;
  constexpr int R = Tr::rank;
  constexpr int L = Tr::layout;
  constexpr int V = R - (Squeeze && R > 0 ? 1 : 0);
  const Shape shape = Squeeze && R > 0 ? remove_axis(block.extent, squeeze) : block.extent;
  const auto dims = dsizes<T, V, L>(shape);
  if (block_contiguous(block, L))
    return Eigen::TensorMap<const Eigen::Tensor<T, V, L>>(
        block.extent.size() == 0 ? leaf.data() : leaf.data() + block_offset(block, L), dims);
  T* buf = staging.allocate<T>(block.extent.size());
  copy_from_block(buf, leaf.data(), block, L);
  return Eigen::TensorMap<const Eigen::Tensor<T, V, L>>(buf, dims);
}

/// pmap's view of position i along dimension d of a tensor leaf when that slice is one run
/// of memory (every dimension outside d in memory order has extent one): block_view's
/// zero-copy case without building a Block, which is most of a dispatch's work per device
/// at small sizes. Nothing when the slice is strided.
template <class Leaf>
auto contiguous_slice(const Leaf& leaf, int d, std::int64_t i) {
  using Tr = tensor_leaf<std::remove_cvref_t<Leaf>>;
  using T = typename Tr::scalar;
  constexpr int R = Tr::rank;
  constexpr int L = Tr::layout;
  using View = Eigen::TensorMap<const Eigen::Tensor<T, R - 1, L>>;
  const auto& dims = leaf.dimensions();
  Eigen::DSizes<Eigen::DenseIndex, R - 1> view_dims;
  std::int64_t stride = 1;
  for (int k = 0, v = 0; k < R; ++k) {
    if (k == d) continue;
    const std::int64_t extent = dims[k];
    const bool inner = L == Eigen::RowMajor ? k > d : k < d;
    if (inner)
      stride *= extent;
    else if (extent != 1)
      return std::optional<View>();
    view_dims[v++] = extent;
  }
  return std::optional<View>(View(leaf.data() + i * stride, view_dims));
}

}  // namespace pmap::detail
