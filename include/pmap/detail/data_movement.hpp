/// @file data_movement.hpp
/// @brief The collectives that move data without combining it (all_gather, all_to_all,
/// ppermute, pshuffle, pbroadcast) as copies over the engine's peers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "pmap/context.hpp"
#include "pmap/detail/buffers.hpp"
#include "pmap/detail/errors.hpp"
#include "pmap/detail/hash.hpp"
#include "pmap/detail/layout.hpp"
#include "pmap/detail/rendezvous.hpp"

namespace pmap::detail {

/// ppermute: indices in range, sources and destinations unique (SPEC 5, 8.4).
void check_permutation_pairs(const std::vector<std::pair<int, int>>& perm, const GroupInfo& g);
/// pshuffle: perm is a permutation of [0, n).
void check_shuffle(const std::vector<int>& perm, const GroupInfo& g);
/// pbroadcast: source in [0, n).
void check_source(int source, const GroupInfo& g);

// Each collective is a leaf class, the one implementation of the collective over one
// operand: built before the rendezvous (operand, result, plan), its work() run over the
// peers' inputs, take() after. The collective of one operand meets its peers with it
// (meet_one), a tree meets them once for all its leaves (trees.hpp).

template <bool Tiled, class X>
class AllGatherLeaf;
template <bool Tiled, class X>
class AllToAllLeaf;
template <class X>
class PermuteLeaf;

template <bool Tiled>
using AllGatherOp = AxesOp<AllGatherLeaf, Tiled>;

/// all_gather: member k's input becomes block k of every member's result, along `axis`:
/// a new axis of extent n (untiled), or the input's own axis, n times longer (tiled).
template <bool Tiled, class X>
class AllGatherLeaf : public Described {
  using T = typename Operand<X>::T;
  static constexpr int R = Operand<X>::rank;
  static constexpr int RO = Tiled ? R : R + 1;
  static constexpr int L = !Tiled && Operand<X>::is_scalar ? Eigen::RowMajor : Operand<X>::layout;

 public:
  template <class Source>
  AllGatherLeaf(Context& ctx, Source&& x, const AllGatherOp<Tiled>& op)
      : op_(std::forward<Source>(x)), a_(canonical_axis(op.axis, RO)) {
    const int n = static_cast<int>(op.g->members.size());
    // Untiled: a new axis of extent 1 at `a`, then concatenated.
    const Shape block = Tiled ? op_.shape() : insert_axis(op_.shape(), a_, 1);
    Shape out_shape = block;
    out_shape.dims[static_cast<std::size_t>(a_)] *= n;
    result_ = make_result<T, RO, L>(ctx, out_shape);
    split_ = split_around(block, a_, L);
    stream_ = streams_into(result_);
    described_ = detail::describe<T>("all_gather", OpKind::all_gather, op_.shape(), {a_, Tiled}, op_.data(),
                                     result_.data());
  }

  template <class Input>
  void work(int n, const Input& input) {
    for (int k = 0; k < n; ++k)
      place_block(result_.data(), static_cast<const T*>(static_cast<const void*>(input(k))), split_, n, k, stream_);
  }
  auto take() { return std::move(result_); }

 private:
  Operand<X> op_;
  int a_;
  Eigen::Tensor<T, RO, L> result_;
  Split3 split_{};
  bool stream_ = false;
};

template <bool Tiled, class X>
auto all_gather(Context& ctx, const X& x, const AxisNames& axes, int axis, const Groups& groups) {
  const GroupInfo& g = Access::group(ctx, axes, groups, true, "all_gather");
  AllGatherLeaf<Tiled, X> leaf(ctx, x, AllGatherOp<Tiled>{&g, axis});
  meet_one<typename Operand<X>::T>(ctx, g, leaf.describe(), leaf);
  return leaf.take();
}

template <bool Tiled>
using AllToAllOp = AxesOp<AllToAllLeaf, Tiled>;

/// all_to_all: member p receives block p (along split_axis) of every member's input and
/// places member k's block at position k along concat_axis (plan_all_to_all).
template <bool Tiled, class X>
class AllToAllLeaf : public Described {
  using T = typename Operand<X>::T;
  static constexpr int R = Operand<X>::rank;
  static constexpr int L = Operand<X>::layout;

 public:
  template <class Source>
  AllToAllLeaf(Context& ctx, Source&& x, const AllToAllOp<Tiled>& op)
      : ctx_(ctx), op_(std::forward<Source>(x)), sa_(canonical_axis(op.axis, R)),
        ca_(canonical_axis(op.concat_axis, R)) {
    const GroupInfo& g = *op.g;
    const int n = static_cast<int>(g.members.size());
    const std::int64_t extent = op_.shape().dims[static_cast<std::size_t>(sa_)];
    if (Tiled ? extent % n != 0 : extent != n) raise_all_to_all_extent(g.axis_label, n, extent, Tiled);
    plan_ = plan_all_to_all(op_.shape(), sa_, ca_, Tiled, n, g.position, L);
    result_ = make_result<T, R, L>(ctx, plan_.result);
    stream_ = streams_into(result_);
    described_ = detail::describe<T>("all_to_all", OpKind::all_to_all, op_.shape(), {sa_, ca_, Tiled},
                                     op_.data(), result_.data());
  }

  template <class Input>
  void work(int n, const Input& input) {
    for (int k = 0; k < n; ++k)
      copy_box(result_.data() + k * plan_.dst_step,
               static_cast<const T*>(static_cast<const void*>(input(k))) + plan_.src_offset, plan_.box, stream_);
  }
  auto take() {
    recycle(ctx_, op_);
    return std::move(result_);
  }

 private:
  Context& ctx_;
  Operand<X> op_;
  int sa_, ca_;
  AllToAllPlan plan_{};
  Eigen::Tensor<T, R, L> result_;
  bool stream_ = false;
};

template <bool Tiled, class X, class Source>
auto all_to_all(Context& ctx, Source&& x, const AxisNames& axes, int split_axis, int concat_axis,
                const Groups& groups) {
  const GroupInfo& g = Access::group(ctx, axes, groups, true, "all_to_all");
  AllToAllLeaf<Tiled, X> leaf(ctx, std::forward<Source>(x), AllToAllOp<Tiled>{&g, split_axis, concat_axis});
  meet_one<typename Operand<X>::T>(ctx, g, leaf.describe(), leaf);
  return leaf.take();
}

/// ppermute's, pshuffle's and pbroadcast's parameters: member p receives the input of
/// member from (this device's source), or zeros when from < 0; member `to` receives this
/// device's (-1: nobody, Collective::kWholeGroup: every member).
struct PermuteOp {
  const GroupInfo* g;
  const char* name;
  OpKind kind;
  std::int64_t source;     ///< pbroadcast's source (signed), 0 otherwise
  std::uint64_t perm_hash;  ///< added to the collective's signature
  int from;
  int to;
  template <class X>
  using Leaf = PermuteLeaf<X>;
};

/// Describes a collective of `op` over an input of scalar T.
template <class T>
Collective describe_permute(const PermuteOp& op, const Shape& shape, const T* in, void* out) {
  return op.kind == OpKind::pbroadcast ? describe<T>(op.name, op.kind, shape, {op.source}, in, out)
                                       : describe<T>(op.name, op.kind, shape, {}, in, out);
}

/// Adds to c, a collective of `op`, what its members pass and whom it reads.
inline void add_permutation(Collective& c, const PermuteOp& op) {
  c.signature ^= op.perm_hash;  // members that pass different permutations differ
  c.source = op.from;
  c.reader = op.to;
}

/// A leaf built for a collective described when it was posted (StartedPermute, when it
/// completes): its result and operand only, not its description again.
struct PostedBefore {};

template <class X>
class PermuteLeaf : public Described {
  using T = typename Operand<X>::T;

 public:
  template <class Source>
  PermuteLeaf(Context& ctx, Source&& x, const PermuteOp& op)
      : PermuteLeaf(ctx, std::forward<Source>(x), op, PostedBefore{}) {
    described_ = describe_permute<T>(op, op_.shape(), op_.data(), result_.data());
  }
  template <class Source>
  PermuteLeaf(Context& ctx, Source&& x, const PermuteOp& op, PostedBefore)
      : ctx_(ctx), op_(std::forward<Source>(x)), from_(op.from),
        result_(make_result<T, Operand<X>::rank, Operand<X>::layout>(ctx, op_.shape())) {
    described_.bytes = static_cast<std::size_t>(op_.shape().size()) * sizeof(T);
  }

  template <class Input>
  void work(int, const Input& input) {
    copy_or_zero(result_.data(),
                 from_ >= 0 ? static_cast<const T*>(static_cast<const void*>(input(from_))) : nullptr,
                 op_.shape().size());
  }
  auto take() {
    recycle(ctx_, op_);
    if constexpr (Operand<X>::is_scalar)
      return T(result_());
    else
      return std::move(result_);
  }

 private:
  Context& ctx_;
  Operand<X> op_;
  int from_;
  Eigen::Tensor<T, Operand<X>::rank, Operand<X>::layout> result_;
};

/// The collective of `leaf`, a part of `op`.
template <class X>
Collective permute_collective(const PermuteLeaf<X>& leaf, const PermuteOp& op) {
  Collective c = leaf.describe();
  add_permutation(c, op);
  return c;
}

/// Member p receives the input of member op.from, or zeros.
template <class X, class Input>
auto permute(Context& ctx, Input&& x, const PermuteOp& op) {
  PermuteLeaf<X> leaf(ctx, std::forward<Input>(x), op);
  meet_one<typename Operand<X>::T>(ctx, *op.g, permute_collective(leaf, op), leaf);
  return leaf.take();
}

/// ppermute's source for this device (-1: nobody sends to it), after validating the pairs.
inline int permutation_source(const GroupInfo& g, const std::vector<std::pair<int, int>>& perm) {
  check_permutation_pairs(perm, g);
  int from = -1;
  for (const auto& [src, dst] : perm)
    if (dst == g.position) from = src;
  return from;
}
/// ppermute's destination for this device (-1: it sends to nobody), of validated pairs.
inline int permutation_destination(const GroupInfo& g,
                                   const std::vector<std::pair<int, int>>& perm) {
  for (const auto& [src, dst] : perm)
    if (src == g.position) return dst;
  return -1;
}

/// The PermuteOps of ppermute, pshuffle and pbroadcast, validated.
inline PermuteOp ppermute_op(Context& ctx, const AxisNames& axes, const std::vector<std::pair<int, int>>& perm) {
  const GroupInfo& g = Access::group(ctx, axes, {}, false, "ppermute");
  PermutationMemo& memo = Access::permutation_memo(ctx);
  const PermutationMemo::Entry* known = nullptr;
  for (const auto& e : memo.entries)
    if (e.valid && e.group == g.signature && e.axis_size == g.axis_size && e.pairs == perm) {
      known = &e;
      break;
    }
  if (known == nullptr) {
    PermutationMemo::Entry& e = memo.entries[memo.next];
    e.valid = false;
    const int from = permutation_source(g, perm);  // throws if they are not valid
    e.pairs = perm;
    e.group = g.signature;
    e.axis_size = g.axis_size;
    e.from = from;
    e.to = permutation_destination(g, perm);
    e.hash = hash_bytes(0, perm.data(), perm.size() * sizeof(perm[0]));
    e.valid = true;
    memo.next = (memo.next + 1) % PermutationMemo::kEntries;
    known = &e;
  }
  const PermutationMemo::Entry& m = *known;
  return PermuteOp{.g = &g,
                   .name = "ppermute",
                   .kind = OpKind::ppermute,
                   .source = 0,
                   .perm_hash = m.hash,
                   .from = m.from,
                   .to = m.to};
}
inline PermuteOp pshuffle_op(Context& ctx, const AxisNames& axes, const std::vector<int>& perm) {
  const GroupInfo& g = Access::group(ctx, axes, {}, false, "pshuffle");
  check_shuffle(perm, g);
  const auto to = std::find(perm.begin(), perm.end(), g.position) - perm.begin();
  return PermuteOp{.g = &g,
                   .name = "pshuffle",
                   .kind = OpKind::ppermute,
                   .source = 0,
                   .perm_hash = hash_bytes(1, perm.data(), perm.size() * sizeof(int)),
                   .from = perm[static_cast<std::size_t>(g.position)],
                   .to = static_cast<int>(to)};
}
inline PermuteOp pbroadcast_op(Context& ctx, const AxisNames& axes, int source) {
  const GroupInfo& g = Access::group(ctx, axes, {}, false, "pbroadcast");
  check_source(source, g);
  return PermuteOp{.g = &g,
                   .name = "pbroadcast",
                   .kind = OpKind::pbroadcast,
                   .source = source,
                   .perm_hash = 0,
                   .from = source,
                   .to = g.position == source ? Collective::kWholeGroup : -1};
}

template <class X, class Input>
auto ppermute(Context& ctx, Input&& x, const AxisNames& axes,
              const std::vector<std::pair<int, int>>& perm) {
  return permute<X>(ctx, std::forward<Input>(x), ppermute_op(ctx, axes, perm));
}

template <class X, class Input>
auto pshuffle(Context& ctx, Input&& x, const AxisNames& axes, const std::vector<int>& perm) {
  return permute<X>(ctx, std::forward<Input>(x), pshuffle_op(ctx, axes, perm));
}

template <class X, class Input>
auto pbroadcast(Context& ctx, Input&& x, const AxisNames& axes, int source) {
  return permute<X>(ctx, std::forward<Input>(x), pbroadcast_op(ctx, axes, source));
}

}  // namespace pmap::detail
