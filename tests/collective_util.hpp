/// @file collective_util.hpp
/// @brief Helpers of the collective, nesting and misuse suites: runtimes, options,
/// deterministic tensors, serial references of the collectives and exception checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <exception>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <pmap/pmap.hpp>
#include <unsupported/Eigen/CXX11/Tensor>

namespace coll_test {

using Eigen::ColMajor;
using Eigen::Index;
using Eigen::RowMajor;

template <class T, int R, int L = RowMajor>
using Tensor = Eigen::Tensor<T, R, L>;

// ---- runtimes and options ----------------------------------------------------------------

/// One runtime shape a parameterised test runs on.
struct RtConfig {
  int devices;
  int threads;
};

inline std::string config_name(const testing::TestParamInfo<RtConfig>& info) {
  return "d" + std::to_string(info.param.devices) + "t" + std::to_string(info.param.threads);
}

/// Options binding `axis` on `rt` (a helper: partial designated initializers of Options trip
/// -Wmissing-field-initializers).
inline pmap::Options on(pmap::Runtime& rt, std::string axis = "i") {
  pmap::Options o;
  o.axis_name = std::move(axis);
  o.runtime = &rt;
  return o;
}

/// Fixture owning a fresh Runtime of the parameter's shape; the axis spans every device.
class RuntimeTest : public testing::TestWithParam<RtConfig> {
 protected:
  void SetUp() override {
    rt_ = std::make_unique<pmap::Runtime>(
        pmap::RuntimeConfig{.num_devices = GetParam().devices, .num_threads = GetParam().threads});
  }
  pmap::Runtime& rt() { return *rt_; }
  int n() const { return GetParam().devices; }

  std::unique_ptr<pmap::Runtime> rt_;
};

/// Ring permutation (d, d + shift mod n) as ppermute pairs.
inline std::vector<std::pair<int, int>> ring(int n, int shift) {
  std::vector<std::pair<int, int>> perm;
  for (int d = 0; d < n; ++d) perm.emplace_back(d, ((d + shift) % n + n) % n);
  return perm;
}

// ---- deterministic tensors ---------------------------------------------------------------

/// Small exactly representable values that differ between positions and seeds.
template <class T>
T value_at(Index k, int seed) {
  if constexpr (std::is_same_v<T, bool>) {
    return (k * 7 + seed) % 3 == 0;
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(((k * 7 + seed * 3) % 23) * 0.5 - 4.0);
  } else {
    return static_cast<T>((k * 7 + seed * 3) % 23 - 5);
  }
}

/// A tensor of the given dimensions holding value_at(storage index, seed).
template <class TensorT, class... D>
TensorT make(int seed, D... dims) {
  TensorT t(static_cast<Index>(dims)...);
  for (Index k = 0; k < t.size(); ++k) t.data()[k] = value_at<typename TensorT::Scalar>(k, seed);
  return t;
}

template <class TensorT, std::size_t R>
TensorT make_dims(int seed, const std::array<Index, R>& dims) {
  TensorT t(dims);
  for (Index k = 0; k < t.size(); ++k) t.data()[k] = value_at<typename TensorT::Scalar>(k, seed);
  return t;
}

// ---- comparison --------------------------------------------------------------------------

template <class D>
std::string dims_string(const D& d, int rank) {
  std::ostringstream s;
  s << "(";
  for (int k = 0; k < rank; ++k) s << (k ? ", " : "") << d[static_cast<std::size_t>(k)];
  if (rank == 1) s << ",";
  s << ")";
  return s.str();
}

template <class T>
std::string value_string(const T& v) {
  std::ostringstream s;
  if constexpr (std::is_same_v<T, bool>) s << (v ? "true" : "false");
  else if constexpr (sizeof(T) == 1) s << static_cast<int>(v);
  else s << v;
  return s.str();
}

template <class T>
bool close(const T& a, const T& b) {
  if constexpr (std::is_floating_point_v<T>) {
    const T tol = std::is_same_v<T, float> ? T(1e-5) : T(1e-12);
    return std::abs(a - b) <= tol * std::max(T(1), std::abs(b));
  } else {
    return a == b;
  }
}

/// Same rank, scalar type, dimensions and elements (by index, so layouts may differ);
/// floating point within a relative 1e-5 (float) / 1e-12 (double).
template <class A, class B>
testing::AssertionResult tensors_equal(const A& actual, const B& expected) {
  using TA = std::remove_cvref_t<typename A::Scalar>;
  using TB = std::remove_cvref_t<typename B::Scalar>;
  constexpr int RA = A::NumDimensions;
  constexpr int RB = B::NumDimensions;
  if constexpr (RA != RB) {
    return testing::AssertionFailure() << "rank " << RA << " != expected rank " << RB;
  } else if constexpr (!std::is_same_v<TA, TB>) {
    return testing::AssertionFailure() << "scalar type " << typeid(TA).name() << " != expected "
                                       << typeid(TB).name();
  } else {
    constexpr int R = RA;
    for (int k = 0; k < R; ++k)
      if (actual.dimension(k) != expected.dimension(k))
        return testing::AssertionFailure() << "shape " << dims_string(actual.dimensions(), R)
                                           << " != expected "
                                           << dims_string(expected.dimensions(), R);
    Index total = 1;
    for (int k = 0; k < R; ++k) total *= expected.dimension(k);
    std::array<Index, static_cast<std::size_t>(R == 0 ? 1 : R)> idx{};
    for (Index flat = 0; flat < total; ++flat) {
      Index rem = flat;
      for (int k = R - 1; k >= 0; --k) {
        idx[static_cast<std::size_t>(k)] = rem % expected.dimension(k);
        rem /= expected.dimension(k);
      }
      TA a{};
      TA b{};
      if constexpr (R == 0) {
        a = actual();
        b = expected();
      } else {
        std::array<Index, static_cast<std::size_t>(R)> at{};
        for (int k = 0; k < R; ++k) at[static_cast<std::size_t>(k)] = idx[static_cast<std::size_t>(k)];
        a = actual(at);
        b = expected(at);
      }
      if (!close(a, b))
        return testing::AssertionFailure() << "element " << dims_string(idx, R) << ": "
                                           << value_string(a) << " != expected "
                                           << value_string(b);
    }
    return testing::AssertionSuccess();
  }
}

// ---- serial references (global tensors: axis 0 is the device axis) -----------------------

/// Part p of a stacked tensor: what device p holds.
template <class T, int R, int L>
Tensor<T, R - 1, L> part(const Tensor<T, R, L>& x, Index p) {
  Tensor<T, R - 1, L> s = x.chip(p, 0);
  return s;
}

/// Stacks equally shaped parts along a new axis d.
template <class T, int R, int L>
Tensor<T, R + 1, L> stack(const std::vector<Tensor<T, R, L>>& parts, int d) {
  std::array<Index, R + 1> dims{};
  const auto& first = parts.at(0).dimensions();
  for (int k = 0, j = 0; k < R + 1; ++k)
    dims[static_cast<std::size_t>(k)] =
        k == d ? static_cast<Index>(parts.size()) : first[static_cast<std::size_t>(j++)];
  Tensor<T, R + 1, L> out(dims);
  for (std::size_t i = 0; i < parts.size(); ++i) out.chip(static_cast<Index>(i), d) = parts[i];
  return out;
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

template <class T, int R, int L>
std::vector<Tensor<T, R - 1, L>> parts_of(const Tensor<T, R, L>& x) {
  std::vector<Tensor<T, R - 1, L>> parts;
  for (Index p = 0; p < x.dimension(0); ++p) parts.push_back(part(x, p));
  return parts;
}

// ---- exceptions --------------------------------------------------------------------------

/// Runs f, which must throw exactly type E (or a subclass) with what() == message.
template <class E, class F>
void expect_throw_msg(F&& f, std::string_view message) {
  try {
    f();
  } catch (const E& e) {
    EXPECT_EQ(std::string(e.what()), std::string(message));
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected " << typeid(E).name() << " \"" << message << "\", got "
                  << typeid(e).name() << " \"" << e.what() << "\"";
    return;
  } catch (...) {
    ADD_FAILURE() << "expected " << typeid(E).name() << ", got a non-std exception";
    return;
  }
  ADD_FAILURE() << "expected " << typeid(E).name() << " \"" << message << "\", nothing thrown";
}

/// Runs f, which must throw E; returns what() ("" when it did not).
template <class E, class F>
std::string catch_message(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected " << typeid(E).name() << ", got " << typeid(e).name() << " \""
                  << e.what() << "\"";
    return "";
  } catch (...) {
    ADD_FAILURE() << "expected " << typeid(E).name() << ", got a non-std exception";
    return "";
  }
  ADD_FAILURE() << "expected " << typeid(E).name() << ", nothing thrown";
  return "";
}

}  // namespace coll_test
