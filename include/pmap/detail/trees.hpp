/// @file trees.hpp
/// @brief Collectives over trees of operands (SPEC 10): a std::tuple (std::tie included),
/// std::array or std::vector of operands, nested, in ONE collective.
///
/// The devices meet once for the whole tree. Small trees (up to kStagedBytes), and every
/// tree across processes, are packed into one buffer, which takes the engine's staged (or
/// gathered) path like a small tensor; larger trees publish a table of their leaves'
/// buffers, which the peers read in place (and a reduction tree of 64 KiB or more splits
/// its work over the members, as a lone large reduction does). Either way each leaf's work (a reduction, a
/// gather, a permutation: a leaf class of reductions.hpp or data_movement.hpp, chosen by
/// the tree's operation) writes its own result, as it would alone.
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
#include "pmap/detail/data_movement.hpp"
#include "pmap/detail/hash.hpp"
#include "pmap/detail/reduce_kernels.hpp"
#include "pmap/detail/reductions.hpp"
#include "pmap/detail/rendezvous.hpp"

namespace pmap::detail {

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

/// The leaf of a reduction K over one operand: its operand and its result. A donated
/// operand (an Eigen::Tensor leaf of a tree passed as an rvalue) becomes the device's spare
/// buffer afterwards, as a donated tensor's does (buffers.hpp, recycle).
template <OpKind K, class X>
class ReduceLeaf : public Described {
  using T = typename Operand<X>::T;
  using Acc = reduce_acc_t<K, T>;

 public:
  template <class Source, class Op>
  ReduceLeaf(Context& ctx, Source&& x, const Op&)
      : ctx_(ctx), op_(std::forward<Source>(x)),
        result_(make_result<Acc, Operand<X>::rank, Operand<X>::layout>(ctx, op_.shape())) {
    described_ = detail::describe<T>("", K, op_.shape(), {static_cast<std::int64_t>(sizeof(Acc))}, op_.data(),
                                     result_.data());
  }

  /// Reduces member k's copy of this leaf, input(k), over the n members into the result.
  template <class Input>
  void work(int n, const Input& input) {
    reduce_block<K, Acc, T>(result_.data(), op_.shape().size(), n,
                            [&](int k) { return static_cast<const T*>(static_cast<const void*>(input(k))); });
  }

  // A split reduction of the tree (reduce_split): chunk p of the leaf is member p's.
  void* output() { return result_.data(); }
  /// Reduces chunk p of n of the members' inputs into the same chunk of the result.
  template <class Input>
  void reduce_chunk(int n, int p, const Input& input) {
    const std::int64_t begin = chunk(n, p), end = chunk(n, p + 1);
    reduce_block<K, Acc, T>(result_.data() + begin, end - begin, n, [&](int k) {
      return static_cast<const T*>(static_cast<const void*>(input(k))) + begin;
    });
  }
  /// Copies chunk p of n from `from`, the result of member p.
  void copy_chunk(int n, int p, const void* from) {
    const std::int64_t begin = chunk(n, p), end = chunk(n, p + 1);
    const auto bytes = static_cast<std::size_t>(end - begin) * sizeof(Acc);
    copy_run(result_.data() + begin, static_cast<const Acc*>(from) + begin, bytes, false);
  }
  auto take() {
    recycle(ctx_, op_);
    return finish_reduce<X>(std::move(result_));
  }

 private:
  std::int64_t chunk(int n, int p) const { return op_.shape().size() * p / n; }
  Context& ctx_;
  Operand<X> op_;
  Eigen::Tensor<Acc, Operand<X>::rank, Operand<X>::layout> result_;
};

/// A tree's reduction K: the leaves are ReduceLeaf, which large trees split (reduce_split).
template <OpKind K>
struct ReduceTree {
  static constexpr bool kSplits = true;
  template <class X>
  using Leaf = ReduceLeaf<K, X>;
};

/// The leaf of collective Op over an Eigen Core operand X (SPEC 10), alone (a started
/// reduction's) or in a tree (TreeNode): Op's leaf over the operand's storage seen as a
/// tensor, its result the operand's plain object type, as core_collective gives it.
/// `Owned`: the operand is the collective's own (a started one's rvalue or expression),
/// moved in; else a Matrix or Array is read where it is and a Map or expression evaluated,
/// as the blocking call does.
template <class Op, class X, bool Owned>
class CoreLeaf {
  using P = typename X::PlainObject;
  using View = decltype(core_as_tensor<X>(std::declval<const P&>()));

 public:
  template <class Source>
  CoreLeaf(Context& ctx, Source&& x, const Op& op)
      : plain_(std::forward<Source>(x)), leaf_(ctx, core_as_tensor<X>(plain_), op) {}

  decltype(auto) describe() { return leaf_.describe(); }
  auto& leaf() { return leaf_; }
  std::size_t bytes() const { return leaf_.bytes(); }
  template <class Peers>
  void work(Peers& peers) {
    leaf_.work(peers);
  }
  auto take() { return core_result<X>(plain_, leaf_.take()); }

 private:
  std::conditional_t<is_core_plain_v<X> && !Owned, const P&, P> plain_;
  typename Op::template Leaf<View> leaf_;
};

template <class Op, class X>
using LeafOf = typename Op::template Leaf<X>;

/// Builds a child node in place (a std::tuple of nodes constructs each from one of these):
/// the child's operand as `Source&&` (const X&, or X&& when the tree was passed as an rvalue).
template <class Op, class Source>
struct NodeInit {
  Context& ctx;
  std::remove_reference_t<Source>* x;
  const Op& op;
};
template <class Op, class Source>
NodeInit<Op, Source> node_init(Context& ctx, Source&& x, const Op& op) {
  return {ctx, std::addressof(x), op};
}

/// A node of a tree in its collective: a leaf (the operation's Leaf: its operand and
/// result) or a container of nodes. Nodes stay where they are built: the peers read their
/// buffers in place. Each constructor takes its operand as `Source&&`: a const X& or, from a
/// tree passed as an rvalue, an X&& whose owned tensors the leaves take over (donation).
template <class Op, class X, class = void>
class TreeNode {
 public:
  template <class Source>
  TreeNode(Context& ctx, Source&& x, const Op& op) : leaf_(ctx, std::forward<Source>(x), op) {}
  template <class Source>
  TreeNode(NodeInit<Op, Source> init) : TreeNode(init.ctx, static_cast<Source&&>(*init.x), init.op) {}
  TreeNode(const TreeNode&) = delete;
  TreeNode& operator=(const TreeNode&) = delete;

  /// Calls fn(leaf) for every leaf, depth first.
  template <class Fn>
  void each(Fn&& fn) { fn(leaf_); }
  auto take() { return leaf_.take(); }

 private:
  LeafOf<Op, X> leaf_;
};

/// A Core leaf (Matrix, Array, Map, expression): its storage seen as a tensor (CoreLeaf).
template <class Op, class X>
class TreeNode<Op, X, std::enable_if_t<is_core_dense_v<X>>> {
 public:
  TreeNode(Context& ctx, const X& x, const Op& op) : core_(ctx, x, op) {}
  template <class Source>
  TreeNode(NodeInit<Op, Source> init) : TreeNode(init.ctx, *init.x, init.op) {}

  template <class Fn>
  void each(Fn&& fn) { fn(core_.leaf()); }
  auto take() { return core_.take(); }

 private:
  CoreLeaf<Op, X, false> core_;
};

template <class Op, class... Xs>
class TreeNode<Op, std::tuple<Xs...>> {
  template <class Y>
  using Child = TreeNode<Op, std::remove_cvref_t<Y>>;

 public:
  template <class Source>
  TreeNode(Context& ctx, Source&& x, const Op& op)
      : TreeNode(ctx, std::forward<Source>(x), op, std::index_sequence_for<Xs...>{}) {}
  template <class Source>
  TreeNode(NodeInit<Op, Source> init) : TreeNode(init.ctx, static_cast<Source&&>(*init.x), init.op) {}

  template <class Fn>
  void each(Fn&& fn) {
    std::apply([&](auto&... child) { (child.each(fn), ...); }, children_);
  }
  auto take() {
    return std::apply([](auto&... child) { return std::make_tuple(child.take()...); }, children_);
  }

 private:
  // std::get of an rvalue tuple gives its values as rvalues, its references as they are.
  template <class Source, std::size_t... I>
  TreeNode(Context& ctx, Source&& x, const Op& op, std::index_sequence<I...>)
      : children_(node_init(ctx, std::get<I>(std::forward<Source>(x)), op)...) {}
  std::tuple<Child<Xs>...> children_;
};

/// std::array and std::vector: children on the heap, in order.
template <class Op, class X>
class TreeNode<Op, X, std::enable_if_t<is_operand_tree_v<X> && requires { typename X::value_type; }>> {
  using Child = TreeNode<Op, std::remove_cvref_t<typename X::value_type>>;

 public:
  template <class Source>
  TreeNode(Context& ctx, Source&& x, const Op& op) {
    children_.reserve(x.size());
    for (auto& elem : x) {
      if constexpr (std::is_lvalue_reference_v<Source>)
        children_.push_back(std::make_unique<Child>(ctx, std::as_const(elem), op));
      else
        children_.push_back(std::make_unique<Child>(ctx, std::move(elem), op));
    }
  }
  template <class Source>
  TreeNode(NodeInit<Op, Source> init) : TreeNode(init.ctx, static_cast<Source&&>(*init.x), init.op) {}

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

/// Whether a tree has an Eigen Core leaf (which the rank-changing collectives reject).
template <class X>
constexpr bool has_core_leaf() {
  using U = std::remove_cvref_t<X>;
  if constexpr (is_core_dense_v<U>) {
    return true;
  } else if constexpr (!is_operand_tree_v<U>) {
    return false;
  } else if constexpr (requires { typename U::value_type; }) {
    return has_core_leaf<typename U::value_type>();
  } else {
    return []<class... Ys>(std::type_identity<std::tuple<Ys...>>) {
      return (has_core_leaf<Ys>() || ...);
    }(std::type_identity<U>{});
  }
}

/// Where leaf j starts in a packed tree: leaves aligned like any allocation.
inline std::size_t packed_size(std::size_t bytes) {
  constexpr std::size_t a = alignof(std::max_align_t);
  return (bytes + a - 1) / a * a;
}

/// A tree's collective: every leaf's signature and the leaf count in one, described to
/// error messages as `tree[leaves]` (and leaf by leaf in `slot`, this device's, for E14);
/// `packed` gets the bytes of the leaves packed together.
template <class Tree>
Collective describe_tree(Tree& tree, const char* name, Slot& slot, int& leaves, std::size_t& packed) {
  leaves = 0;
  packed = 0;
  std::uint64_t signature = kHashSeed;
  tree.each([&](auto& leaf) {
    const std::uint64_t leaf_signature = leaf.signature();
    if (leaves < Slot::kDescribedLeaves) slot.leaf_signatures[leaves] = leaf_signature;
    ++leaves;
    packed += packed_size(leaf.bytes());
    signature = hash_mix(signature, leaf_signature);
  });
  slot.leaf_count = leaves;
  Shape described;
  described.rank = 1;
  described.dims[0] = leaves;
  return Collective{name, hash_mix(signature, static_cast<std::uint64_t>(leaves)), "tree",
                    described, 0, nullptr, nullptr, 1};
}

/// The bytes of operand x (a tensor, TensorMap, scalar or Core object): what a posted
/// collective stages of it.
template <class X>
std::size_t operand_bytes(const X& x) {
  constexpr std::size_t scalar = sizeof(typename output_leaf<X>::scalar);
  if constexpr (is_arithmetic_scalar_v<X>)
    return scalar;
  else
    return scalar * static_cast<std::size_t>(x.size());
}

/// The packed bytes of a tree operand: what describe_tree() counts once its nodes are built
/// (each leaf's input, aligned as pack_leaves() places it).
template <class X>
std::size_t tree_packed_bytes(const X& x) {
  if constexpr (is_operand_tree_v<X>) {
    std::size_t total = 0;
    if constexpr (requires { typename X::value_type; })
      for (const auto& elem : x) total += tree_packed_bytes(elem);
    else
      std::apply([&total](const auto&... e) { ((total += tree_packed_bytes(e)), ...); }, x);
    return total;
  } else {
    return packed_size(operand_bytes(x));
  }
}

/// Copies every leaf's input into `buffer`, leaf j at the same offset on every member.
template <class Tree>
void pack_leaves(Tree& tree, unsigned char* buffer) {
  std::size_t at = 0;
  tree.each([&](auto& leaf) {
    if (leaf.bytes() > 0) std::memcpy(buffer + at, leaf.input(), leaf.bytes());
    at += packed_size(leaf.bytes());
  });
}

/// Every leaf's work over the peers' packed copies (pack_leaves).
template <class Tree, class Peers>
void work_packed(Tree& tree, Peers& peers) {
  const int n = peers.size();
  std::size_t offset = 0;
  tree.each([&](auto& leaf) {
    leaf.work(n, [&](int k) { return peers.input(k) + offset; });
    offset += packed_size(leaf.bytes());
  });
}

/// The packed path: every leaf copied into one buffer, which the engine stages (or gathers
/// across processes) like one input; leaf j of member k is at the same offset of its copy.
template <class Tree>
void meet_packed(Context& ctx, const GroupInfo& g, Collective c, Tree& tree, std::size_t packed) {
  alignas(64) unsigned char local[kStagedBytes];
  std::vector<unsigned char> heap(packed <= kStagedBytes ? 0 : packed);
  unsigned char* buffer = packed <= kStagedBytes ? local : heap.data();
  pack_leaves(tree, buffer);
  c.bytes = packed;
  c.in = buffer;
  rendezvous<unsigned char>(ctx, g, c,
                            [&](Peers<unsigned char>& peers) { work_packed(tree, peers); });
}

/// The in-place path: a table of the leaves' buffers, which the peers read directly.
template <class Tree>
void meet_in_place(Context& ctx, const GroupInfo& g, Collective c, Tree& tree, int leaves) {
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
      leaf.work(n, [&](int k) { return peers.input(k)[j]; });
      ++j;
    });
  });
}

/// A reduction tree of kSplitReductionBytes or more over 2+ members of one process, split
/// as a lone large reduction is (split_reduce): member p reduces chunk p of every leaf,
/// then, after a sync, copies the other chunks from the results of the members that
/// reduced them; each member does 1/n of the reduction instead of all of it. The peers
/// read two tables in place: the leaves' inputs and their results.
template <class Tree>
void reduce_split(Context& ctx, const GroupInfo& g, Collective c, Tree& tree, int leaves) {
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  inputs.reserve(static_cast<std::size_t>(leaves));
  outputs.reserve(static_cast<std::size_t>(leaves));
  tree.each([&](auto& leaf) {
    inputs.push_back(leaf.input());
    outputs.push_back(leaf.output());
  });
  c.bytes = inputs.size() * sizeof(const void*);
  c.in = inputs.data();
  c.out = outputs.data();
  c.in_place = true;
  c.steps = 2;
  const int n = static_cast<int>(g.members.size());
  rendezvous<const void*>(ctx, g, c, [&](Peers<const void*>& peers) {
    const int me = peers.position();
    std::size_t j = 0;
    tree.each([&](auto& leaf) {
      leaf.reduce_chunk(n, me, [&](int k) { return peers.input(k)[j]; });
      ++j;
    });
    peers.sync();
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      void* const* results = static_cast<void* const*>(peers.output(p));
      j = 0;
      tree.each([&](auto& leaf) { leaf.copy_chunk(n, p, results[j++]); });
    }
  });
}

/// Tree `x`'s collective `op` over group g: one rendezvous for every leaf, packed up to
/// kStagedBytes (and across processes), in place above, split from kSplitReductionBytes
/// when the operation is a reduction. `x` is a const tree or an rvalue
/// one (its owned tensors donated); `salt` is added to the collective's signature.
template <class Op, class X>
auto tree_collective(Context& ctx, X&& x, const Op& op, const GroupInfo& g, const char* name,
                     std::uint64_t salt = 0) {
  TreeNode<Op, std::remove_cvref_t<X>> tree(ctx, std::forward<X>(x), op);
  int leaves = 0;
  std::size_t packed = 0;
  Member& me = Access::member(ctx);
  Collective c = describe_tree(tree, name, me.team->slot(me.index), leaves, packed);
  c.signature ^= salt;
  if (packed <= kStagedBytes || me.team->distributed()) {
    meet_packed(ctx, g, c, tree, packed);
    return tree.take();
  }
  if constexpr (requires { Op::kSplits; }) {
    if (g.members.size() > 1 && packed >= static_cast<std::size_t>(kSplitReductionBytes)) {
      reduce_split(ctx, g, c, tree, leaves);
      return tree.take();
    }
  }
  meet_in_place(ctx, g, c, tree, leaves);
  return tree.take();
}

/// psum / pmean / pmax / pmin of a tree.
template <OpKind K, class X>
auto reduce_tree(Context& ctx, X&& x, const AxisNames& axes, const Groups& groups, const char* name) {
  const GroupInfo& g = Access::group(ctx, axes, groups, false, name);
  return tree_collective(ctx, std::forward<X>(x), ReduceTree<K>{}, g, name);
}

/// all_gather of a tree.
template <bool Tiled, class X>
auto all_gather_tree(Context& ctx, const X& x, const AxisNames& axes, int axis, const Groups& groups) {
  const GroupInfo& g = Access::group(ctx, axes, groups, true, "all_gather");
  return tree_collective(ctx, x, AllGatherOp<Tiled>{&g, axis}, g, "all_gather");
}

/// psum_scatter of a tree.
template <bool Tiled, class X>
auto scatter_sum_tree(Context& ctx, const X& x, const AxisNames& axes, int dimension, const Groups& groups) {
  const GroupInfo& g = Access::group(ctx, axes, groups, true, "psum_scatter");
  return tree_collective(ctx, x, ScatterSumOp<Tiled>{&g, dimension}, g, "psum_scatter");
}

/// all_to_all of a tree.
template <bool Tiled, class X>
auto all_to_all_tree(Context& ctx, X&& x, const AxisNames& axes, int split_axis, int concat_axis,
                     const Groups& groups) {
  const GroupInfo& g = Access::group(ctx, axes, groups, true, "all_to_all");
  return tree_collective(ctx, std::forward<X>(x), AllToAllOp<Tiled>{&g, split_axis, concat_axis}, g,
                         "all_to_all");
}

/// ppermute / pshuffle / pbroadcast of a tree: `op` from the permute_op of each.
template <class X>
auto permute_tree(Context& ctx, X&& x, const PermuteOp& op) {
  return tree_collective(ctx, std::forward<X>(x), op, *op.g, op.name, op.perm_hash);
}

}  // namespace pmap::detail
