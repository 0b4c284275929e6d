/// @file pending.hpp
/// @brief Nonblocking collectives (SPEC 11): pmap::Pending and the Context::*_start members.
///
/// A started collective takes its place in the device's sequence of collectives when it is
/// started: its operand is held (an rvalue tensor or tree owned, donated when it runs; an
/// lvalue referenced; an expression evaluated now), and the collective is queued on the
/// device (Context::started_). A small collective of a tensor, scalar, Eigen Core operand or
/// tree over the whole team (a ppermute: rendezvous.hpp: Posted; a psum, all_gather,
/// psum_scatter, all_to_all, and a tree's ppermute: PostedGroup) is posted at once: its input staged and its arrival published, so that it
/// travels while the device computes; its wait() completes it, reading its peers' copies. The
/// other entries of the queue run in start order, each on the engine of the blocking collective
/// (one engine: `wait()` returns what the blocking call returns, bit for bit, on every path),
/// when the device waits for one of them, calls a blocking collective or a nested pmap, posts
/// a later one, or destroys a Pending unwaited (the older ones complete first, SPEC 11's
/// "complete older ones first when it must"). Every device of a group therefore meets its
/// collectives in the same order, started or not, and a device that started different ones
/// meets its peers with another signature: E14, as for blocking ones. A kernel that throws
/// drops its queued collectives: a posted one published only a copy in the device's slot,
/// which lives as long as the team, and no peer reads the others' operands; the call is
/// cancelled as in SPEC 5.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "pmap/collectives.hpp"
#include "pmap/context.hpp"
#include "pmap/errors.hpp"
#include "pmap/eval.hpp"

namespace pmap {
namespace detail {

/// A started collective with its result type: what Pending<R> owns.
template <class R>
class StartedOf : public Started {
 public:
  std::optional<R> result;
};

/// A started collective that may be posted when it starts (P: rendezvous.hpp's Posted or
/// PostedGroup, its first half), which its run() completes.
template <class R, class P>
class PostedOf : public StartedOf<R> {
 public:
  bool arrived(const Context& ctx) const override {
    return this->posted && detail::arrived(Access::member(ctx), posted_);
  }

 protected:
  P posted_;
};

/// The collective itself: `call(ctx, held)` runs the blocking collective on the held operand.
template <class R, class Held, class Call>
class StartedWith final : public StartedOf<R> {
 public:
  StartedWith(Held held, Call call) : held_(std::move(held)), call_(std::move(call)) {}
  void run(Context& ctx) override { this->result.emplace(call_(ctx, held_.get())); }

 private:
  Held held_;
  Call call_;
};

/// An operand owned by the started collective (an rvalue, an evaluated expression, a
/// scalar): handed to the collective as an rvalue, so that tensors and trees are donated.
template <class T>
struct Owned {
  T value;
  T&& get() { return std::move(value); }
  const T& peek() const { return value; }
};
/// An lvalue operand, which must outlive the collective (SPEC 11's operand rule).
template <class T>
struct Referenced {
  const T* value;
  const T& get() const { return *value; }
  const T& peek() const { return *value; }
};

/// What a started collective keeps of operand x.
template <class X>
auto hold(X&& x) {
  using D = std::remove_cvref_t<X>;
  if constexpr (is_tensor_expr_v<D> && !is_tensor_leaf_v<D>) {
    return Owned<decltype(pmap::eval(x))>{pmap::eval(x)};  // evaluated when it starts
  } else if constexpr (is_core_dense_v<D> && !is_core_plain_v<D> && !is_core_map_v<D>) {
    return Owned<typename D::PlainObject>{x};  // a Core expression, likewise
  } else if constexpr (is_arithmetic_scalar_v<D> || !std::is_lvalue_reference_v<X>) {
    return Owned<D>{std::forward<X>(x)};
  } else {
    return Referenced<D>{&x};
  }
}

/// A started ppermute of one tensor or scalar: posted when it starts if its path allows it
/// (rendezvous.hpp: Posted: staged, point to point), so that it travels while the device
/// computes and its wait() finds it arrived; otherwise the blocking ppermute runs when it
/// must, as every other started collective does. A posted one builds its leaf (the result,
/// the operand taken over) only when it completes: until its arrival is published, a start
/// writes as little as it can, since those writes queue behind the arrival of the
/// collective started before it (a halo exchange's first ppermute), which waits for the line
/// that its destination polls.
template <class Held>
class StartedPermute final
    : public PostedOf<std::remove_cvref_t<decltype(std::declval<Context&>().ppermute(
                          std::declval<Held&>().get(), AxisNames{},
                          std::vector<std::pair<int, int>>{}))>,
                      Posted> {
  using X = std::remove_cvref_t<decltype(std::declval<Held&>().get())>;
  using T = typename Operand<X>::T;

 public:
  explicit StartedPermute(Held held) : held_(std::move(held)) {}

  /// Posts it, when it can: its operand is staged now, and taken over when it completes (an
  /// rvalue donated, as in the blocking call). Otherwise keeps what the blocking ppermute
  /// takes, for run().
  void post(Context& ctx, AxisNames&& axes, const std::vector<std::pair<int, int>>& perm) {
    const PermuteOp op = ppermute_op(ctx, axes, perm);
    if (!can_post(Access::member(ctx), *op.g, operand_bytes(held_.peek()))) {
      axes_ = std::move(axes);
      perm_ = perm;
      return;
    }
    const Operand<X> input(held_.peek());  // staged by post(): read there only
    Collective c = describe_permute<T>(op, input.shape(), input.data(), nullptr);
    add_permutation(c, op);
    this->posted_ = detail::post(Access::member(ctx), *op.g, c, true);
    op_ = op;
    this->posted = true;
  }
  void run(Context& ctx) override {
    if (!this->posted) {
      this->result.emplace(ctx.ppermute(held_.get(), axes_, perm_));
      return;
    }
    PermuteLeaf<X> leaf(ctx, held_.get(), op_, PostedBefore{});  // before the wait
    const void* from = detail::complete(Access::member(ctx), this->posted_, leaf.bytes());
    leaf.work(0, [from](int) { return from; });
    this->result.emplace(leaf.take());
  }

 private:
  Held held_;
  AxisNames axes_;
  std::vector<std::pair<int, int>> perm_;
  PermuteOp op_{};
};

/// The leaf a started collective Op of operand `Source` (what its Held gives) builds.
template <class Op, class Source, class X = std::remove_cvref_t<Source>>
struct leaf_for {
  using type = typename Op::template Leaf<X>;
};
template <class Op, class Source, class X>
  requires is_core_dense_v<X>
struct leaf_for<Op, Source, X> {
  using type = CoreLeaf<Op, X, !std::is_lvalue_reference_v<Source>>;
};

/// A started ppermute of an Eigen Core operand (SPEC 10): posted when it starts if its path
/// allows it, as one tensor's is (StartedPermute), its leaf built then (CoreLeaf: the
/// operand's storage seen as a tensor, a Map or expression evaluated, an rvalue owned; the
/// staged input is that view, so the leaf lives from the start); otherwise `call`, the
/// blocking ppermute, runs when it must. Its signature is the blocking Core ppermute's, which
/// permutes the same view.
template <class R, class Held, class Call>
class StartedCorePermute final : public PostedOf<R, Posted> {
  using Leaf = typename leaf_for<PermuteOp, decltype(std::declval<Held&>().get())>::type;

 public:
  StartedCorePermute(Held held, Call call) : held_(std::move(held)), call_(std::move(call)) {}

  void post(Context& ctx, const AxisNames& axes, const std::vector<std::pair<int, int>>& perm) {
    const PermuteOp op = ppermute_op(ctx, axes, perm);
    Member& me = Access::member(ctx);
    if (!can_post(me, *op.g, operand_bytes(held_.peek()))) return;
    leaf_.emplace(ctx, held_.get(), op);
    Collective c = leaf_->describe();
    add_permutation(c, op);
    this->posted_ = detail::post(me, *op.g, c, true);
    this->posted = true;
  }
  void run(Context& ctx) override {
    if (!this->posted) {
      this->result.emplace(call_(ctx, held_.get()));
      return;
    }
    const void* from = detail::complete(Access::member(ctx), this->posted_, leaf_->bytes());
    leaf_->leaf().work(0, [from](int) { return from; });
    this->result.emplace(leaf_->take());
  }

 private:
  Held held_;
  Call call_;
  std::optional<Leaf> leaf_;
};

/// Whether Op's started collective of a Core operand is posted (the reductions: the only
/// collectives of Core operands but ppermute).
template <class Op>
inline constexpr bool posts_core = false;
template <OpKind K>
inline constexpr bool posts_core<ReduceOp<K>> = true;

/// The members a posted collective over group `g` waits for (rendezvous.hpp: PostedGroup):
/// the team in its own order, referenced, or g's order, kept in `kept` (the device's group
/// cache is rewritten by later lookups).
inline std::span<const int> posted_members(const Team& team, const GroupInfo& g,
                                           std::vector<int>& kept) {
  std::span<const int> members = team.local_members();
  if (std::equal(g.members.begin(), g.members.end(), members.begin(), members.end()))
    return members;
  kept = g.members;
  return kept;
}

/// A started collective of one tensor, scalar or Core operand (a reduction's) over the whole
/// team (psum, pmean, pmax, pmin, all_gather, psum_scatter, all_to_all): posted when it
/// starts if it takes the staged path (rendezvous.hpp: PostedGroup), its leaf (Op::Leaf:
/// result, plan, the operand taken over) built then, so that its peers meet it while the
/// device computes and its wait() finds them arrived; otherwise `call`, the blocking
/// collective, runs when it must, as every other started collective does.
template <class R, class Held, class Op, class Call>
class StartedGroup final : public PostedOf<R, PostedGroup> {
  using X = std::remove_cvref_t<decltype(std::declval<Held&>().get())>;
  using T = typename output_leaf<X>::scalar;
  using Leaf = typename leaf_for<Op, decltype(std::declval<Held&>().get())>::type;

 public:
  StartedGroup(Held held, Call call) : held_(std::move(held)), call_(std::move(call)) {}

  /// Posts it over group `g` when it can; `make_op(g)` gives its parameters (its leaf
  /// describes it by its own name).
  template <class MakeOp>
  void post(Context& ctx, const GroupInfo& g, const MakeOp& make_op, const char* /*name*/) {
    const Member& me = Access::member(ctx);
    if (!can_post(me, g, operand_bytes(held_.peek()))) return;
    const std::span<const int> members = posted_members(*me.team, g, kept_members_);
    leaf_.emplace(ctx, held_.get(), make_op(g));
    this->posted_ = post_group(Access::member(ctx), g, leaf_->describe(), members);
    this->posted = true;
  }
  void run(Context& ctx) override {
    if (!this->posted) {
      this->result.emplace(call_(ctx, held_.get()));
      return;
    }
    complete_typed<T>(ctx, this->posted_, leaf_->bytes(),
                      [this](Peers<T>& peers) { work(peers); });
    this->result.emplace(leaf_->take());
  }

 private:
  void work(Peers<T>& peers) {
    if constexpr (requires { leaf_->work(peers); })
      leaf_->work(peers);
    else
      leaf_->work(peers.size(), [&peers](int k) { return peers.input(k); });
  }

  Held held_;
  Call call_;
  std::optional<Leaf> leaf_;
  std::vector<int> kept_members_;
};

/// The collective of a tree's leaves that a started collective Op (one operand's) is, as the
/// blocking tree collective builds it (trees.hpp): a reduction's leaves reduce as ReduceTree,
/// the data movers' are Op's own. `donates`: the blocking call hands the leaves an rvalue
/// tree (reductions, all_to_all), whose owned tensors they take over.
template <class Op>
struct tree_op {
  static Op make(const Op& op) { return op; }
  static constexpr bool donates = false;
};
template <OpKind K>
struct tree_op<ReduceOp<K>> {
  static ReduceTree<K> make(const ReduceOp<K>&) { return {}; }
  static constexpr bool donates = true;
};
template <bool Tiled>
struct tree_op<AllToAllOp<Tiled>> {
  static AllToAllOp<Tiled> make(const AllToAllOp<Tiled>& op) { return op; }
  static constexpr bool donates = true;
};
template <>
struct tree_op<PermuteOp> {
  static PermuteOp make(const PermuteOp& op) { return op; }
  static constexpr bool donates = true;
};

/// A started collective of a tree over the whole team whose leaves pack into one staged copy
/// (trees.hpp: meet_packed, at most kStagedBytes): posted when it starts, as StartedGroup
/// posts one operand, its nodes (results, the operands taken over) built then. Otherwise
/// `call`, the blocking collective, runs when it must.
template <class R, class Held, class Op, class Call>
class StartedTree final : public PostedOf<R, PostedGroup> {
  using X = std::remove_cvref_t<decltype(std::declval<Held&>().get())>;
  using TreeOp = decltype(tree_op<Op>::make(std::declval<const Op&>()));

 public:
  StartedTree(Held held, Call call) : held_(std::move(held)), call_(std::move(call)) {}

  /// Posts collective `op_name` over group `g` when it can; `make_op(g)` gives its
  /// parameters, `salt` is added to its signature (trees.hpp: tree_collective). (Not `name`:
  /// that is Started's, and -Wshadow in a user's build would say so.)
  template <class MakeOp>
  void post(Context& ctx, const GroupInfo& g, const MakeOp& make_op, const char* op_name,
            std::uint64_t salt = 0) {
    Member& me = Access::member(ctx);
    if (!can_post(me, g, tree_packed_bytes(held_.peek()))) return;
    const std::span<const int> members = posted_members(*me.team, g, kept_members_);
    const TreeOp op = tree_op<Op>::make(make_op(g));  // the leaves keep what they need of it
    if constexpr (tree_op<Op>::donates)
      tree_.emplace(ctx, held_.get(), op);
    else
      tree_.emplace(ctx, held_.peek(), op);
    int leaves = 0;
    Collective c = describe_tree(*tree_, op_name, me.team->slot(me.index), leaves, bytes_);
    c.signature ^= salt;
    alignas(64) unsigned char packed[kStagedBytes];
    pack_leaves(*tree_, packed);
    c.bytes = bytes_;
    c.in = packed;
    this->posted_ = post_group(me, g, c, members);
    this->posted = true;
  }
  void run(Context& ctx) override {
    if (!this->posted) {
      this->result.emplace(call_(ctx, held_.get()));
      return;
    }
    const auto work = [this](Peers<unsigned char>& peers) { work_packed(*tree_, peers); };
    complete_typed<unsigned char>(ctx, this->posted_, bytes_, work);
    this->result.emplace(tree_->take());
  }

 private:
  Held held_;
  Call call_;
  std::optional<TreeNode<TreeOp, X>> tree_;
  std::size_t bytes_ = 0;
  std::vector<int> kept_members_;
};

/// Queues `op`, collective `name` just started (or posted) on `ctx`, and returns its Pending.
template <class Op>
auto enqueue(Context& ctx, const char* name, std::unique_ptr<Op> op) {
  using R = std::remove_cvref_t<decltype(*op->result)>;
  op->name = name;
  Access::queue(ctx, op.get());
  return Access::pending<R>(std::move(op));
}

/// Queues collective `name` of `ctx`, `call`, on operand x and returns its Pending.
template <class X, class Call>
auto start(Context& ctx, const char* name, X&& x, Call call) {
  auto held = hold(std::forward<X>(x));
  using Held = decltype(held);
  using R = std::remove_cvref_t<decltype(call(ctx, held.get()))>;
  return enqueue(ctx, name, std::make_unique<StartedWith<R, Held, Call>>(std::move(held), std::move(call)));
}

/// Starts collective `name` of `ctx` over `axes` and `groups` on operand x: a tensor, a
/// scalar, a reduction's Core operand or a tree is posted now when its path allows it
/// (StartedGroup, StartedTree; `make_op(g)` gives the leaf's parameters over group g), a
/// data mover's Core operand queued as start() does; `call` is the blocking collective.
/// `equal_sizes`: the collective needs groups of equal size.
template <class Op, class X, class MakeOp, class Call>
auto start_group(Context& ctx, const char* name, X&& x, const AxisNames& axes,
                 const Groups& groups, bool equal_sizes, const MakeOp& make_op, Call call) {
  using D = std::remove_cvref_t<X>;
  if constexpr (is_core_dense_v<D> && !posts_core<Op>) {
    return start(ctx, name, std::forward<X>(x), std::move(call));
  } else {
    auto held = hold(std::forward<X>(x));
    using Held = decltype(held);
    using R = std::remove_cvref_t<decltype(call(ctx, held.get()))>;
    using Posting = std::conditional_t<is_operand_tree_v<D>, StartedTree<R, Held, Op, Call>,
                                       StartedGroup<R, Held, Op, Call>>;
    auto op = std::make_unique<Posting>(std::move(held), std::move(call));
    Access::make_room(ctx);
    Access::posting(ctx, [&] {
      op->post(ctx, Access::group(ctx, axes, groups, equal_sizes, name), make_op, name);
    });
    return enqueue(ctx, name, std::move(op));
  }
}

}  // namespace detail

/// @brief A collective started by a `*_start` member of Context; in flight until wait().
///
/// Example: both halos of a 1-D stencil in flight while the interior is updated.
/// <!-- example-context: kernel -->
/// @code
///   const int n = ctx.axis_size("i");
///   std::vector<std::pair<int, int>> to_left, to_right;
///   for (int d = 0; d < n; ++d) {
///     to_left.emplace_back(d, (d + n - 1) % n);
///     to_right.emplace_back(d, (d + 1) % n);
///   }
///   const Eigen::Index last = x.size() - 1;
///   auto from_right = ctx.ppermute_start(x.slice(std::array<Eigen::Index, 1>{0}, std::array<Eigen::Index, 1>{1}), "i", to_left);
///   auto from_left = ctx.ppermute_start(x.slice(std::array<Eigen::Index, 1>{last}, std::array<Eigen::Index, 1>{1}), "i", to_right);
///   Eigen::Tensor<float, 1, Eigen::RowMajor> next(x.size());
///   for (Eigen::Index k = 1; k < last; ++k) next(k) = 0.5f * x(k) + 0.25f * (x(k - 1) + x(k + 1));
///   auto left = from_left.wait();      // the halos, while the interior was computed
///   auto right = from_right.wait();
///   next(0) = 0.5f * x(0) + 0.25f * (left(0) + x(1));
///   next(last) = 0.5f * x(last) + 0.25f * (x(last - 1) + right(0));
///   return next;
/// @endcode
///
/// A Pending belongs to the device invocation that started it; a kernel cannot return one.
template <class R>
class Pending {
 public:
  Pending(Pending&& other) noexcept = default;
  /// A Pending not yet waited may not be assigned to: if it is, its collective completes
  /// first, as when it is destroyed.
  Pending& operator=(Pending&& other) noexcept {
    if (this != &other) {
      abandon();
      op_ = std::move(other.op_);
    }
    return *this;
  }
  Pending(const Pending&) = delete;
  Pending& operator=(const Pending&) = delete;
  ~Pending() { abandon(); }

  /// The result the blocking collective returns for the same arguments; once. Collectives
  /// started before this one complete first. Rethrows what the collective met (E14, a
  /// peer's failure).
  R wait() {
    if (!op_ || op_->waited)
      detail::raise_value_error("pmap: Pending::wait() called on a collective already waited for "
                                "(or moved from)");
    if (detail::tracing::recording()) [[unlikely]]
      detail::Access::traced_wait(*op_->context, op_.get());
    else if (!op_->done)
      detail::Access::complete_through(*op_->context, op_.get());
    op_->waited = true;
    if (op_->error) std::rethrow_exception(op_->error);
    return std::move(*op_->result);
  }

  /// True when wait() would return without waiting for a peer. Makes progress: a posted
  /// collective whose peers arrived completes now, and collectives that were not posted run
  /// now (they complete when their peers arrive), so a loop that polls ready() between
  /// pieces of work always ends.
  bool ready() const {
    if (op_ && !op_->done && op_->context != nullptr)
      return detail::Access::make_progress(*op_->context, op_.get());
    return op_ && op_->done;
  }

 private:
  friend struct detail::Access;
  explicit Pending(std::unique_ptr<detail::StartedOf<R>> op) : op_(std::move(op)) {}

  /// Destroyed or assigned to unwaited: completes the collective and drops the result; an
  /// error it met reaches the call's caller as a kernel exception would. During unwinding
  /// (the kernel throws) the collective is dropped instead: it never published anything.
  void abandon() noexcept {
    if (!op_) return;
    if (op_->context != nullptr)
      detail::Access::abandon(*op_->context, op_.get(), !op_->done && op_->unwinding());
    op_.reset();
  }

  std::unique_ptr<detail::StartedOf<R>> op_;
};

// ---- the *_start members (SPEC 11) ------------------------------------------------------
template <class X>
auto Context::psum_start(X&& x, AxisNames axes, const Groups& groups) {
  using Op = detail::ReduceOp<detail::OpKind::psum>;
  return detail::start_group<Op>(
      *this, "psum", std::forward<X>(x), axes, groups, false,
      [](const detail::GroupInfo& g) { return Op{&g, "psum"}; },
      [axes, groups](Context& c, auto&& v) {
        return c.psum(std::forward<decltype(v)>(v), axes, groups);
      });
}

template <class X>
auto Context::pmean_start(X&& x, AxisNames axes, const Groups& groups) {
  using Op = detail::ReduceOp<detail::OpKind::pmean>;
  return detail::start_group<Op>(
      *this, "pmean", std::forward<X>(x), axes, groups, false,
      [](const detail::GroupInfo& g) { return Op{&g, "pmean"}; },
      [axes, groups](Context& c, auto&& v) {
        return c.pmean(std::forward<decltype(v)>(v), axes, groups);
      });
}

template <class X>
auto Context::pmax_start(X&& x, AxisNames axes, const Groups& groups) {
  using Op = detail::ReduceOp<detail::OpKind::pmax>;
  return detail::start_group<Op>(
      *this, "pmax", std::forward<X>(x), axes, groups, false,
      [](const detail::GroupInfo& g) { return Op{&g, "pmax"}; },
      [axes, groups](Context& c, auto&& v) {
        return c.pmax(std::forward<decltype(v)>(v), axes, groups);
      });
}

template <class X>
auto Context::pmin_start(X&& x, AxisNames axes, const Groups& groups) {
  using Op = detail::ReduceOp<detail::OpKind::pmin>;
  return detail::start_group<Op>(
      *this, "pmin", std::forward<X>(x), axes, groups, false,
      [](const detail::GroupInfo& g) { return Op{&g, "pmin"}; },
      [axes, groups](Context& c, auto&& v) {
        return c.pmin(std::forward<decltype(v)>(v), axes, groups);
      });
}

template <class X>
auto Context::all_gather_start(X&& x, AxisNames axes, int axis, const Groups& groups) {
  return detail::start_group<detail::AllGatherOp<false>>(
      *this, "all_gather", std::forward<X>(x), axes, groups, true,
      [axis](const detail::GroupInfo& g) { return detail::AllGatherOp<false>{&g, axis}; },
      [axes, axis, groups](Context& c, auto&& v) {
        return c.all_gather(std::forward<decltype(v)>(v), axes, axis, groups);
      });
}

template <class X>
auto Context::all_gather_start(X&& x, AxisNames axes, int axis, tiled_t, const Groups& groups) {
  return detail::start_group<detail::AllGatherOp<true>>(
      *this, "all_gather", std::forward<X>(x), axes, groups, true,
      [axis](const detail::GroupInfo& g) { return detail::AllGatherOp<true>{&g, axis}; },
      [axes, axis, groups](Context& c, auto&& v) {
        return c.all_gather(std::forward<decltype(v)>(v), axes, axis, tiled, groups);
      });
}

template <class X>
auto Context::psum_scatter_start(X&& x, AxisNames axes, int scatter_dimension,
                                 const Groups& groups) {
  return detail::start_group<detail::ScatterSumOp<false>>(
      *this, "psum_scatter", std::forward<X>(x), axes, groups, true,
      [scatter_dimension](const detail::GroupInfo& g) {
        return detail::ScatterSumOp<false>{&g, scatter_dimension};
      },
      [axes, scatter_dimension, groups](Context& c, auto&& v) {
        return c.psum_scatter(std::forward<decltype(v)>(v), axes, scatter_dimension, groups);
      });
}

template <class X>
auto Context::psum_scatter_start(X&& x, AxisNames axes, int scatter_dimension, tiled_t,
                                 const Groups& groups) {
  return detail::start_group<detail::ScatterSumOp<true>>(
      *this, "psum_scatter", std::forward<X>(x), axes, groups, true,
      [scatter_dimension](const detail::GroupInfo& g) {
        return detail::ScatterSumOp<true>{&g, scatter_dimension};
      },
      [axes, scatter_dimension, groups](Context& c, auto&& v) {
        return c.psum_scatter(std::forward<decltype(v)>(v), axes, scatter_dimension, tiled,
                              groups);
      });
}

template <class X>
auto Context::all_to_all_start(X&& x, AxisNames axes, int split_axis, int concat_axis,
                               const Groups& groups) {
  return detail::start_group<detail::AllToAllOp<false>>(
      *this, "all_to_all", std::forward<X>(x), axes, groups, true,
      [split_axis, concat_axis](const detail::GroupInfo& g) {
        return detail::AllToAllOp<false>{&g, split_axis, concat_axis};
      },
      [axes, split_axis, concat_axis, groups](Context& c, auto&& v) {
        return c.all_to_all(std::forward<decltype(v)>(v), axes, split_axis, concat_axis, groups);
      });
}

template <class X>
auto Context::all_to_all_start(X&& x, AxisNames axes, int split_axis, int concat_axis, tiled_t,
                               const Groups& groups) {
  return detail::start_group<detail::AllToAllOp<true>>(
      *this, "all_to_all", std::forward<X>(x), axes, groups, true,
      [split_axis, concat_axis](const detail::GroupInfo& g) {
        return detail::AllToAllOp<true>{&g, split_axis, concat_axis};
      },
      [axes, split_axis, concat_axis, groups](Context& c, auto&& v) {
        return c.all_to_all(std::forward<decltype(v)>(v), axes, split_axis, concat_axis, tiled,
                            groups);
      });
}

template <class X>
auto Context::ppermute_start(X&& x, AxisNames axes, const std::vector<std::pair<int, int>>& perm) {
  using D = std::remove_cvref_t<X>;
  // The blocking ppermute, for a Core operand or a tree that may not be posted: not built
  // for one tensor or scalar, whose StartedPermute keeps the pairs only when it is not
  // posted (the capture copies them, an allocation per start).
  const auto blocking = [&axes, &perm] {
    return [axes, perm](Context& c, auto&& v) {
      return c.ppermute(std::forward<decltype(v)>(v), axes, perm);
    };
  };
  if constexpr (detail::is_core_dense_v<D>) {
    auto held = detail::hold(std::forward<X>(x));
    auto call = blocking();
    using Held = decltype(held);
    using R = std::remove_cvref_t<decltype(call(*this, held.get()))>;
    using Started = detail::StartedCorePermute<R, Held, decltype(call)>;
    auto op = std::make_unique<Started>(std::move(held), std::move(call));
    detail::Access::make_room(*this);
    detail::Access::posting(*this, [&] { op->post(*this, axes, perm); });
    return detail::enqueue(*this, "ppermute", std::move(op));
  } else if constexpr (detail::is_operand_tree_v<D>) {
    auto held = detail::hold(std::forward<X>(x));
    auto call = blocking();
    using Held = decltype(held);
    using R = std::remove_cvref_t<decltype(call(*this, held.get()))>;
    using Started = detail::StartedTree<R, Held, detail::PermuteOp, decltype(call)>;
    auto op = std::make_unique<Started>(std::move(held), std::move(call));
    detail::Access::make_room(*this);
    detail::Access::posting(*this, [&] {
      const detail::PermuteOp permute = detail::ppermute_op(*this, axes, perm);
      op->post(*this, *permute.g, [&permute](const detail::GroupInfo&) { return permute; },
               permute.name, permute.perm_hash);
    });
    return detail::enqueue(*this, "ppermute", std::move(op));
  } else {
    auto held = detail::hold(std::forward<X>(x));
    auto op = std::make_unique<detail::StartedPermute<decltype(held)>>(std::move(held));
    detail::Access::make_room(*this);
    detail::Access::posting(*this, [&] { op->post(*this, std::move(axes), perm); });
    return detail::enqueue(*this, "ppermute", std::move(op));
  }
}

}  // namespace pmap
