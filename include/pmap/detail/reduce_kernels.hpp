/// @file reduce_kernels.hpp
/// @brief The elementwise work of the reductions: blocks of the members' inputs combined in
/// group order, in L1-sized pieces, with Eigen's vectorised array operations.
#pragma once

#include <algorithm>
#include <cstdint>

#include <Eigen/Core>

#include "pmap/detail/op_kind.hpp"

namespace pmap::detail {

template <class T>
using ArrayMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;
template <class T>
using MutArrayMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;

/// The elementwise operation of reduction K on two array expressions.
template <OpKind K, class A, class B>
auto combine(const A& a, const B& b) {
  if constexpr (K == OpKind::psum || K == OpKind::pmean)
    return a + b;
  else if constexpr (K == OpKind::pmax)
    return a.max(b);
  else
    return a.min(b);
}

/// out[0, len) = op over the members' blocks src(k)[0, len) (cast to Acc); pmean divides.
/// Works through blocks that stay in L1, so that every input is read once and `out` written
/// once whatever the member count. With `in_place`, `out` is one of the inputs (a donated
/// buffer): unless that is safe coefficient-wise, each block is then reduced in a buffer of
/// its own before it is stored. Members are always combined in group order, so every path
/// gives the same bits.
template <OpKind K, class Acc, class T, class Src>
void reduce_block(Acc* out, std::int64_t len, int n, const Src& src, bool in_place = false) {
  constexpr std::int64_t kBlockBytes = 8192;
  constexpr std::int64_t kBlock = std::max<std::int64_t>(1, kBlockBytes / std::int64_t{sizeof(Acc)});
  alignas(64) unsigned char scratch[kBlock * sizeof(Acc)];
  // Coefficient-wise, `out` may be the first input, or either input when there are two: each
  // element is read before it is written. Otherwise the block goes through the scratch.
  const bool via_scratch =
      in_place && n > 2 && static_cast<const void*>(src(0)) != static_cast<const void*>(out);
  for (std::int64_t b = 0; b < len; b += kBlock) {
    const auto m = static_cast<Eigen::Index>(std::min(kBlock, len - b));
    MutArrayMap<Acc> o(via_scratch ? reinterpret_cast<Acc*>(scratch) : out + b, m);
    auto in = [&](int k) { return ArrayMap<T>(src(k) + b, m).template cast<Acc>(); };
    if (n == 1)
      o = in(0);
    else
      o = combine<K>(in(0), in(1));
    for (int k = 2; k < n; ++k) o = combine<K>(o, in(k));
    if constexpr (K == OpKind::pmean) o /= static_cast<Acc>(n);
    if (via_scratch) MutArrayMap<Acc>(out + b, m) = o;
  }
}

}  // namespace pmap::detail
