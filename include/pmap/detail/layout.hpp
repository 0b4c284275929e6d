/// @file layout.hpp
/// @brief Where collectives cut blocks: an array seen around one axis, boxes inside arrays
/// and their copies, and the boxes of all_to_all. Pure geometry over memory, no peers
/// (tests/test_layout.cpp checks it on its own).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include <unsupported/Eigen/CXX11/Tensor>

#include "pmap/detail/memory.hpp"
#include "pmap/detail/shape.hpp"

namespace pmap::detail {

/// A shape seen in memory order (row-major equivalent) and split around one axis:
/// [outer, mid, inner].
struct Split3 {
  std::int64_t outer = 1, mid = 1, inner = 1;
};

inline Split3 split_around(const Shape& s, int axis, int layout) {
  Split3 r;
  for (int a = 0; a < s.rank; ++a) {
    const std::int64_t d = s.dims[static_cast<std::size_t>(a)];
    const bool before = layout == Eigen::RowMajor ? a < axis : a > axis;
    if (a == axis)
      r.mid = d;
    else if (before)
      r.outer *= d;
    else
      r.inner *= d;
  }
  return r;
}

/// Copies `in` ([outer, mid, inner]) into block k of `out` ([outer, n * mid, inner]).
template <class T>
void place_block(T* out, const T* in, const Split3& s, int n, int k, bool stream) {
  const std::int64_t run = s.mid * s.inner;
  for (std::int64_t o = 0; o < s.outer; ++o)
    copy_run(out + (o * n + k) * run, in + o * run, static_cast<std::size_t>(run) * sizeof(T),
             stream);
}

/// A box inside an array: extents and element strides per dimension, in memory order (the
/// outermost first).
struct Box {
  int rank = 0;
  std::array<std::int64_t, kMaxRank> extent{}, src_stride{}, dst_stride{};
  bool empty() const {
    return std::any_of(extent.begin(), extent.begin() + rank, [](std::int64_t e) { return e == 0; });
  }
};

/// Element strides of an array of shape `s`, by logical dimension.
inline std::array<std::int64_t, kMaxRank> strides_of(const Shape& s, int layout) {
  std::array<std::int64_t, kMaxRank> st{};
  std::int64_t step = 1;
  for (int i = 0; i < s.rank; ++i) {
    const int d = layout == Eigen::RowMajor ? s.rank - 1 - i : i;  // innermost first
    st[static_cast<std::size_t>(d)] = step;
    step *= s.dims[static_cast<std::size_t>(d)];
  }
  return st;
}

/// The same box with unit dimensions dropped and each dimension merged into the next inner
/// one where both arrays lay them out back to back: a box of whole rows becomes one run.
inline Box merge_box(const Box& b) {
  Box m;
  for (int i = 0; i < b.rank; ++i) {
    const auto u = static_cast<std::size_t>(i);
    if (b.extent[u] == 1) continue;
    const auto last = static_cast<std::size_t>(m.rank - 1);
    if (m.rank > 0 && m.src_stride[last] == b.extent[u] * b.src_stride[u] &&
        m.dst_stride[last] == b.extent[u] * b.dst_stride[u]) {
      m.extent[last] *= b.extent[u];
      m.src_stride[last] = b.src_stride[u];
      m.dst_stride[last] = b.dst_stride[u];
      continue;
    }
    const auto r = static_cast<std::size_t>(m.rank++);
    m.extent[r] = b.extent[u];
    m.src_stride[r] = b.src_stride[u];
    m.dst_stride[r] = b.dst_stride[u];
  }
  return m;
}

/// Copies a box of extents b.extent from src (strides b.src_stride) to dst (b.dst_stride),
/// as few long runs as merge_box() allows (streamed with `stream`, see streams()).
template <class T>
void copy_box(T* dst, const T* src, const Box& box, bool stream) {
  if (box.empty()) return;
  const Box m = merge_box(box);
  if (m.rank == 0) {
    *dst = *src;
    return;
  }
  const auto inner = static_cast<std::size_t>(m.rank - 1);
  const std::int64_t run = m.extent[inner];
  const bool contiguous = m.src_stride[inner] == 1 && m.dst_stride[inner] == 1;
  std::array<std::int64_t, kMaxRank> index{};
  for (;;) {
    std::int64_t so = 0, dof = 0;
    for (std::size_t d = 0; d < inner; ++d) {
      so += index[d] * m.src_stride[d];
      dof += index[d] * m.dst_stride[d];
    }
    if (contiguous)
      copy_run(dst + dof, src + so, static_cast<std::size_t>(run) * sizeof(T), stream);
    else
      for (std::int64_t j = 0; j < run; ++j)
        dst[dof + j * m.dst_stride[inner]] = src[so + j * m.src_stride[inner]];
    int d = static_cast<int>(inner) - 1;  // the next index, odometer style
    for (; d >= 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      if (++index[u] < m.extent[u]) break;
      index[u] = 0;
    }
    if (d < 0) return;
  }
}

// Compiled once in the library (src/layout.cpp) for the common scalars, not in every program.
extern template void copy_box<float>(float*, const float*, const Box&, bool);
extern template void copy_box<double>(double*, const double*, const Box&, bool);
extern template void copy_box<std::int32_t>(std::int32_t*, const std::int32_t*, const Box&, bool);
extern template void copy_box<std::int64_t>(std::int64_t*, const std::int64_t*, const Box&, bool);

/// out = in, or zeros when there is no input (ppermute: nobody sends to this device).
template <class T>
void copy_or_zero(T* out, const T* in, std::int64_t size) {
  const auto bytes = static_cast<std::size_t>(size) * sizeof(T);
  if (in)
    copy_run(out, in, bytes, streams(bytes));
  else
    std::fill(out, out + size, T{});
}

/// all_to_all as copies: member p receives block p (along the split axis) of every member k's
/// input and places it at block k along the concat axis of its result. Every member's block
/// is the same box: member k's copy reads `input + src_offset` and writes
/// `output + k * dst_step`.
struct AllToAllPlan {
  Shape result;
  Box box;
  std::int64_t src_offset = 0;
  std::int64_t dst_step = 0;
};

/// Tiled: the block is the input with the split extent divided by n, the result the block
/// with the concat extent multiplied by n. Untiled (split extent n): the split axis is
/// removed and an axis of n inserted at the concat axis; the blocks have extent 1 there, and
/// dropping that unit dimension from both sides leaves the same dimensions in the same order,
/// so both forms are one box copy per member.
inline AllToAllPlan plan_all_to_all(const Shape& in, int split_axis, int concat_axis, bool tiled,
                                    int n, int position, int layout) {
  const auto sa = static_cast<std::size_t>(split_axis);
  const auto ca = static_cast<std::size_t>(concat_axis);
  AllToAllPlan plan;
  Shape block = in;
  block.dims[sa] = in.dims[sa] / n;
  if (tiled) {
    plan.result = block;
    plan.result.dims[ca] *= n;
  } else {
    plan.result = insert_axis(remove_axis(in, split_axis), concat_axis, n);
  }
  const auto in_strides = strides_of(in, layout);
  const auto out_strides = strides_of(plan.result, layout);
  // The box's dimensions by logical dimension: all of the block's when tiled; untiled, those
  // of `in` without the split axis against those of the result without the concat axis.
  std::array<std::int64_t, kMaxRank> extent{}, src{}, dst{};
  int rank = 0;
  for (int d = 0, j = 0; d < in.rank; ++d) {
    if (!tiled && d == split_axis) continue;
    const auto u = static_cast<std::size_t>(j++);
    extent[u] = block.dims[static_cast<std::size_t>(d)];
    src[u] = in_strides[static_cast<std::size_t>(d)];
    rank = j;
  }
  for (int d = 0, j = 0; d < plan.result.rank; ++d)
    if (tiled || d != concat_axis) dst[static_cast<std::size_t>(j++)] = out_strides[static_cast<std::size_t>(d)];
  plan.box.rank = rank;
  for (int i = 0; i < rank; ++i) {  // in memory order: the outermost first
    const auto d = static_cast<std::size_t>(layout == Eigen::RowMajor ? i : rank - 1 - i);
    plan.box.extent[static_cast<std::size_t>(i)] = extent[d];
    plan.box.src_stride[static_cast<std::size_t>(i)] = src[d];
    plan.box.dst_stride[static_cast<std::size_t>(i)] = dst[d];
  }
  plan.src_offset = position * block.dims[sa] * in_strides[sa];
  plan.dst_step = (tiled ? block.dims[ca] : 1) * out_strides[ca];
  return plan;
}

}  // namespace pmap::detail
