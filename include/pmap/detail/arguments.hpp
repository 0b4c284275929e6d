/// @file arguments.hpp
/// @brief Where arguments are validated and sliced: in_axes resolution, the E2-E5 checks,
/// and the per-device views a kernel receives (SPEC 2.1, 3.1).
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "pmap/axes.hpp"
#include "pmap/detail/assert.hpp"
#include "pmap/detail/blocks.hpp"
#include "pmap/detail/errors.hpp"
#include "pmap/detail/tensor_traits.hpp"

namespace pmap::detail {

// ---- in_axes resolution --------------------------------------------------------------------
/// The spec entry type (int or none_t) that applies to argument K.
template <class Spec, std::size_t K, class Arg>
struct arg_spec;
template <std::size_t K, class Arg>
struct arg_spec<InAxes<>, K, Arg> {
  using type = std::conditional_t<is_tree_v<Arg>, int, none_t>;
  static type get(const InAxes<>&) {
    if constexpr (std::is_same_v<type, int>) return 0;
    else return none;
  }
};
template <class A, std::size_t K, class Arg>
struct arg_spec<InAxes<A>, K, Arg> {
  using type = A;
  static type get(const InAxes<A>& s) { return std::get<0>(s.entries); }
};
template <class A0, class A1, class... A, std::size_t K, class Arg>
struct arg_spec<InAxes<A0, A1, A...>, K, Arg> {
  using type = std::tuple_element_t<K, std::tuple<A0, A1, A...>>;
  static type get(const InAxes<A0, A1, A...>& s) { return std::get<K>(s.entries); }
};

template <class Spec, std::size_t N>
inline constexpr bool in_axes_count_ok = false;
template <class... A, std::size_t N>
inline constexpr bool in_axes_count_ok<InAxes<A...>, N> =
    sizeof...(A) == 0 || sizeof...(A) == 1 || sizeof...(A) == N;

/// What the kernel receives for argument Arg under spec entry type S.
template <class Arg, class S>
using arg_view_t = typename tree_view<std::remove_cvref_t<Arg>, std::is_same_v<S, int>>::type;

// ---- argument paths for messages ("args[1][0]": LeafPath, errors.hpp) ----------------------

template <class Fn, class T>
void for_each_leaf(const T& arg, const LeafPath& path, Fn& fn) {
  using U = std::remove_cvref_t<T>;
  if constexpr (is_tensor_leaf_v<U>) {
    fn(arg, path);
  } else if constexpr (is_tree_v<U>) {
    if constexpr (requires { std::tuple_size<U>::value; } && !requires { arg.size(); }) {
      std::apply(
          [&](const auto&... elems) {
            std::size_t i = 0;
            (for_each_leaf(elems, LeafPath{&path, i++}, fn), ...);
          },
          arg);
    } else {
      std::size_t i = 0;
      for (const auto& elem : arg) for_each_leaf(elem, LeafPath{&path, i++}, fn);
    }
  } else {
    fn(arg, path);  // a non-tensor argument: rank 0
  }
}

template <class T>
Shape leaf_shape(const T& leaf);
template <class T>
const char* leaf_dtype();

/// The arguments' leaves as "float32[8,1024], int32[]" (a trace's call events, on every
/// traced call: without fmt).
template <class... Args>
std::string describe_arguments(const Args&... args) {
  std::string out;
  std::size_t k = 0;
  auto fn = [&](const auto& leaf, const LeafPath&) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if (!out.empty()) out += ", ";
    out += leaf_dtype<L>();
    out += '[';
    const Shape shape = leaf_shape(leaf);
    char digits[24];
    for (int d = 0; d < shape.rank; ++d) {
      if (d) out += ',';
      const auto end = std::to_chars(digits, digits + sizeof digits, shape.dims[static_cast<std::size_t>(d)]).ptr;
      out.append(digits, end);
    }
    out += ']';
  };
  (for_each_leaf(args, LeafPath{nullptr, k++}, fn), ...);
  (void)k, (void)fn;
  return out;
}

template <class T>
Shape leaf_shape(const T& leaf) {
  if constexpr (is_tensor_leaf_v<T>)
    return shape_of_dims(leaf.dimensions(), tensor_leaf<std::remove_cvref_t<T>>::rank);
  else
    return Shape{};
}

template <class T>
const char* leaf_dtype() {
  if constexpr (is_tensor_leaf_v<T>) return dtype_name<typename tensor_leaf<std::remove_cvref_t<T>>::scalar>();
  else return dtype_name<std::remove_cvref_t<T>>();
}

/// The first pass over the arguments: finds the axis size, or what is wrong (no allocation).
struct Survey {
  std::int64_t n = -1;           ///< size of the first mapped leaf
  int mapped_leaves = 0;
  bool sizes_differ = false;
  bool rank_error = false;
  int rank_error_axis = 0;
  Shape rank_error_shape;
};

/// Normalises a possibly negative in_axis against a leaf's rank; -1 if out of range.
inline int normalize_in_axis(int d, int rank) {
  const int a = d < 0 ? d + rank : d;
  return (a < 0 || a >= rank) ? -1 : a;
}

template <class Arg, class S>
void survey_arg(const Arg& arg, S spec, std::size_t k, Survey& s) {
  if constexpr (std::is_same_v<S, int>) {
    auto fn = [&](const auto& leaf, const LeafPath&) {
      const Shape shape = leaf_shape(leaf);
      const int a = normalize_in_axis(spec, shape.rank);
      if (a < 0) {
        if (!s.rank_error) {
          s.rank_error = true;
          s.rank_error_axis = spec;
          s.rank_error_shape = shape;
        }
        return;
      }
      const std::int64_t size = shape.dims[static_cast<std::size_t>(a)];
      if (s.mapped_leaves++ == 0)
        s.n = size;
      else if (size != s.n)
        s.sizes_differ = true;
    };
    for_each_leaf(arg, LeafPath{nullptr, k}, fn);
  }
}

template <class Arg, class S>
void collect_leaves(const Arg& arg, S spec, std::size_t k, std::vector<LeafInfo>& out) {
  if constexpr (std::is_same_v<S, int>) {
    auto fn = [&](const auto& leaf, const LeafPath& path) {
      using L = std::remove_cvref_t<decltype(leaf)>;
      const Shape shape = leaf_shape(leaf);
      int layout = Eigen::ColMajor;
      if constexpr (is_tensor_leaf_v<L>) layout = tensor_leaf<L>::layout;
      out.push_back({path.str(), leaf_dtype<L>(), shape, normalize_in_axis(spec, shape.rank), layout});
    };
    for_each_leaf(arg, LeafPath{nullptr, k}, fn);
  }
}

// ---- per-device views ----------------------------------------------------------------------
/// shard_map's spec entry for one argument: every leaf is cut by `partition` over `mesh`.
struct ShardCut {
  const Partition* partition;
  const MeshShape* mesh;
};

/// Device i's view of a tensor leaf: slice i along axis spec (pmap), the whole leaf (none),
/// or device i's block of a shard_map partition.
template <class Leaf, class S>
auto leaf_view(const Leaf& leaf, S spec, int i, Staging& staging) {
  using Tr = tensor_leaf<std::remove_cvref_t<Leaf>>;
  constexpr int R = Tr::rank;
  if constexpr (std::is_same_v<S, int> && R > 0) {
    const int d = spec < 0 ? spec + R : spec;
    PMAP_ASSERT(d >= 0 && d < R);  // E3 before dispatch
    if (auto view = contiguous_slice(leaf, d, i)) return *view;
  }
  const Shape shape = shape_of_dims(leaf.dimensions(), R);
  if constexpr (std::is_same_v<S, int>) {
    if constexpr (R == 0) {
      return block_view<true>(leaf, Block{shape, {}, shape}, 0, staging);  // E3 before dispatch
    } else {
      const int d = spec < 0 ? spec + R : spec;
      return block_view<true>(leaf, slice_of(shape, d, i), d, staging);
    }
  } else if constexpr (std::is_same_v<S, ShardCut>) {
    return block_view<false>(leaf, block_of(shape, *spec.partition, *spec.mesh, i), -1, staging);
  } else {
    return block_view<false>(leaf, Block{shape, {}, shape}, -1, staging);
  }
}

/// The view of a whole argument for device i.
template <class Arg, class S>
decltype(auto) arg_view(const Arg& arg, S spec, int i, Staging& staging) {
  using U = std::remove_cvref_t<Arg>;
  if constexpr (!is_tree_v<U>) {
    return static_cast<const Arg&>(arg);
  } else if constexpr (is_tensor_leaf_v<U>) {
    return leaf_view(arg, spec, i, staging);
  } else if constexpr (requires { std::tuple_size<U>::value; } && !requires { arg.size(); }) {
    return std::apply(
        [&](const auto&... elems) {
          return std::tuple<std::remove_cvref_t<decltype(arg_view(elems, spec, i, staging))>...>(
              arg_view(elems, spec, i, staging)...);
        },
        arg);
  } else if constexpr (requires { std::tuple_size<U>::value; }) {  // std::array
    return [&]<std::size_t... J>(std::index_sequence<J...>) {
      using V = arg_view_t<typename U::value_type, S>;
      return std::array<V, sizeof...(J)>{arg_view(arg[J], spec, i, staging)...};
    }(std::make_index_sequence<std::tuple_size<U>::value>{});
  } else {  // std::vector
    using V = arg_view_t<typename U::value_type, S>;
    std::vector<V> views;
    views.reserve(arg.size());
    for (const auto& elem : arg) views.push_back(arg_view(elem, spec, i, staging));
    return views;
  }
}

}  // namespace pmap::detail
