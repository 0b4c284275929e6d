/// @file context.hpp
/// @brief pmap::Context: what a kernel knows about its device, and the collectives.
#pragma once

#include <array>
#include <exception>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <tuple>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "pmap/axes.hpp"
#include "pmap/detail/team.hpp"
#include "pmap/detail/trace_events.hpp"
#include "pmap/runtime.hpp"

namespace pmap {

template <class F, class In, class Out>
class Mapped;
template <class R>
class Pending;

namespace detail {
struct Access;
struct GroupInfo;
struct PermutationMemo;

/// A collective started by a *_start member, queued on its device until it runs
/// (pending.hpp): the part of a Pending that the device's Context sees.
class Started {
 public:
  virtual ~Started() = default;
  /// Runs the blocking collective on the held operand and keeps its result (a posted one:
  /// completes it).
  virtual void run(Context& ctx) = 0;
  /// Posted: run() would not wait (its source, or every member of its group, arrived).
  virtual bool arrived(const Context&) const { return false; }
  /// The kernel is unwinding past the Pending that owns this collective.
  bool unwinding() const { return std::uncaught_exceptions() > uncaught_at_start; }
  /// From a few blocks that the thread keeps (src/pending.cpp): a loop that starts a
  /// collective at every step allocates and frees one each time.
  static void* operator new(std::size_t size);
  static void operator delete(void* p, std::size_t size) noexcept;

  Context* context = nullptr;  ///< the device that started it; null once its kernel ended
  bool done = false;           ///< it ran (error: what it met)
  /// Posted when it started (rendezvous.hpp: Posted); run() completes it. Otherwise run()
  /// runs the whole blocking collective.
  bool posted = false;
  int polls = 0;  ///< ready() found it not arrived (Access::make_progress)
  bool waited = false;
  std::exception_ptr error;
  int uncaught_at_start = 0;
  const char* name = "";          ///< "psum", for the trace
  std::int64_t started_at = -1;  ///< on the trace's clock, while a trace records
};
/// Result scalar of psum (bool sums to int32) and of pmean (integers give double).
template <class T>
using psum_acc = std::conditional_t<std::is_same_v<T, bool>, std::int32_t, T>;
template <class T>
using pmean_acc = std::conditional_t<std::is_integral_v<T>, double, T>;

/// Whether X is a tree of collective operands (SPEC 10) rather than one operand.
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
/// A tree passed as an rvalue (X deduced from a forwarding reference): its Eigen::Tensor
/// leaves held by value or by rvalue reference are donated, leaf by leaf.
template <class X>
concept DonatedTree = is_operand_tree_v<X> && !std::is_lvalue_reference_v<X>;
}  // namespace detail

/// @brief A device's view of the call it runs in: its device, its position on every bound
/// axis, and the collectives that exchange values with the other devices.
///
/// A kernel receives it as an optional first parameter `pmap::Context&`. Every device of a
/// group must call the same collectives in the same order with the same shapes (JAX's rule);
/// a device waiting in a collective gives its worker thread back, so devices may outnumber
/// threads.
///
/// Example:
/// @code
///   auto f = pmap::pmap([](pmap::Context& ctx, auto x) { return pmap::eval(x / ctx.psum(x, "i")); },
///                       {.axis_name = "i"});
///   Eigen::Tensor<float, 2, Eigen::RowMajor> xs(pmap::device_count(), 16);
///   xs.setRandom();
///   Eigen::Tensor<float, 2, Eigen::RowMajor> ys = f(xs);   // each column divided by its sum
/// @endcode
///
/// Thread safety: a Context belongs to one device; use it only from that device's kernel.
class Context {
 public:
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  /// @brief The device this kernel runs on.
  const Device& device() const { return *device_; }
  /// @brief Position on the named axes (flattened row-major over a list); {} = innermost.
  int axis_index(AxisNames axes = {}) const;
  /// @brief Size of the named axes (product over a list); {} = innermost.
  int axis_size(AxisNames axes = {}) const;

  /// @brief Sum over the group; bool sums to int32. Same on every member.
  template <class X> auto psum(const X& x, AxisNames axes = {}, const Groups& groups = {});
  /// @brief Mean over the device's own group; integers and bools give double.
  template <class X> auto pmean(const X& x, AxisNames axes = {}, const Groups& groups = {});
  /// @brief Elementwise maximum over the group.
  template <class X> auto pmax(const X& x, AxisNames axes = {}, const Groups& groups = {});
  /// @brief Elementwise minimum over the group.
  template <class X> auto pmin(const X& x, AxisNames axes = {}, const Groups& groups = {});
  /// @brief The reductions of a donated tensor (`ctx.psum(std::move(v), "i")`), as JAX's
  /// buffer donation: a large reduction writes its result over v's storage instead of
  /// allocating (and page-faulting) a new tensor. v is left empty. Same results otherwise.
  template <class T, int R, int L>
  Eigen::Tensor<detail::psum_acc<T>, R, L> psum(Eigen::Tensor<T, R, L>&& x, AxisNames axes = {},
                                                const Groups& groups = {});
  template <class T, int R, int L>
  Eigen::Tensor<detail::pmean_acc<T>, R, L> pmean(Eigen::Tensor<T, R, L>&& x,
                                                  AxisNames axes = {}, const Groups& groups = {});
  template <class T, int R, int L>
  Eigen::Tensor<T, R, L> pmax(Eigen::Tensor<T, R, L>&& x, AxisNames axes = {},
                              const Groups& groups = {});
  template <class T, int R, int L>
  Eigen::Tensor<T, R, L> pmin(Eigen::Tensor<T, R, L>&& x, AxisNames axes = {},
                              const Groups& groups = {});
  /// @brief The data movers of a donated tensor: the result is computed as usual (peers read
  /// x in place), then x's storage is kept for this device's next result of the same type and
  /// size, so chains of large collectives stop allocating. x is left empty.
  template <class T, int R, int L>
  Eigen::Tensor<T, R, L> all_to_all(Eigen::Tensor<T, R, L>&& x, AxisNames axes, int split_axis,
                                    int concat_axis, const Groups& groups = {});
  template <class T, int R, int L>
  Eigen::Tensor<T, R, L> all_to_all(Eigen::Tensor<T, R, L>&& x, AxisNames axes, int split_axis,
                                    int concat_axis, tiled_t, const Groups& groups = {});
  template <class T, int R, int L>
  Eigen::Tensor<T, R, L> ppermute(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                  const std::vector<std::pair<int, int>>& perm);
  template <class T, int R, int L>
  Eigen::Tensor<T, R, L> pshuffle(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                  const std::vector<int>& perm);
  template <class T, int R, int L>
  Eigen::Tensor<T, R, L> pbroadcast(Eigen::Tensor<T, R, L>&& x, AxisNames axes, int source);
  /// @brief The same collectives of a tree passed as an rvalue (`ctx.pmean(std::move(grads))`,
  /// `std::make_tuple(std::move(w), std::move(b))`, `std::forward_as_tuple(std::move(w))`):
  /// every Eigen::Tensor leaf it holds by value or by rvalue reference is donated as above,
  /// its storage kept for this device's next results (the leaves are left empty). Leaves it
  /// holds by lvalue reference (`std::tie`) are read as usual. Same results otherwise.
  template <detail::DonatedTree X>
  auto psum(X&& x, AxisNames axes = {}, const Groups& groups = {});
  template <detail::DonatedTree X>
  auto pmean(X&& x, AxisNames axes = {}, const Groups& groups = {});
  template <detail::DonatedTree X>
  auto pmax(X&& x, AxisNames axes = {}, const Groups& groups = {});
  template <detail::DonatedTree X>
  auto pmin(X&& x, AxisNames axes = {}, const Groups& groups = {});
  template <detail::DonatedTree X>
  auto all_to_all(X&& x, AxisNames axes, int split_axis, int concat_axis, const Groups& groups = {});
  template <detail::DonatedTree X>
  auto all_to_all(X&& x, AxisNames axes, int split_axis, int concat_axis, tiled_t,
                  const Groups& groups = {});
  template <detail::DonatedTree X>
  auto ppermute(X&& x, AxisNames axes, const std::vector<std::pair<int, int>>& perm);
  template <detail::DonatedTree X>
  auto pshuffle(X&& x, AxisNames axes, const std::vector<int>& perm);
  template <detail::DonatedTree X>
  auto pbroadcast(X&& x, AxisNames axes, int source);
  /// @brief Elementwise axis index of the maximum (smallest index on ties), int32.
  template <class X> auto pargmax(const X& x, AxisNames axes = {});
  /// @brief Elementwise axis index of the minimum (smallest index on ties), int32.
  template <class X> auto pargmin(const X& x, AxisNames axes = {});
  /// @brief Stacks every member's x along a new axis `axis` (rank + 1).
  template <class X>
  auto all_gather(const X& x, AxisNames axes = {}, int axis = 0, const Groups& groups = {});
  /// @brief Concatenates every member's x along `axis` (same rank).
  template <class X>
  auto all_gather(const X& x, AxisNames axes, int axis, tiled_t, const Groups& groups = {});
  /// @brief Sums over the group and keeps slice p of dimension d (rank - 1); needs
  /// shape[d] == group size.
  template <class X>
  auto psum_scatter(const X& x, AxisNames axes = {}, int scatter_dimension = 0,
                    const Groups& groups = {});
  /// @brief Sums over the group and keeps chunk p of dimension d (same rank).
  template <class X>
  auto psum_scatter(const X& x, AxisNames axes, int scatter_dimension, tiled_t,
                    const Groups& groups = {});
  /// @brief Sends slice q of split_axis to member q; received slices stack at concat_axis.
  template <class X>
  auto all_to_all(const X& x, AxisNames axes, int split_axis, int concat_axis,
                  const Groups& groups = {});
  /// @brief Tiled all_to_all: split_axis is divided by the group size, concat_axis multiplied.
  template <class X>
  auto all_to_all(const X& x, AxisNames axes, int split_axis, int concat_axis, tiled_t,
                  const Groups& groups = {});
  /// @brief Sends x along (source, destination) pairs; devices nobody sends to get zeros.
  template <class X>
  auto ppermute(const X& x, AxisNames axes, const std::vector<std::pair<int, int>>& perm);
  /// @brief Device i receives the value of device perm[i].
  template <class X>
  auto pshuffle(const X& x, AxisNames axes, const std::vector<int>& perm);
  /// @brief Every device receives the value of device `source`.
  template <class X> auto pbroadcast(const X& x, AxisNames axes, int source);

  /// @brief Sends rows [o_j, o_j + send_sizes[j]) of dimension 0 to group member j (o_j the
  /// sizes before j) and returns the rows received, in member order: a pmap::Ragged
  /// {data, sizes, offsets} (ragged.hpp, SPEC 12). Members agree on the dtype and every
  /// dimension but the first.
  template <class X>
  auto ragged_all_to_all(const X& x, AxisNames axes, std::span<const Eigen::Index> send_sizes,
                         const Groups& groups = {});

  /// @brief Hands the storage of a tensor the kernel no longer needs back to this device:
  /// its next collective result of the same type and size, in this call or in the next call
  /// of the same mapped function, is written there instead of in fresh memory (which costs
  /// page faults: at 128 MiB, several times the collective itself). t is left empty.
  /// Tensors under 64 KiB are simply freed; a device keeps at most two such buffers (the
  /// oldest is freed), and the mapped function frees them when it is destroyed.
  ///
  /// Example: a loop that gathers a large tensor per step without allocating:
  /// <!-- example-context: kernel -->
  /// @code
  ///   float total = 0.f;
  ///   for (int step = 0; step < 100; ++step) {
  ///     auto full = ctx.all_gather(x, "i");   // x: this device's shard
  ///     total += pmap::eval(full.sum())();
  ///     ctx.donate(std::move(full));
  ///   }
  ///   return total;
  /// @endcode
  template <class T, int R, int L>
  void donate(Eigen::Tensor<T, R, L>&& t);

  /// @name Nonblocking collectives (SPEC 11, pending.hpp)
  /// Each starts the collective of the same name and returns a pmap::Pending<R>, R what the
  /// blocking call returns for the same arguments; `wait()` returns it. A started collective
  /// takes its place in the device's sequence of collectives when it starts. Operands: an
  /// rvalue tensor or tree belongs to the Pending (and is donated); an lvalue, map or Core
  /// object must stay alive and unmodified until wait() returns or the Pending is destroyed;
  /// an expression is evaluated at the start.
  /// @{
  template <class X> auto psum_start(X&& x, AxisNames axes = {}, const Groups& groups = {});
  template <class X> auto pmean_start(X&& x, AxisNames axes = {}, const Groups& groups = {});
  template <class X> auto pmax_start(X&& x, AxisNames axes = {}, const Groups& groups = {});
  template <class X> auto pmin_start(X&& x, AxisNames axes = {}, const Groups& groups = {});
  template <class X>
  auto all_gather_start(X&& x, AxisNames axes = {}, int axis = 0, const Groups& groups = {});
  template <class X>
  auto all_gather_start(X&& x, AxisNames axes, int axis, tiled_t, const Groups& groups = {});
  template <class X>
  auto psum_scatter_start(X&& x, AxisNames axes = {}, int scatter_dimension = 0,
                          const Groups& groups = {});
  template <class X>
  auto psum_scatter_start(X&& x, AxisNames axes, int scatter_dimension, tiled_t,
                          const Groups& groups = {});
  template <class X>
  auto all_to_all_start(X&& x, AxisNames axes, int split_axis, int concat_axis,
                        const Groups& groups = {});
  template <class X>
  auto all_to_all_start(X&& x, AxisNames axes, int split_axis, int concat_axis, tiled_t,
                        const Groups& groups = {});
  template <class X>
  auto ppermute_start(X&& x, AxisNames axes, const std::vector<std::pair<int, int>>& perm);
  /// send_sizes is copied at the start; x follows the operand rule above.
  template <class X>
  auto ragged_all_to_all_start(X&& x, AxisNames axes, std::span<const Eigen::Index> send_sizes,
                               const Groups& groups = {});
  /// @}

  ~Context();

 private:
  friend struct detail::Access;
  Context(detail::Team* team, int index, const Device* device, Runtime* runtime)
      : member_{team, index, 0}, device_(device), runtime_(runtime) {}

  /// The group of this device for a collective over `axes` with `groups`.
  const detail::GroupInfo& group(const AxisNames& axes, const Groups& groups, bool equal_sizes,
                                 const char* op);

  detail::Member member_;
  const Device* device_;
  Runtime* runtime_;
  std::unique_ptr<detail::GroupInfo> group_cache_;
  std::unique_ptr<detail::PermutationMemo> permutation_;  ///< ppermute_op()'s last pairs
  /// The collectives this device started and whose Pending is alive, in start order; those
  /// not done run in that order (Access::complete_through).
  std::vector<detail::Started*> started_;
  std::exception_ptr started_error_;  ///< met by a collective nobody waited for
  bool completing_ = false;           ///< complete_through() is running the queue
};

namespace detail {

/// A device's group for one collective: members in group order and this device's position.
struct GroupInfo {
  std::vector<int> axes;          ///< team axis ids, in the listed order
  Groups groups;                  ///< as passed
  std::vector<int> members;       ///< team indices, in group order
  int position = 0;               ///< of this device in members
  int axis_size = 1;              ///< size of the (flattened) named axis
  std::uint64_t signature = 0;    ///< axes and groups, for the agreement check
  std::string axis_label;         ///< "i", "('i', 'j')"
  /// The names that gave `axes` last time (AxisNames' characters): named the same again
  /// with no groups, the group is this one without resolving a name.
  std::string spelled;
};

/// The pairs of a device's last few ppermutes, validated, and what they gave for their
/// group (data_movement.hpp: ppermute_op): a loop passes the same pairs at every step (a
/// halo exchange two sets of them, one per direction).
struct PermutationMemo {
  struct Entry {
    std::vector<std::pair<int, int>> pairs;
    std::uint64_t group = 0;  ///< GroupInfo::signature
    int axis_size = 0;
    int from = -1;
    int to = -1;
    std::uint64_t hash = 0;
    bool valid = false;
  };
  static constexpr int kEntries = 4;
  Entry entries[kEntries];
  int next = 0;  ///< the entry a new set of pairs replaces (the oldest)
};

/// Internal access to Context for the dispatcher and the collectives.
struct Access {
  static Context make(Team* team, int index, const Device* device, Runtime* runtime) {
    return Context(team, index, device, runtime);
  }
  static Member& member(Context& c) { return c.member_; }
  static const Member& member(const Context& c) { return c.member_; }
  static Runtime* runtime(const Context& c) { return c.runtime_; }
  static std::string_view spelling(const AxisNames& axes) { return axes.chars_; }
  static PermutationMemo& permutation_memo(Context& c) {
    if (!c.permutation_) c.permutation_ = std::make_unique<PermutationMemo>();
    return *c.permutation_;
  }
  static const GroupInfo& group(Context& c, const AxisNames& axes, const Groups& groups,
                                bool equal_sizes, const char* op) {
    return c.group(axes, groups, equal_sizes, op);
  }
  /// The device's newest spare buffer that is a Tensor of exactly `size` elements (handed
  /// over), else an empty tensor.
  template <class Tensor>
  static Tensor take_spare(Context& c, std::int64_t size) {
    auto& spares = c.member_.team->slot(c.member_.index).spares;
    for (auto it = spares.rbegin(); it != spares.rend(); ++it) {
      auto* spare = dynamic_cast<SpareOf<Tensor>*>(it->get());
      if (spare == nullptr || spare->tensor.size() != size) continue;
      Tensor t = std::move(spare->tensor);
      spares.erase(std::next(it).base());
      return t;
    }
    return Tensor();
  }
  /// Keeps `t` as the device's newest spare buffer (the oldest goes beyond kMaxSpares), when
  /// it is large enough for a fresh allocation to cost more than keeping it.
  template <class U, int R, int L>
  static void keep_spare(Context& c, Eigen::Tensor<U, R, L>&& t) {
    if (static_cast<std::size_t>(t.size()) * sizeof(U) < kMinSpareBytes) return;
    auto& spares = c.member_.team->slot(c.member_.index).spares;
    if (spares.size() == kMaxSpares) spares.erase(spares.begin());
    spares.push_back(std::make_unique<SpareOf<Eigen::Tensor<U, R, L>>>(std::move(t)));
  }
  static constexpr std::size_t kMinSpareBytes = 64 * 1024;
  static constexpr std::size_t kMaxSpares = 2;

  // ---- started collectives (pending.hpp, src/pending.cpp) -----------------------------
  /// Queues `op`, just started on `c`.
  static void queue(Context& c, Started* op) {
    op->context = &c;
    op->uncaught_at_start = std::uncaught_exceptions();
    if (tracing::recording()) [[unlikely]] op->started_at = tracing::now();
    c.started_.push_back(op);
  }
  /// Pending::ready() for `op`, not done: completes it when that does not wait for a peer
  /// (every posted collective up to it arrived), runs the ones not posted before it; true if
  /// it is done.
  static bool make_progress(Context& c, Started* op);
  /// Before `c` posts a started collective (rendezvous.hpp: Posted), which takes its place in
  /// the device's sequence when it starts: the started ones that were not posted run first,
  /// and of two posted ones still in flight the older completes (Member::read_until).
  static void make_room(Context& c);
  /// Runs f(), the posting of a started collective, with the queue closed: the group lookup
  /// of the collective being posted completes nothing (make_room did what must be done).
  template <class F>
  static void posting(Context& c, F&& f) {
    struct Reopen {
      bool& completing;
      ~Reopen() { completing = false; }
    } reopen{c.completing_};
    c.completing_ = true;
    f();
  }
  /// Pending::wait() for `op` while a trace records: its wait() slice around the run.
  static void traced_wait(Context& c, Started* op);
  template <class R, class Op>
  static Pending<R> pending(std::unique_ptr<Op> op) {
    return Pending<R>(std::move(op));
  }
  /// Runs the started collectives of `c` that have not run, in start order, up to `last`
  /// (every one when null). Rethrows the first error one of them meets. Does nothing when
  /// called from inside one of them (its own collective, which is next in the sequence).
  static void complete_through(Context& c, const Started* last);
  /// The Pending of `op` is destroyed (or assigned to) unwaited: runs `op` unless the
  /// kernel is unwinding, and forgets it. An error it met fails the call.
  static void abandon(Context& c, Started* op, bool unwinding) noexcept;
  /// After the kernel returned: runs what is left and rethrows what an unwaited collective
  /// met.
  static void finish_started(Context& c) {
    if (!c.started_.empty() || c.started_error_) finish_queue(c);
  }
  static void finish_queue(Context& c);
  /// The Pendings kept beyond the kernel (stored outside it) of a device that is gone.
  static void detach_started(Context& c);
};

}  // namespace detail

inline Context::~Context() {
  if (!started_.empty()) detail::Access::detach_started(*this);
}

namespace detail {

/// The team axis ids named by `axes` (innermost for {}); NameError for unbound names.
void resolve_axes(const Team& team, const AxisNames& axes, std::vector<int>& out);

}  // namespace detail
}  // namespace pmap
