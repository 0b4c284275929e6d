/// @file ragged.hpp
/// @brief ragged_all_to_all (SPEC 12): rows in per-destination counts, as JAX's
/// `jax.lax.ragged_all_to_all` and MPI's `MPI_Alltoallv`, and pmap::Ragged, its result.
///
/// In one process a member publishes where its rows are and how many go to each member,
/// meets its group once, and copies its chunks straight out of its peers' inputs (RowMajor
/// chunks are one run each; ColMajor chunks one run per column); a last barrier keeps the
/// inputs alive until every member has read them. Across processes the inputs travel the
/// gathered path, which carries the same number of bytes for every device: the send sizes
/// first, then every input padded to the longest input of the team.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include <unsupported/Eigen/CXX11/Tensor>

#include "pmap/context.hpp"
#include "pmap/detail/buffers.hpp"
#include "pmap/detail/layout.hpp"
#include "pmap/detail/rendezvous.hpp"
#include "pmap/pending.hpp"

namespace pmap {

/// @brief What ragged_all_to_all returns: the rows received, in member order.
template <class T, int R, int Layout>
struct Ragged {
  Eigen::Tensor<T, R, Layout> data;   ///< the rows received, concatenated in member order
  std::vector<Eigen::Index> sizes;    ///< sizes[j]: rows received from group member j
  std::vector<Eigen::Index> offsets;  ///< offsets[j]: where member j's rows start in data
};

namespace detail {

/// The three ValueErrors of SPEC 12, on the calling device before it meets anyone.
void check_ragged_sizes(std::span<const Eigen::Index> send_sizes, std::int64_t rows,
                        const GroupInfo& g);

/// What a member publishes in one process: its rows and their destinations.
struct RaggedInput {
  const void* data;
  const Eigen::Index* send_sizes;  ///< one per member of the group
  std::int64_t rows;               ///< of data
};

/// The collective every member describes: the signature covers the dtype and every dimension
/// but the first (`stage` tells the two exchanges across processes apart).
template <class T>
Collective ragged_collective(const Shape& shape, const void* in, std::size_t bytes, int stage) {
  Shape agreed = shape;
  agreed.dims[0] = 0;
  Collective c;
  c.name = "ragged_all_to_all";
  c.signature = op_signature(OpKind::ragged_all_to_all, dtype_name<T>(), agreed, {stage});
  c.dtype = dtype_name<T>();
  c.shape = shape;
  c.bytes = bytes;
  c.in = in;
  c.in_place = true;  // never staged: peers read the rows where they are
  return c;
}

/// The receiving side: the result and its geometry ([outer, rows, inner] in memory order,
/// as Split3 sees the operand around dimension 0).
template <class T, int R, int L>
class RaggedResult {
 public:
  RaggedResult(const Shape& operand, int n)
      : split_(split_around(operand, 0, L)), shape_(operand) {
    out_.sizes.resize(static_cast<std::size_t>(n));
    out_.offsets.resize(static_cast<std::size_t>(n));
  }
  /// Member k sends `rows` rows: sizes and offsets, then the result, once all are known.
  void set_size(int k, Eigen::Index rows) { out_.sizes[static_cast<std::size_t>(k)] = rows; }
  void allocate(Context& ctx) {
    Eigen::Index total = 0;
    for (std::size_t k = 0; k < out_.sizes.size(); ++k) {
      out_.offsets[k] = total;
      total += out_.sizes[k];
    }
    shape_.dims[0] = total;
    out_.data = make_result<T, R, L>(ctx, shape_);
    stream_ = streams_into(out_.data);
  }
  /// Copies member k's chunk, rows [first, first + sizes[k]) of an input of `rows` rows.
  void copy_from(int k, const T* in, std::int64_t rows, std::int64_t first) {
    const std::int64_t count = out_.sizes[static_cast<std::size_t>(k)];
    const std::int64_t total = shape_.dims[0];
    const std::int64_t at = out_.offsets[static_cast<std::size_t>(k)];
    const std::size_t run = static_cast<std::size_t>(count * split_.inner) * sizeof(T);
    for (std::int64_t o = 0; o < split_.outer; ++o)
      copy_run(out_.data.data() + (o * total + at) * split_.inner,
               in + (o * rows + first) * split_.inner, run, stream_);
  }
  Ragged<T, R, L> take() { return std::move(out_); }

 private:
  Split3 split_;
  Shape shape_;
  Ragged<T, R, L> out_;
  bool stream_ = false;
};

/// Where member `me`'s chunk starts in an input sent with `send_sizes`.
inline std::int64_t first_row_for(const Eigen::Index* send_sizes, int me) {
  std::int64_t first = 0;
  for (int j = 0; j < me; ++j) first += send_sizes[j];
  return first;
}

/// In one process: one meeting, the chunks copied out of the peers' inputs.
template <class T, int R, int L>
void ragged_local(Context& ctx, const GroupInfo& g, const T* data, const Shape& shape,
                  std::span<const Eigen::Index> send_sizes, RaggedResult<T, R, L>& result) {
  const RaggedInput mine{data, send_sizes.data(), shape.dims[0]};
  const Collective c = ragged_collective<T>(shape, &mine, static_cast<std::size_t>(shape.size()) * sizeof(T), 0);
  rendezvous<RaggedInput>(ctx, g, c, [&](Peers<RaggedInput>& peers) {
    const int me = peers.position();
    for (int k = 0; k < peers.size(); ++k) result.set_size(k, peers.input(k)->send_sizes[me]);
    result.allocate(ctx);
    for (int k = 0; k < peers.size(); ++k) {
      const RaggedInput& in = *peers.input(k);
      result.copy_from(k, static_cast<const T*>(in.data), in.rows, first_row_for(in.send_sizes, me));
    }
  });
}

/// Across processes: the send sizes of every device, then every input padded to the longest
/// of the team (the gathered path moves the same bytes for every device).
template <class T, int R, int L>
void ragged_gathered(Context& ctx, const GroupInfo& g, const T* data, const Shape& shape,
                     std::span<const Eigen::Index> send_sizes, RaggedResult<T, R, L>& result) {
  const int n = static_cast<int>(send_sizes.size());
  const std::size_t sizes_bytes = send_sizes.size() * sizeof(Eigen::Index);
  std::vector<Eigen::Index> sent(static_cast<std::size_t>(n * n));  // sent[k * n + j]: k to j
  std::int64_t longest = 0;
  Shape sizes_shape;
  sizes_shape.rank = 1;
  sizes_shape.dims[0] = n;
  const Collective sizes = ragged_collective<Eigen::Index>(sizes_shape, send_sizes.data(), sizes_bytes, 1);
  rendezvous<Eigen::Index>(ctx, g, sizes, [&](Peers<Eigen::Index>& peers) {
    for (int k = 0; k < n; ++k) std::copy_n(peers.input(k), n, sent.begin() + k * n);
    for (int m = 0; m < peers.team_size(); ++m) {
      const Eigen::Index* s = peers.team_input(m);
      longest = std::max<std::int64_t>(longest, std::accumulate(s, s + n, std::int64_t{0}));
    }
  });
  Shape padded_shape = shape;
  padded_shape.dims[0] = longest;
  const Split3 split = split_around(shape, 0, L);
  std::vector<T> padded(static_cast<std::size_t>(padded_shape.size()));
  for (std::int64_t o = 0; o < split.outer; ++o)
    copy_run(padded.data() + o * longest * split.inner, data + o * shape.dims[0] * split.inner,
             static_cast<std::size_t>(shape.dims[0] * split.inner) * sizeof(T), false);
  const Collective rows =
      ragged_collective<T>(padded_shape, padded.data(), padded.size() * sizeof(T), 2);
  const int me = g.position;
  for (int k = 0; k < n; ++k) result.set_size(k, sent[static_cast<std::size_t>(k * n + me)]);
  result.allocate(ctx);
  rendezvous<T>(ctx, g, rows, [&](Peers<T>& peers) {
    for (int k = 0; k < n; ++k)
      result.copy_from(k, peers.input(k), longest, first_row_for(sent.data() + k * n, me));
  });
}

template <class X>
auto ragged_all_to_all(Context& ctx, const X& x, const AxisNames& axes,
                       std::span<const Eigen::Index> send_sizes, const Groups& groups) {
  using Op = Operand<X>;
  using T = typename Op::T;
  constexpr int R = Op::rank;
  constexpr int L = Op::layout;
  static_assert(R >= 1 && !Op::is_scalar,
                "pmap: ragged_all_to_all sends rows of a tensor of rank 1 or more");
  static_assert(!is_core_dense_v<std::remove_cvref_t<X>>,
                "pmap: ragged_all_to_all takes an Eigen tensor, TensorMap or tensor expression");
  const GroupInfo& g = Access::group(ctx, axes, groups, true, "ragged_all_to_all");
  Op op(x);
  check_ragged_sizes(send_sizes, op.shape().dims[0], g);
  RaggedResult<T, R, L> result(op.shape(), static_cast<int>(g.members.size()));
  if (Access::member(ctx).team->distributed())
    ragged_gathered<T, R, L>(ctx, g, op.data(), op.shape(), send_sizes, result);
  else
    ragged_local<T, R, L>(ctx, g, op.data(), op.shape(), send_sizes, result);
  return result.take();
}

}  // namespace detail

template <class X>
auto Context::ragged_all_to_all(const X& x, AxisNames axes, std::span<const Eigen::Index> send_sizes,
                                const Groups& groups) {
  return detail::ragged_all_to_all(*this, x, axes, send_sizes, groups);
}

template <class X>
auto Context::ragged_all_to_all_start(X&& x, AxisNames axes,
                                      std::span<const Eigen::Index> send_sizes,
                                      const Groups& groups) {
  std::vector<Eigen::Index> sizes(send_sizes.begin(), send_sizes.end());  // held as the operand
  return detail::start(*this, "ragged_all_to_all", std::forward<X>(x),
                       [axes = std::move(axes), sizes = std::move(sizes), groups](Context& c, auto&& v) {
                         return c.ragged_all_to_all(v, axes, sizes, groups);
                       });
}

}  // namespace pmap
