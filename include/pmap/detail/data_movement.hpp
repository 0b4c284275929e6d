/// @file data_movement.hpp
/// @brief The collectives that move data without combining it (all_gather, all_to_all,
/// ppermute, pshuffle, pbroadcast) as copies over the engine's peers.
#pragma once

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

/// all_gather: member k's input becomes block k of every member's result, along `axis`:
/// a new axis of extent n (untiled), or the input's own axis, n times longer (tiled).
template <bool Tiled, class X>
auto all_gather(Context& ctx, const X& x, const AxisNames& axes, int axis, const Groups& groups) {
  Operand<X> op(x);
  using T = typename Operand<X>::T;
  constexpr int R = Operand<X>::rank;
  constexpr int RO = Tiled ? R : R + 1;
  constexpr int L = !Tiled && Operand<X>::is_scalar ? Eigen::RowMajor : Operand<X>::layout;
  const GroupInfo& g = Access::group(ctx, axes, groups, true, "all_gather");
  const int n = static_cast<int>(g.members.size());
  const int a = canonical_axis(axis, RO);
  // Untiled: a new axis of extent 1 at `a`, then concatenated.
  const Shape block = Tiled ? op.shape() : insert_axis(op.shape(), a, 1);
  Shape out_shape = block;
  out_shape.dims[static_cast<std::size_t>(a)] *= n;
  auto result = make_result<T, RO, L>(ctx, out_shape);
  const Split3 s = split_around(block, a, L);
  T* out = result.data();
  const bool stream = streams_into(result);
  rendezvous<T>(ctx, g, describe<T>("all_gather", OpKind::all_gather, op.shape(), {a, Tiled}, op.data(), out),
                [&](Peers<T>& peers) {
                  for (int k = 0; k < n; ++k) place_block(out, peers.input(k), s, n, k, stream);
                });
  return result;
}

/// all_to_all: member p receives block p (along split_axis) of every member's input and
/// places member k's block at position k along concat_axis (plan_all_to_all).
template <bool Tiled, class X, class Source>
auto all_to_all(Context& ctx, Source&& x, const AxisNames& axes, int split_axis, int concat_axis,
                const Groups& groups) {
  Operand<X> op(std::forward<Source>(x));
  using T = typename Operand<X>::T;
  constexpr int R = Operand<X>::rank;
  constexpr int L = Operand<X>::layout;
  const GroupInfo& g = Access::group(ctx, axes, groups, true, "all_to_all");
  const int n = static_cast<int>(g.members.size());
  const int sa = canonical_axis(split_axis, R);
  const int ca = canonical_axis(concat_axis, R);
  const std::int64_t extent = op.shape().dims[static_cast<std::size_t>(sa)];
  if (Tiled ? extent % n != 0 : extent != n) raise_all_to_all_extent(g.axis_label, n, extent, Tiled);
  const AllToAllPlan plan = plan_all_to_all(op.shape(), sa, ca, Tiled, n, g.position, L);
  auto result = make_result<T, R, L>(ctx, plan.result);
  T* out = result.data();
  const bool stream = streams_into(result);
  rendezvous<T>(ctx, g, describe<T>("all_to_all", OpKind::all_to_all, op.shape(), {sa, ca, Tiled}, op.data(), out),
                [&](Peers<T>& peers) {
                  for (int k = 0; k < n; ++k)
                    copy_box(out + k * plan.dst_step, peers.input(k) + plan.src_offset, plan.box, stream);
                });
  recycle(ctx, op);
  return result;
}

/// Member p receives the input of member source(p), or zeros when source(p) < 0.
template <class X, class Input, class Source>
auto permute(Context& ctx, Input&& x, const GroupInfo& g, const char* name, OpKind kind,
             std::initializer_list<std::int64_t> params, std::uint64_t perm_hash,
             const Source& source) {
  Operand<X> op(std::forward<Input>(x));
  using T = typename Operand<X>::T;
  auto result = make_result<T, Operand<X>::rank, Operand<X>::layout>(ctx, op.shape());
  T* out = result.data();
  const int from = source(g.position);
  GroupInfo signed_group = g;
  signed_group.signature ^= perm_hash;
  rendezvous<T>(ctx, signed_group, describe<T>(name, kind, op.shape(), params, op.data(), out),
                [&](Peers<T>& peers) {
                  copy_or_zero(out, from >= 0 ? peers.input(from) : nullptr, op.shape().size());
                });
  recycle(ctx, op);
  if constexpr (Operand<X>::is_scalar)
    return T(result());
  else
    return result;
}

/// ppermute's source for this device (-1: nobody sends to it), after validating the pairs.
inline int permutation_source(const GroupInfo& g, const std::vector<std::pair<int, int>>& perm) {
  check_permutation_pairs(perm, g);
  int from = -1;
  for (const auto& [src, dst] : perm)
    if (dst == g.position) from = src;
  return from;
}

template <class X, class Input>
auto ppermute(Context& ctx, Input&& x, const AxisNames& axes,
              const std::vector<std::pair<int, int>>& perm) {
  const GroupInfo& g = Access::group(ctx, axes, {}, false, "ppermute");
  const int from = permutation_source(g, perm);
  return permute<X>(ctx, std::forward<Input>(x), g, "ppermute", OpKind::ppermute, {},
                    hash_bytes(0, perm.data(), perm.size() * sizeof(perm[0])),
                    [from](int) { return from; });
}

template <class X, class Input>
auto pshuffle(Context& ctx, Input&& x, const AxisNames& axes, const std::vector<int>& perm) {
  const GroupInfo& g = Access::group(ctx, axes, {}, false, "pshuffle");
  check_shuffle(perm, g);
  return permute<X>(ctx, std::forward<Input>(x), g, "pshuffle", OpKind::ppermute, {},
                    hash_bytes(1, perm.data(), perm.size() * sizeof(int)),
                    [&perm](int p) { return perm[static_cast<std::size_t>(p)]; });
}

template <class X, class Input>
auto pbroadcast(Context& ctx, Input&& x, const AxisNames& axes, int source) {
  const GroupInfo& g = Access::group(ctx, axes, {}, false, "pbroadcast");
  check_source(source, g);
  return permute<X>(ctx, std::forward<Input>(x), g, "pbroadcast", OpKind::pbroadcast, {source}, 0,
                    [source](int) { return source; });
}

}  // namespace pmap::detail
