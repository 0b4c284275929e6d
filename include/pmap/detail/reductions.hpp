/// @file reductions.hpp
/// @brief The reductions (psum, pmean, pmax, pmin, pargmax, pargmin, psum_scatter) as work
/// over the engine's peers, and the hierarchical reduction of a team spanning processes.
#pragma once

#include <complex>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <type_traits>
#include <utility>

#include "pmap/context.hpp"
#include "pmap/detail/buffers.hpp"
#include "pmap/detail/distributed.hpp"
#include "pmap/detail/errors.hpp"
#include "pmap/detail/layout.hpp"
#include "pmap/detail/reduce_kernels.hpp"
#include "pmap/detail/rendezvous.hpp"

namespace pmap::detail {

template <class Acc>
constexpr mpi::DType mpi_dtype() {
  if constexpr (std::is_same_v<Acc, float>) return mpi::DType::f32;
  else if constexpr (std::is_same_v<Acc, double>) return mpi::DType::f64;
  else if constexpr (std::is_same_v<Acc, std::int32_t>) return mpi::DType::i32;
  else if constexpr (std::is_same_v<Acc, std::int64_t>) return mpi::DType::i64;
  else if constexpr (std::is_same_v<Acc, std::complex<float>>) return mpi::DType::c64;
  else if constexpr (std::is_same_v<Acc, std::complex<double>>) return mpi::DType::c128;
  else return mpi::DType::none;
}

/// A reduction's result: a scalar for scalar inputs.
template <class X, class Result>
auto finish_reduce(Result&& result) {
  if constexpr (Operand<X>::is_scalar)
    return typename std::remove_cvref_t<Result>::Scalar(result());
  else
    return std::forward<Result>(result);
}

/// The engine's path for a reduction over every device of a team that spans processes,
/// hierarchically: the local devices reduce one chunk each into the leader's result, the
/// leader runs one MPI allreduce, the others copy the leader's result. Four barriers of the
/// local devices, run by the same Meeting as every other path.
template <OpKind K, class Acc, class T>
void reduce_here_and_across(Member& me, const GroupInfo& g, const Collective& c, Acc* out) {
  Team& team = *me.team;
  team.publish(me.index, OpDescRef{c.name, c.dtype, c.shape}, g.axis_label,
               c.signature ^ g.signature, c.in, c.out);
  const auto local = team.local_members();
  const bool leader = me.index == team.local_leader();
  const int count = static_cast<int>(local.size());
  const int position = me.index - team.local_leader();
  const std::int64_t size = c.shape.size();
  auto chunk = [&](int p) { return size * p / count; };
  Meeting meeting(me, local, 4);
  meeting.run([&] {
    meeting.meet();
    meeting.check();
    Acc* const total = static_cast<Acc*>(team.slot(team.local_leader()).published_out());
    // A lone local device's input is the process's contribution as it is.
    constexpr OpKind reduced = K == OpKind::pmean ? OpKind::psum : K;
    const void* contribution = total;
    if (std::is_same_v<Acc, T> && count == 1)
      contribution = team.slot(team.local_leader()).published_in();
    else
      reduce_block<reduced, Acc, T>(
          total + chunk(position), chunk(position + 1) - chunk(position), count, [&](int k) {
            return static_cast<const T*>(
                       team.slot(local[static_cast<std::size_t>(k)]).published_in()) +
                   chunk(position);
          });
    meeting.meet();
    if (leader) {
      constexpr mpi::ReduceOp op = K == OpKind::pmax   ? mpi::ReduceOp::max
                                   : K == OpKind::pmin ? mpi::ReduceOp::min
                                                       : mpi::ReduceOp::sum;
      if (team.exchange_reduce(me.index, contribution, total, static_cast<std::size_t>(size),
                               mpi_dtype<Acc>(), op))
        reduce_block<reduced, Acc, Acc>(total, size, mpi::size(), [&](int p) {
          return reinterpret_cast<const Acc*>(team.contribution(p));
        });
      if constexpr (K == OpKind::pmean)
        MutArrayMap<Acc>(total, static_cast<Eigen::Index>(size)) /= static_cast<Acc>(g.members.size());
    }
    meeting.meet();
    if (team.cancelled()) throw Cancelled{};  // the leader may have left without reducing
    team.raise_if_exchange_failed(me.index);
    if (!leader) {
      const auto bytes = static_cast<std::size_t>(size) * sizeof(Acc);
      copy_run(out, total, bytes, streams(bytes));
    }
  });
}

template <OpKind K, class Acc, class T>
void reduce_across_processes(Context& ctx, const GroupInfo& g, const Collective& c, Acc* out) {
  Member& me = Access::member(ctx);
  traced(me, g, c, Path::gathered, [&] { reduce_here_and_across<K, Acc, T>(me, g, c, out); });
}

/// Below this many bytes per device, every member reduces everything (one pass, lowest
/// latency); above it, member p reduces chunk p and the others copy it (bandwidth scales).
/// Also when devices outnumber threads: there the split's extra phase costs a task switch
/// per waiting device, more than the n^2 work it saves at 8 KiB (18.9 vs 14.8 us per psum,
/// 4 devices on 2 threads).
inline constexpr std::int64_t kSplitReductionBytes = 64 * 1024;

/// A split reduction's work: member p reduces chunk p into its result, then, after a sync,
/// copies the other chunks from the members that reduced them. `in_place`: the result is
/// this device's own input (a donated buffer), which no peer reads in chunk p.
template <OpKind K, class Acc, class T, class P>
void split_reduce(P& peers, Acc* out, std::int64_t size, bool in_place, bool stream) {
  const int n = peers.size();
  auto chunk = [&](int p) { return size * p / n; };
  const int me = peers.position();
  reduce_block<K, Acc, T>(
      out + chunk(me), chunk(me + 1) - chunk(me), n,
      [&](int k) { return peers.input(k) + chunk(me); }, in_place);
  peers.sync();
  for (int p = 0; p < n; ++p)
    if (p != me)
      copy_run(out + chunk(p), static_cast<const Acc*>(peers.output(p)) + chunk(p),
               static_cast<std::size_t>(chunk(p + 1) - chunk(p)) * sizeof(Acc), stream);
}

/// Which collective a result is of: the team's call, the collective's first phase, the
/// group's first member (the groups of one collective are disjoint).
struct ResultKey {
  std::uint64_t team = 0;
  std::uint64_t base = 0;
  int group = -1;
  std::size_t bytes = 0;
  bool operator==(const ResultKey&) const = default;
};

/// The last reduction result the calling thread computed, if it is the result of `key`, else
/// nullptr (src/collectives.cpp: one per thread).
const void* kept_result(const ResultKey& key);
/// Keeps a copy of `bytes` of `data` as the calling thread's result of `key`.
void keep_result(const ResultKey& key, const void* data);

/// An unsplit reduction's work when devices outnumber threads: every member of a group gets
/// the same result, so of the members one thread runs, the first reduces and keeps a copy
/// and the others copy it, instead of each reading every peer's input again (at 8 KiB and 8
/// devices on 2 threads, 4 reductions of 8 inputs per thread and psum became 1 and 3 copies
/// of the result, in the thread's cache). The result is the same bits either way.
template <OpKind K, class Acc, class T, class P>
void reduce_once_per_thread(P& peers, Acc* out, std::int64_t size, const ResultKey& key) {
  if (const void* kept = kept_result(key)) {
    std::memcpy(out, kept, key.bytes);
    return;
  }
  reduce_block<K, Acc, T>(out, size, peers.size(), [&](int k) { return peers.input(k); });
  keep_result(key, out);
}

/// How reduce_peers shares out a reduction's work (reduce()).
struct ReduceWay {
  bool split = false;            ///< split_reduce
  bool once_per_thread = false;  ///< reduce_once_per_thread (else every member reduces all)
  bool in_place = false;         ///< split: the result is the device's own input
  bool stream = false;           ///< split: copy the peers' chunks with streaming stores
  ResultKey key;                 ///< once per thread: which collective
};

/// A reduction's work over its peers once they met (the body of reduce()'s rendezvous).
template <OpKind K, class Acc, class T>
void reduce_peers(Peers<T>& peers, Acc* out, std::int64_t size, const ReduceWay& way) {
  if (way.split)
    split_reduce<K, Acc, T>(peers, out, size, way.in_place, way.stream);
  else if (way.once_per_thread)
    reduce_once_per_thread<K, Acc, T>(peers, out, size, way.key);
  else
    reduce_block<K, Acc, T>(out, size, peers.size(), [&](int k) { return peers.input(k); });
}

/// The reductions the library compiles once (src/reductions.cpp), so that a program's
/// collectives of these types do not compile them again: every kind of float and double,
/// and of the 32- and 64-bit integers, whose pmean accumulates in double (SPEC 5).
#define PMAP_COMMON_REDUCTIONS(X)                                                            \
  X(OpKind::psum, float, float) X(OpKind::pmean, float, float) X(OpKind::pmax, float, float) \
  X(OpKind::pmin, float, float) X(OpKind::psum, double, double)                              \
  X(OpKind::pmean, double, double) X(OpKind::pmax, double, double)                           \
  X(OpKind::pmin, double, double) X(OpKind::psum, std::int32_t, std::int32_t)                \
  X(OpKind::pmean, double, std::int32_t) X(OpKind::pmax, std::int32_t, std::int32_t)         \
  X(OpKind::pmin, std::int32_t, std::int32_t) X(OpKind::psum, std::int64_t, std::int64_t)    \
  X(OpKind::pmean, double, std::int64_t) X(OpKind::pmax, std::int64_t, std::int64_t)         \
  X(OpKind::pmin, std::int64_t, std::int64_t)

#define PMAP_REDUCTION_INSTANCE(PREFIX, K, Acc, T)                                      \
  PREFIX template void reduce_peers<K, Acc, T>(Peers<T>&, Acc*, std::int64_t,             \
                                               const ReduceWay&);                         \
  PREFIX template void reduce_here_and_across<K, Acc, T>(Member&, const GroupInfo&,       \
                                                         const Collective&, Acc*);
#define PMAP_EXTERN_REDUCTION(K, Acc, T) PMAP_REDUCTION_INSTANCE(extern, K, Acc, T)
PMAP_COMMON_REDUCTIONS(PMAP_EXTERN_REDUCTION)
#undef PMAP_EXTERN_REDUCTION

template <OpKind K, class Acc, class X>
class ReductionLeaf;

/// The result scalar of reduction K over scalar T (bool sums to int32, integers average to
/// double).
template <OpKind K, class T>
using reduce_acc_t = std::conditional_t<K == OpKind::psum, psum_acc<T>,
                                        std::conditional_t<K == OpKind::pmean, pmean_acc<T>, T>>;

/// A reduction's parameters: its group and name ("psum"). Leaf<X> reduces an operand of
/// type X.
template <OpKind K>
struct ReduceOp {
  const GroupInfo* g;
  const char* name;
  template <class X>
  using Leaf = ReductionLeaf<K, reduce_acc_t<K, typename Operand<X>::T>, X>;
};

/// psum, pmean, pmax, pmin of one operand (an Operand's source: const X& or a donated
/// Eigen::Tensor&&) in one process: a leaf class, as the data movers of data_movement.hpp.
/// A split reduction writes the result over its input when the input owns its storage and
/// the scalar type is kept (member p writes only chunk p of its own buffer, which no peer
/// reads, then copies the peers' chunks after the next barrier): no allocation, no page
/// faults, which at hundreds of MiB cost more than the reduction itself.
template <OpKind K, class Acc, class X>
class ReductionLeaf {
  using T = typename Operand<X>::T;
  static constexpr int R = Operand<X>::rank;
  static constexpr int L = Operand<X>::layout;

 public:
  template <class Source>
  ReductionLeaf(Context& ctx, Source&& x, const ReduceOp<K>& op)
      : ctx_(ctx), op_(std::forward<Source>(x)), name_(op.name), size_(op_.shape().size()) {
    const GroupInfo& g = *op.g;
    const Team& team = *Access::member(ctx).team;
    const int n = static_cast<int>(g.members.size());
    const bool split = !team.distributed() && n > 1 && size_ * kAccBytes >= kSplitReductionBytes;
    if constexpr (std::is_same_v<Acc, T> && !Operand<X>::is_scalar) {
      if (split && op_.owns_storage()) result_ = op_.take();  // op_.data() stays valid: same buffer
    }
    if (result_.data() == nullptr) result_ = make_result<Acc, R, L>(ctx, op_.shape());
    in_place_ = static_cast<const void*>(result_.data()) == static_cast<const void*>(op_.data());
    way_ = ReduceWay{split, !split && n > 1 && size_ > 0 && team.shares_threads(), in_place_,
                     streams_into(result_),
                     ResultKey{team.serial(), Access::member(ctx).phase, g.members.front(),
                               static_cast<std::size_t>(size_) * sizeof(Acc)}};
  }
  ReductionLeaf(const ReductionLeaf&) = delete;
  ReductionLeaf& operator=(const ReductionLeaf&) = delete;

  /// The collective, built where the caller keeps it (a Collective is ~200 bytes).
  Collective describe() {
    return detail::describe<T>(name_, K, op_.shape(), {kAccBytes}, op_.data(), result_.data(),
                               way_.split ? 2 : 1);
  }
  std::size_t bytes() const { return static_cast<std::size_t>(size_) * sizeof(T); }
  void work(Peers<T>& peers) { reduce_peers<K, Acc, T>(peers, result_.data(), size_, way_); }
  auto take() {
    if (!in_place_) recycle(ctx_, op_);
    return finish_reduce<X>(std::move(result_));
  }

 private:
  static constexpr std::int64_t kAccBytes = sizeof(Acc);
  Context& ctx_;
  Operand<X> op_;
  const char* name_;
  std::int64_t size_;
  Eigen::Tensor<Acc, R, L> result_;
  bool in_place_ = false;
  ReduceWay way_;
};

/// Reduces `x` (an Operand's source: const X& or a donated Eigen::Tensor&&) over the group.
template <OpKind K, class Acc, class X, class Source>
auto reduce(Context& ctx, Source&& x, const AxisNames& axes, const Groups& groups,
            const char* name) {
  const GroupInfo& g = Access::group(ctx, axes, groups, false, name);
  using T = typename Operand<X>::T;
  if constexpr (mpi_dtype<Acc>() != mpi::DType::none) {
    const Team& team = *Access::member(ctx).team;
    const bool whole_team = g.members.size() == static_cast<std::size_t>(team.size());
    if (team.distributed() && groups.empty() && whole_team) {
      Operand<X> op(std::forward<Source>(x));
      constexpr int R = Operand<X>::rank;
      constexpr int L = Operand<X>::layout;
      constexpr std::int64_t acc_bytes = sizeof(Acc);
      auto result = make_result<Acc, R, L>(op.shape());
      reduce_across_processes<K, Acc, T>(
          ctx, g, describe<T>(name, K, op.shape(), {acc_bytes, 1}, op.data(), result.data()),
          result.data());
      return finish_reduce<X>(std::move(result));
    }
  }
  ReductionLeaf<K, Acc, X> leaf(ctx, std::forward<Source>(x), ReduceOp<K>{&g, name});
  rendezvous<T>(ctx, g, leaf.describe(), [&](Peers<T>& peers) { leaf.work(peers); });
  return leaf.take();
}

/// pargmax / pargmin: elementwise, the group position of the extreme (the first on ties).
template <bool Max, class X>
auto arg_reduce(Context& ctx, const X& x, const AxisNames& axes, const char* name) {
  Operand<X> op(x);
  using T = typename Operand<X>::T;
  const GroupInfo& g = Access::group(ctx, axes, {}, false, name);
  auto result = make_result<std::int32_t, Operand<X>::rank, Operand<X>::layout>(ctx, op.shape());
  std::int32_t* out = result.data();
  const std::int64_t size = op.shape().size();
  const OpKind kind = Max ? OpKind::pargmax : OpKind::pargmin;
  rendezvous<T>(ctx, g, describe<T>(name, kind, op.shape(), {}, op.data(), out), [&](Peers<T>& peers) {
    for (std::int64_t j = 0; j < size; ++j) {
      T best = peers.input(0)[j];
      std::int32_t at = 0;
      for (int k = 1; k < peers.size(); ++k) {
        const T v = peers.input(k)[j];
        if (Max ? v > best : v < best) {
          best = v;
          at = k;
        }
      }
      out[j] = at;
    }
  });
  if constexpr (Operand<X>::is_scalar)
    return std::int32_t(result());
  else
    return result;
}

template <bool Tiled, class X>
class ScatterSumLeaf;

template <bool Tiled>
using ScatterSumOp = AxesOp<ScatterSumLeaf, Tiled>;  // axis: the scatter dimension

/// psum_scatter: member p sums block p (of n along the scatter dimension) of every input:
/// a leaf class, as the data movers of data_movement.hpp (one operand or a tree's leaf).
template <bool Tiled, class X>
class ScatterSumLeaf : public Described {
  using T = typename Operand<X>::T;
  using Acc = psum_acc<T>;
  static constexpr int R = Operand<X>::rank;
  static constexpr int L = Operand<X>::layout;

 public:
  template <class Source>
  ScatterSumLeaf(Context& ctx, Source&& x, const ScatterSumOp<Tiled>& op)
      : ctx_(ctx), op_(std::forward<Source>(x)), position_(op.g->position) {
    const int n = static_cast<int>(op.g->members.size());
    const int a = canonical_axis(op.axis, R);
    const std::int64_t extent = op_.shape().dims[static_cast<std::size_t>(a)];
    if (Tiled ? extent % n != 0 : extent != n) raise_scatter_extent(extent, n, Tiled);
    Shape block = op_.shape();
    block.dims[static_cast<std::size_t>(a)] = extent / n;
    split_ = split_around(block, a, L);
    result_ = make_result<Acc, Tiled ? R : R - 1, L>(ctx, Tiled ? block : remove_axis(block, a));
    described_ = detail::describe<T>("psum_scatter", OpKind::psum_scatter, op_.shape(), {a, Tiled}, op_.data(),
                                     result_.data());
  }

  template <class Input>
  void work(int n, const Input& input) {
    const std::int64_t run = split_.mid * split_.inner;
    for (std::int64_t o = 0; o < split_.outer; ++o)
      reduce_block<OpKind::psum, Acc, T>(result_.data() + o * run, run, n, [&](int k) {
        return static_cast<const T*>(static_cast<const void*>(input(k))) + (o * n + position_) * run;
      });
  }
  auto take() {
    recycle(ctx_, op_);
    return std::move(result_);
  }

 private:
  Context& ctx_;
  Operand<X> op_;
  int position_;
  Split3 split_{};
  Eigen::Tensor<Acc, Tiled ? R : R - 1, L> result_;
};

template <bool Tiled, class X>
auto scatter_sum(Context& ctx, const X& x, const AxisNames& axes, int dimension, const Groups& groups) {
  const GroupInfo& g = Access::group(ctx, axes, groups, true, "psum_scatter");
  ScatterSumLeaf<Tiled, X> leaf(ctx, x, ScatterSumOp<Tiled>{&g, dimension});
  meet_one<typename Operand<X>::T>(ctx, g, leaf.describe(), leaf);
  return leaf.take();
}

}  // namespace pmap::detail
