/// @file trees.hpp
/// @brief Reductions over trees of operands (SPEC 10): a std::tuple (std::tie included),
/// std::array or std::vector of operands, nested, reduced in ONE collective.
///
/// The devices meet once for the whole tree. Small trees (up to kStagedBytes) are packed
/// into one buffer, which takes the engine's staged path like a small tensor; larger trees
/// publish a table of their leaves' buffers, which the peers read in place. Either way each
/// leaf is reduced into its own result, as it would be alone.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "pmap/context.hpp"
#include "pmap/detail/buffers.hpp"
#include "pmap/detail/hash.hpp"
#include "pmap/detail/reduce_kernels.hpp"
#include "pmap/detail/reductions.hpp"
#include "pmap/detail/rendezvous.hpp"

namespace pmap::detail {

/// Whether X is a tree of collective operands rather than one operand.
template <class X>
struct is_operand_tree : std::false_type {};
template <class... Xs>
struct is_operand_tree<std::tuple<Xs...>> : std::true_type {};
template <class X, std::size_t N>
struct is_operand_tree<std::array<X, N>> : std::true_type {};
template <class X, class A>
struct is_operand_tree<std::vector<X, A>> : std::true_type {};
template <class X>
inline constexpr bool is_operand_tree_v = is_operand_tree<std::remove_cvref_t<X>>::value;

/// The result scalar of reduction K over scalar T (bool sums to int32, integers average to
/// double).
template <OpKind K, class T>
using reduce_acc_t = std::conditional_t<K == OpKind::psum, psum_acc<T>,
                                        std::conditional_t<K == OpKind::pmean, pmean_acc<T>, T>>;

/// A Core operand's collective result (a tensor of the operand's rank) as the operand's plain
/// object type with the result's scalar (SPEC 10: an integer pmean gives a double matrix).
template <class X, class Result>
auto core_result(const typename X::PlainObject& plain, const Result& result) {
  using Acc = typename Result::Scalar;
  using Out = typename std::remove_cvref_t<decltype(plain.template cast<Acc>())>::PlainObject;
  Out out;
  out.resize(plain.rows(), plain.cols());
  if (out.size() > 0) std::copy(result.data(), result.data() + out.size(), out.data());
  return out;
}

/// A collective of a Core operand: run by `fn` on the operand's storage as a tensor.
template <class X, class Fn>
auto core_collective(const X& x, Fn&& fn) {
  const typename X::PlainObject& plain = x;  // the object itself, or evaluated
  return core_result<X>(plain, fn(core_as_tensor<X>(plain)));
}

/// Builds a child node in place (a std::tuple of nodes constructs each from one of these).
template <OpKind K, class X>
struct NodeInit {
  Context& ctx;
  const X& x;
};

/// A node of the tree being reduced: a leaf (its operand and result) or a container of
/// nodes. Nodes stay where they are built: the peers read their buffers in place.
template <OpKind K, class X, class = void>
class TreeNode {
  using T = typename Operand<X>::T;
  using Acc = reduce_acc_t<K, T>;

 public:
  TreeNode(Context& ctx, const X& x)
      : op_(x), result_(make_result<Acc, Operand<X>::rank, Operand<X>::layout>(ctx, op_.shape())) {}
  TreeNode(NodeInit<K, X> init) : TreeNode(init.ctx, init.x) {}
  TreeNode(const TreeNode&) = delete;
  TreeNode& operator=(const TreeNode&) = delete;

  /// Calls fn(leaf) for every leaf, depth first.
  template <class Fn>
  void each(Fn&& fn) { fn(*this); }

  const void* input() const { return op_.data(); }
  std::size_t bytes() const { return static_cast<std::size_t>(op_.shape().size()) * sizeof(T); }
  std::uint64_t signature() const {
    return op_signature(K, dtype_name<T>(), op_.shape(), {static_cast<std::int64_t>(sizeof(Acc))});
  }
  /// Reduces member k's copy of this leaf, input(k), over the n members into the result.
  template <class Input>
  void reduce(int n, const Input& input) {
    reduce_block<K, Acc, T>(result_.data(), op_.shape().size(), n,
                            [&](int k) { return static_cast<const T*>(static_cast<const void*>(input(k))); });
  }
  auto take() { return finish_reduce<X>(std::move(result_)); }

 private:
  Operand<X> op_;
  Eigen::Tensor<Acc, Operand<X>::rank, Operand<X>::layout> result_;
};

/// A Core leaf (Matrix, Array, Map, expression): reduced as its storage seen as a tensor.
template <OpKind K, class X>
class TreeNode<K, X, std::enable_if_t<is_core_dense_v<X>>> {
  using P = typename X::PlainObject;
  using View = decltype(core_as_tensor<X>(std::declval<const P&>()));

 public:
  TreeNode(Context& ctx, const X& x) : plain_(x), inner_(ctx, core_as_tensor<X>(plain_)) {}
  TreeNode(NodeInit<K, X> init) : TreeNode(init.ctx, init.x) {}

  template <class Fn>
  void each(Fn&& fn) { fn(inner_); }
  auto take() { return core_result<X>(plain_, inner_.take()); }

 private:
  std::conditional_t<is_core_plain_v<X>, const P&, P> plain_;  ///< evaluated unless plain
  TreeNode<K, View> inner_;
};

template <OpKind K, class... Xs>
class TreeNode<K, std::tuple<Xs...>> {
  template <class Y>
  using Child = TreeNode<K, std::remove_cvref_t<Y>>;

 public:
  TreeNode(Context& ctx, const std::tuple<Xs...>& x)
      : TreeNode(ctx, x, std::index_sequence_for<Xs...>{}) {}
  TreeNode(NodeInit<K, std::tuple<Xs...>> init) : TreeNode(init.ctx, init.x) {}

  template <class Fn>
  void each(Fn&& fn) {
    std::apply([&](auto&... child) { (child.each(fn), ...); }, children_);
  }
  auto take() {
    return std::apply([](auto&... child) { return std::make_tuple(child.take()...); }, children_);
  }

 private:
  template <std::size_t... I>
  TreeNode(Context& ctx, const std::tuple<Xs...>& x, std::index_sequence<I...>)
      : children_(NodeInit<K, std::remove_cvref_t<Xs>>{ctx, std::get<I>(x)}...) {}
  std::tuple<Child<Xs>...> children_;
};

/// std::array and std::vector: children on the heap, in order.
template <OpKind K, class X>
class TreeNode<K, X, std::enable_if_t<is_operand_tree_v<X> && requires { typename X::value_type; }>> {
  using Child = TreeNode<K, std::remove_cvref_t<typename X::value_type>>;

 public:
  TreeNode(Context& ctx, const X& x) {
    children_.reserve(x.size());
    for (const auto& elem : x) children_.push_back(std::make_unique<Child>(ctx, elem));
  }
  TreeNode(NodeInit<K, X> init) : TreeNode(init.ctx, init.x) {}

  template <class Fn>
  void each(Fn&& fn) {
    for (auto& child : children_) child->each(fn);
  }
  auto take() {
    using Result = decltype(std::declval<Child&>().take());
    if constexpr (requires { std::tuple_size<X>::value; }) {
      return take_array<Result>(std::make_index_sequence<std::tuple_size<X>::value>{});
    } else {
      std::vector<Result> out;
      out.reserve(children_.size());
      for (auto& child : children_) out.push_back(child->take());
      return out;
    }
  }

 private:
  template <class Result, std::size_t... I>
  std::array<Result, sizeof...(I)> take_array(std::index_sequence<I...>) {
    return {children_[I]->take()...};
  }
  std::vector<std::unique_ptr<Child>> children_;
};

/// The same tree shape with fn(leaf) at every leaf, called depth first, left to right (the
/// order every device calls its collectives in).
template <class X, class Fn>
auto map_tree(const X& x, Fn&& fn) {
  using U = std::remove_cvref_t<X>;
  if constexpr (!is_operand_tree_v<U>) {
    return fn(x);
  } else if constexpr (requires { typename U::value_type; }) {
    using R = decltype(map_tree(std::declval<const typename U::value_type&>(), fn));
    if constexpr (requires { std::tuple_size<U>::value; }) {
      return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return std::array<R, sizeof...(I)>{map_tree(x[I], fn)...};  // braces: left to right
      }(std::make_index_sequence<std::tuple_size<U>::value>{});
    } else {
      std::vector<R> out;
      out.reserve(x.size());
      for (const auto& elem : x) out.push_back(map_tree(elem, fn));
      return out;
    }
  } else {
    return std::apply(
        [&](const auto&... elem) {
          return std::tuple<decltype(map_tree(elem, fn))...>{map_tree(elem, fn)...};
        },
        x);
  }
}

/// Where leaf j starts in a packed tree: leaves aligned like any allocation.
inline std::size_t packed_size(std::size_t bytes) {
  constexpr std::size_t a = alignof(std::max_align_t);
  return (bytes + a - 1) / a * a;
}

/// A tree's collective: every leaf's signature and the leaf count in one, described to
/// error messages as `tree[leaves]`; `packed` gets the bytes of the leaves packed together.
template <class Tree>
Collective describe_tree(Tree& tree, const char* name, int& leaves, std::size_t& packed) {
  leaves = 0;
  packed = 0;
  std::uint64_t signature = kHashSeed;
  tree.each([&](auto& leaf) {
    ++leaves;
    packed += packed_size(leaf.bytes());
    signature = hash_mix(signature, leaf.signature());
  });
  Shape described;
  described.rank = 1;
  described.dims[0] = leaves;
  return Collective{name, hash_mix(signature, static_cast<std::uint64_t>(leaves)), "tree",
                    described, 0, nullptr, nullptr, 1};
}

/// The packed path: every leaf copied into one buffer, which the engine stages (or gathers
/// across processes) like one input; leaf j of member k is at the same offset of its copy.
template <class Tree>
void reduce_packed(Context& ctx, const GroupInfo& g, Collective c, Tree& tree, std::size_t packed) {
  alignas(64) unsigned char local[kStagedBytes];
  std::vector<unsigned char> heap(packed <= kStagedBytes ? 0 : packed);
  unsigned char* buffer = packed <= kStagedBytes ? local : heap.data();
  std::size_t at = 0;
  tree.each([&](auto& leaf) {
    if (leaf.bytes() > 0) std::memcpy(buffer + at, leaf.input(), leaf.bytes());
    at += packed_size(leaf.bytes());
  });
  c.bytes = packed;
  c.in = buffer;
  const int n = static_cast<int>(g.members.size());
  rendezvous<unsigned char>(ctx, g, c, [&](Peers<unsigned char>& peers) {
    std::size_t offset = 0;
    tree.each([&](auto& leaf) {
      leaf.reduce(n, [&](int k) { return peers.input(k) + offset; });
      offset += packed_size(leaf.bytes());
    });
  });
}

/// The in-place path: a table of the leaves' buffers, which the peers read directly.
template <class Tree>
void reduce_in_place(Context& ctx, const GroupInfo& g, Collective c, Tree& tree, int leaves) {
  std::vector<const void*> table;
  table.reserve(static_cast<std::size_t>(leaves));
  tree.each([&](auto& leaf) { table.push_back(leaf.input()); });
  c.bytes = table.size() * sizeof(const void*);
  c.in = table.data();
  c.in_place = true;
  const int n = static_cast<int>(g.members.size());
  rendezvous<const void*>(ctx, g, c, [&](Peers<const void*>& peers) {
    std::size_t j = 0;
    tree.each([&](auto& leaf) {
      leaf.reduce(n, [&](int k) { return peers.input(k)[j]; });
      ++j;
    });
  });
}

/// psum / pmean / pmax / pmin of a tree: one collective for every leaf, packed up to
/// kStagedBytes (and across processes), in place above.
template <OpKind K, class X>
auto reduce_tree(Context& ctx, const X& x, const AxisNames& axes, const Groups& groups,
                 const char* name) {
  TreeNode<K, std::remove_cvref_t<X>> tree(ctx, x);
  const GroupInfo& g = Access::group(ctx, axes, groups, false, name);
  int leaves = 0;
  std::size_t packed = 0;
  const Collective c = describe_tree(tree, name, leaves, packed);
  if (packed <= kStagedBytes || Access::member(ctx).team->distributed())
    reduce_packed(ctx, g, c, tree, packed);
  else
    reduce_in_place(ctx, g, c, tree, leaves);
  return tree.take();
}

}  // namespace pmap::detail
