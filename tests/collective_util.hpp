/// @file collective_util.hpp
/// @brief Helpers specific to the collective, nesting and misuse suites: options binding an
/// axis name, ppermute rings and serial references of the collectives (over global tensors
/// whose axis 0 is the device axis). Everything else (runtimes, fixture, deterministic
/// tensors, comparisons, exception checks) comes from test_util.hpp, whose names this
/// namespace brings in.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <pmap/pmap.hpp>
#include <unsupported/Eigen/CXX11/Tensor>

#include "test_util.hpp"

namespace coll_test {

using namespace pmap_test;  // NOLINT(google-build-using-namespace): the shared helpers

/// A tensor of the collective suites: RowMajor unless stated.
template <class T, int R, int L = RowMajor>
using Tensor = Eigen::Tensor<T, R, L>;

using F1 = Tensor<float, 1>;
using F2 = Tensor<float, 2>;
using F3 = Tensor<float, 3>;
using Perm = std::vector<std::pair<int, int>>;

/// The runtime shapes of the collective suites: 1, 2, 4, 8 devices on 1 and 2 threads.
inline std::vector<RtConfig> collective_configs() {
  return {{1, 1}, {2, 1}, {2, 2}, {4, 1}, {4, 2}, {8, 1}, {8, 2}};
}

// ---- options and permutations ------------------------------------------------------------

/// Options running on rt with its axis named `axis` (pmap_test::on names the call instead).
inline pmap::Options on_axis(pmap::Runtime& rt, std::string axis = "i") {
  pmap::Options o = on(rt);
  o.axis_name = std::move(axis);
  return o;
}

/// Ring permutation (d, d + shift mod n) as ppermute pairs.
inline std::vector<std::pair<int, int>> ring(int n, int shift) {
  std::vector<std::pair<int, int>> perm;
  for (int d = 0; d < n; ++d) perm.emplace_back(d, ((d + shift) % n + n) % n);
  return perm;
}

// ---- serial references (global tensors: axis 0 is the device axis) -----------------------

/// Part p of a stacked tensor: what device p holds.
template <class T, int R, int L>
Tensor<T, R - 1, L> part(const Tensor<T, R, L>& x, Index p) {
  return slice(x, p, 0);
}

/// The same value on each of n devices, stacked at axis 0.
template <class T, int R, int L>
Tensor<T, R + 1, L> replicate(const Tensor<T, R, L>& v, Index n) {
  return stack(std::vector<Tensor<T, R, L>>(static_cast<std::size_t>(n), v), 0);
}

/// Sum over the device axis of the members of one group (all devices when empty).
template <class T, int R, int L>
Tensor<T, R - 1, L> group_sum(const Tensor<T, R, L>& x, const std::vector<int>& members) {
  Tensor<T, R - 1, L> s = part(x, members.at(0));
  for (std::size_t k = 1; k < members.size(); ++k) s = s + part(x, members[k]);
  return s;
}

/// The device indices 0 .. n-1 (the single group of an ungrouped collective).
inline std::vector<int> iota(int n) {
  std::vector<int> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return v;
}

/// The group of device p (all devices for empty groups) and p's position in it.
inline std::pair<std::vector<int>, int> group_of(const pmap::Groups& groups, int n, int p) {
  if (groups.empty()) return {iota(n), p};
  for (const auto& g : groups)
    for (std::size_t k = 0; k < g.size(); ++k)
      if (g[k] == p) return {g, static_cast<int>(k)};
  ADD_FAILURE() << "device " << p << " in no group";
  return {{p}, 0};
}

/// Concatenates equally shaped parts along axis a.
template <class T, int R, int L>
Tensor<T, R, L> concat(const std::vector<Tensor<T, R, L>>& parts, int a) {
  std::array<Index, R> dims{};
  for (int k = 0; k < R; ++k) dims[static_cast<std::size_t>(k)] = parts.at(0).dimension(k);
  const Index chunk = dims[static_cast<std::size_t>(a)];
  dims[static_cast<std::size_t>(a)] *= static_cast<Index>(parts.size());
  Tensor<T, R, L> out(dims);
  for (std::size_t q = 0; q < parts.size(); ++q) {
    std::array<Index, R> off{};
    std::array<Index, R> ext{};
    for (int k = 0; k < R; ++k) ext[static_cast<std::size_t>(k)] = parts[q].dimension(k);
    off[static_cast<std::size_t>(a)] = static_cast<Index>(q) * chunk;
    out.slice(off, ext) = parts[q];
  }
  return out;
}

/// Chunk c (of `count` equal chunks) of x along axis a.
template <class T, int R, int L>
Tensor<T, R, L> chunk(const Tensor<T, R, L>& x, int a, Index c, Index count) {
  std::array<Index, R> off{};
  std::array<Index, R> ext{};
  for (int k = 0; k < R; ++k) ext[static_cast<std::size_t>(k)] = x.dimension(k);
  const Index size = x.dimension(a) / count;
  ext[static_cast<std::size_t>(a)] = size;
  off[static_cast<std::size_t>(a)] = c * size;
  Tensor<T, R, L> out = x.slice(off, ext);
  return out;
}

/// all_to_all untiled on device p: out.chip(q, c) = parts[group[q]].chip(p_pos, s).
template <class T, int R, int L>
Tensor<T, R, L> all_to_all_ref(const std::vector<Tensor<T, R, L>>& parts, const std::vector<int>& members,
                               int pos, int s, int c) {
  const auto& x0 = parts.at(static_cast<std::size_t>(members.at(0)));
  std::vector<Index> d;
  for (int k = 0; k < R; ++k)
    if (k != s) d.push_back(x0.dimension(k));
  d.insert(d.begin() + c, static_cast<Index>(members.size()));
  std::array<Index, R> dims{};
  for (int k = 0; k < R; ++k) dims[static_cast<std::size_t>(k)] = d[static_cast<std::size_t>(k)];
  Tensor<T, R, L> out(dims);
  for (std::size_t q = 0; q < members.size(); ++q)
    out.chip(static_cast<Index>(q), c) =
        parts[static_cast<std::size_t>(members[q])].chip(static_cast<Index>(pos), s);
  return out;
}

/// all_to_all tiled on device p: chunk pos of split axis s from member q lands at chunk q of c.
template <class T, int R, int L>
Tensor<T, R, L> all_to_all_tiled_ref(const std::vector<Tensor<T, R, L>>& parts,
                                     const std::vector<int>& members, int pos, int s, int c) {
  const Index g = static_cast<Index>(members.size());
  std::vector<Tensor<T, R, L>> chunks;
  for (int m : members) chunks.push_back(chunk(parts[static_cast<std::size_t>(m)], s, pos, g));
  return concat(chunks, c);
}

/// Elementwise combination of every part of a stacked tensor (max, min).
template <class T, int R, int L, class Op>
Tensor<T, R - 1, L> reduce_parts(const Tensor<T, R, L>& x, const std::vector<int>& members, Op op) {
  Tensor<T, R - 1, L> r = part(x, members.at(0));
  for (std::size_t m = 1; m < members.size(); ++m) {
    Tensor<T, R - 1, L> p = part(x, members[m]);
    for (Index k = 0; k < r.size(); ++k) r.data()[k] = op(r.data()[k], p.data()[k]);
  }
  return r;
}

/// The permutation n-1, ..., 0 (pshuffle reversing the devices).
inline std::vector<int> reverse_perm(int n) {
  std::vector<int> perm;
  for (int i = n - 1; i >= 0; --i) perm.push_back(i);
  return perm;
}

/// The parts of a stacked tensor: what each device holds.
template <class T, int R, int L>
std::vector<Tensor<T, R - 1, L>> parts_of(const Tensor<T, R, L>& x) {
  std::vector<Tensor<T, R - 1, L>> parts;
  for (Index p = 0; p < x.dimension(0); ++p) parts.push_back(part(x, p));
  return parts;
}

/// Runs f over n devices on rows of len floats; every device returns how many of its
/// comparisons failed, and none may have failed.
template <class F>
void expect_no_mismatch(pmap::Runtime& rt, int n, Index len, F&& f) {
  F2 x = make<F2>(3, n, len);
  auto mapped = pmap::pmap(std::forward<F>(f), on_axis(rt));
  Tensor<int, 1> bad = mapped(x);
  for (int p = 0; p < n; ++p) EXPECT_EQ(bad(p), 0) << "device " << p;
}

}  // namespace coll_test
