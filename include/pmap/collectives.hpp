/// @file collectives.hpp
/// @brief The collectives of pmap::Context (SPEC 2.3), all thin layers over one engine:
/// publish your buffers, meet your group (Team), read the peers' buffers in place.
#pragma once

#include <algorithm>
#include <array>
#include <complex>
#include <exception>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "pmap/context.hpp"
#include "pmap/detail/errors.hpp"
#include "pmap/detail/memory.hpp"
#include "pmap/detail/outputs.hpp"
#include "pmap/detail/tensor_traits.hpp"

namespace pmap::detail {

/// A collective's input as contiguous memory: tensors and TensorMaps in place, expressions
/// evaluated once, scalars by address. An owning tensor passed as an rvalue is moved in, and
/// its storage (like an evaluated expression's) may become the result: see owns_storage().
template <class X>
class Operand {
  using Leaf = output_leaf<std::remove_cvref_t<X>>;
  static_assert(Leaf::value,
                "pmap collectives take an Eigen tensor, TensorMap, tensor expression or "
                "arithmetic scalar");

 public:
  using T = typename Leaf::scalar;
  static constexpr int rank = Leaf::rank;
  static constexpr int layout = Leaf::layout;
  static constexpr bool is_scalar = is_arithmetic_scalar_v<std::remove_cvref_t<X>>;

  explicit Operand(const X& x) {
    if constexpr (is_scalar) {
      scalar_ = x;
      data_ = &scalar_;
    } else if constexpr (is_tensor_leaf_v<X> || is_owning_tensor<std::remove_cvref_t<X>>::value) {
      data_ = x.data();
      shape_ = shape_of_dims(x.dimensions(), rank);
    } else {
      owned_ = x;
      data_ = owned_.data();
      shape_ = shape_of_dims(owned_.dimensions(), rank);
    }
  }
  /// Takes over a donated tensor: its storage is the input and may become the result.
  explicit Operand(Eigen::Tensor<T, rank, layout>&& x) : owned_(std::move(x)) {
    data_ = owned_.data();
    shape_ = shape_of_dims(owned_.dimensions(), rank);
  }
  Operand(const Operand&) = delete;
  Operand& operator=(const Operand&) = delete;

  const T* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  /// True when the input lives in storage of its own (an evaluated expression or a donated
  /// tensor), which nobody reads once the collective returns: take() hands it over.
  bool owns_storage() const { return !is_scalar && data_ == owned_.data() && data_ != nullptr; }
  Eigen::Tensor<T, rank, layout> take() { return std::move(owned_); }

 private:
  const T* data_ = nullptr;
  Shape shape_;
  T scalar_{};
  Eigen::Tensor<T, rank, layout> owned_;
};

/// An output tensor of scalar U, rank R and layout L with the given shape.
template <class U, int R, int L>
Eigen::Tensor<U, R, L> make_result(const Shape& s) {
  Eigen::Tensor<U, R, L> result(dsizes<U, R, L>(s));
  prepare_result(result.data(), static_cast<std::size_t>(s.size()) * sizeof(U));
  return result;
}

/// make_result, in the device's spare buffer when it has the right type and size.
template <class U, int R, int L>
Eigen::Tensor<U, R, L> make_result(Context& ctx, const Shape& s) {
  auto spare = Access::take_spare<Eigen::Tensor<U, R, L>>(ctx, s.size());
  if (spare.data() == nullptr) return make_result<U, R, L>(s);
  spare.resize(dsizes<U, R, L>(s));  // same element count: keeps the storage
  return spare;
}

/// After a collective: a donated (or evaluated) input nobody reads any more becomes the
/// device's spare buffer.
template <class X>
void recycle(Context& ctx, Operand<X>& op) {
  if constexpr (!Operand<X>::is_scalar)
    if (op.owns_storage()) Access::keep_spare(ctx, op.take());
}

enum class OpKind : std::uint64_t {
  psum = 1, pmean, pmax, pmin, pargmax, pargmin, all_gather, psum_scatter, all_to_all,
  ppermute, pbroadcast
};

std::uint64_t hash_bytes(std::uint64_t h, const void* data, std::size_t size);
std::uint64_t op_signature(OpKind kind, const char* dtype, const Shape& shape,
                           std::initializer_list<std::int64_t> params);
int canonical_axis(int axis, int ndim);  // "axis {axis} is out of bounds ..." otherwise
/// ppermute: indices in range, sources and destinations unique (SPEC 5, 8.4).
void check_permutation_pairs(const std::vector<std::pair<int, int>>& perm, const GroupInfo& g);
/// pshuffle: perm is a permutation of [0, n).
void check_shuffle(const std::vector<int>& perm, const GroupInfo& g);
/// pbroadcast: source in [0, n).
void check_source(int source, const GroupInfo& g);

/// The engine: publish `in`/`out`, meet the group, run `work(peer_input, peer_output, sync)`,
/// meet again so that no peer still reads our buffers when we return. Small inputs of a
/// collective over the whole team are published as a copy instead, which needs no second
/// meeting (see kStagedBytes).
template <class T, class Work>
void rendezvous(Context& ctx, const GroupInfo& g, const char* name, OpKind kind,
                const Shape& shape, std::initializer_list<std::int64_t> params, int phases,
                const T* in, void* out, Work&& work) {
  Member& me = Access::member(ctx);
  Team& team = *me.team;
  Slot& slot = team.slot(me.index);
  slot.desc = OpDesc{name, op_signature(kind, dtype_name<T>(), shape, params), dtype_name<T>(),
                     shape, phases};
  const std::size_t len = std::min(g.axis_label.size(), sizeof(slot.axes) - 1);
  std::memcpy(slot.axes, g.axis_label.data(), len);
  slot.axes[len] = '\0';
  const std::size_t bytes = static_cast<std::size_t>(shape.size()) * sizeof(T);
  // Small inputs over the whole team: one barrier, peers read a copy (see kStagedBytes).
  // Everyone agrees on this choice when they agree on the signature (shape, dtype, group).
  const bool staged = phases == 2 && !team.distributed() && team.size() > 1 &&
                      g.members.size() == static_cast<std::size_t>(team.size()) &&
                      bytes <= kStagedBytes;
  const std::uint64_t base = me.phase;
  me.phase = base + kPhasesPerCollective;  // whichever path this takes
  if (staged) {
    // The copy and its signature (which includes the ordinal, so that a member that called
    // something else cannot match with an older copy) are per parity: a peer may already be
    // in the next staged collective while we read its copy of this one. The regular
    // signature is set too, for a member that calls a collective that is not staged.
    const std::uint64_t ordinal = me.staged++;
    const int parity = static_cast<int>(ordinal & 1);
    const std::uint64_t sig = (slot.desc.signature ^ g.signature) + (ordinal + 1) * 0x9e3779b97f4a7c15ULL;
    if (!slot.staging) slot.staging = std::make_unique<Slot::Staging>();
    if (bytes > 0) std::memcpy(slot.staging->bytes[parity], in, bytes);
    slot.staged_signature[parity].store(sig, std::memory_order_relaxed);
    slot.signature.store(sig, std::memory_order_release);
    const std::span<const int> members(g.members);
    team.arrive_and_wait(me.index, members, base + 1);
    team.check_agreement(me.index, members, base + 1, parity);
    auto peer = [&](int k) {
      return reinterpret_cast<const T*>(
          team.slot(g.members[static_cast<std::size_t>(k)]).staging->bytes[parity]);
    };
    auto no_out = [](int) -> void* { return nullptr; };
    auto no_sync = [] {};
    work(peer, no_out, no_sync);
    return;
  }
  // From here on peers read this device's buffers in place: leaving by an exception (a peer
  // failed, the members disagree) first drains the collective's barriers (Team::drain).
  slot.in = in;
  slot.out = out;
  slot.signature.store(slot.desc.signature ^ g.signature, std::memory_order_release);
  if (team.distributed()) {
    // Across processes: the local devices meet, their leader exchanges every input with the
    // other processes (one MPI call per process), then each device reads what it needs.
    const auto local = team.local_members();
    std::exception_ptr failure;
    try {
      team.arrive_and_wait(me.index, local, base + 1);
      team.check_agreement(me.index, local, base + 1);
      if (me.index == team.local_leader()) team.exchange_gather(me.index, bytes);
      team.arrive_and_wait(me.index, local, base + 2);
      if (team.cancelled()) throw Cancelled{};  // the leader may have left without exchanging
      team.raise_if_exchange_failed(me.index);
      auto peer = [&](int k) {
        return reinterpret_cast<const T*>(team.gathered() +
                                          static_cast<std::size_t>(g.members[static_cast<std::size_t>(k)]) * bytes);
      };
      auto no_out = [](int) -> void* { return nullptr; };
      auto no_sync = [] {};
      work(peer, no_out, no_sync);
      team.arrive_and_wait(me.index, local, base + 3);
    } catch (...) {
      failure = std::current_exception();  // drain outside the handler: it may suspend
    }
    if (failure) {
      team.drain(me.index, local, base + 1, base + 3);
      std::rethrow_exception(failure);
    }
    return;
  }
  const std::span<const int> members(g.members);
  std::exception_ptr failure;
  try {
    team.arrive_and_wait(me.index, members, base + 1);
    team.check_agreement(me.index, members, base + 1);
    int phase = 1;
    auto peer = [&](int k) {
      return static_cast<const T*>(team.slot(g.members[static_cast<std::size_t>(k)]).in);
    };
    auto peer_out = [&](int k) { return team.slot(g.members[static_cast<std::size_t>(k)]).out; };
    auto sync = [&] { team.arrive_and_wait(me.index, members, base + ++phase); };
    work(peer, peer_out, sync);
    while (phase < phases) sync();
  } catch (...) {
    failure = std::current_exception();  // drain outside the handler: it may suspend
  }
  if (failure) {
    team.drain(me.index, members, base + 1, base + static_cast<std::uint64_t>(phases));
    std::rethrow_exception(failure);
  }
}

// ---- elementwise reductions ----------------------------------------------------------------
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

/// A reduction over every device of a team that spans processes, hierarchically: the local
/// devices reduce one chunk each into the leader's result, the leader runs one MPI allreduce,
/// the others copy the leader's result.
template <OpKind K, class Acc, class X, class Result>
Result distributed_reduce(Context& ctx, const GroupInfo& g, const Operand<X>& op, Result result,
                          const char* name) {
  using T = typename Operand<X>::T;
  Member& me = Access::member(ctx);
  Team& team = *me.team;
  Slot& slot = team.slot(me.index);
  slot.desc = OpDesc{name, op_signature(K, dtype_name<T>(), op.shape(), {static_cast<std::int64_t>(sizeof(Acc))}),
                     dtype_name<T>(), op.shape(), 4};
  const std::size_t len = std::min(g.axis_label.size(), sizeof(slot.axes) - 1);
  std::memcpy(slot.axes, g.axis_label.data(), len);
  slot.axes[len] = '\0';
  slot.in = op.data();
  slot.out = result.data();
  slot.signature.store(slot.desc.signature ^ g.signature, std::memory_order_release);
  const std::uint64_t base = me.phase;
  me.phase = base + kPhasesPerCollective;
  const auto local = team.local_members();
  const int count = static_cast<int>(local.size());
  const int position = me.index - team.local_leader();
  const std::int64_t size = op.shape().size();
  std::exception_ptr failure;
  try {
    team.arrive_and_wait(me.index, local, base + 1);
    team.check_agreement(me.index, local, base + 1);
    Acc* const leader_out = static_cast<Acc*>(team.slot(team.local_leader()).out);
    auto chunk = [&](int p) { return size * p / count; };
    reduce_block<K == OpKind::pmean ? OpKind::psum : K, Acc, T>(
        leader_out + chunk(position), chunk(position + 1) - chunk(position), count,
        [&](int k) { return static_cast<const T*>(team.slot(local[static_cast<std::size_t>(k)]).in) + chunk(position); });
    team.arrive_and_wait(me.index, local, base + 2);
    if (me.index == team.local_leader()) {
      constexpr mpi::ReduceOp mop = K == OpKind::pmax ? mpi::ReduceOp::max
                                    : K == OpKind::pmin ? mpi::ReduceOp::min
                                                        : mpi::ReduceOp::sum;
      team.exchange_reduce(me.index, leader_out, static_cast<std::size_t>(size), mpi_dtype<Acc>(), mop);
      if constexpr (K == OpKind::pmean) {
        MutArrayMap<Acc> o(leader_out, static_cast<Eigen::Index>(size));
        o /= static_cast<Acc>(g.members.size());
      }
    }
    team.arrive_and_wait(me.index, local, base + 3);
    if (team.cancelled()) throw Cancelled{};  // the leader may have left without reducing
    team.raise_if_exchange_failed(me.index);
    if (me.index != team.local_leader()) {
      const auto bytes = static_cast<std::size_t>(size) * sizeof(Acc);
      copy_run(result.data(), leader_out, bytes, streams(bytes));
    }
    team.arrive_and_wait(me.index, local, base + 4);
  } catch (...) {
    failure = std::current_exception();  // drain outside the handler: it may suspend
  }
  if (failure) {
    team.drain(me.index, local, base + 1, base + 4);
    std::rethrow_exception(failure);
  }
  return result;
}

/// Below this many bytes per device, every member reduces everything (one pass, lowest
/// latency); above it, member p reduces chunk p and the others copy it (bandwidth scales).
/// Also when devices outnumber threads: there the split's extra phase costs a task switch
/// per waiting device, more than the n^2 work it saves at 8 KiB (18.9 vs 14.8 us per psum,
/// 4 devices on 2 threads).
inline constexpr std::int64_t kSplitReductionBytes = 64 * 1024;

/// Reduces `x` (an Operand's source: const X& or a donated Eigen::Tensor&&) over the group.
/// A split reduction writes the result over its input when the input owns its storage and
/// the scalar type is kept (member p writes only chunk p of its own buffer, which no peer
/// reads, then copies the peers' chunks after the next barrier): no allocation, no page
/// faults, which at hundreds of MiB cost more than the reduction itself.
template <OpKind K, class Acc, class X, class Source>
auto reduce(Context& ctx, Source&& x, const AxisNames& axes, const Groups& groups,
            const char* name) {
  Operand<X> op(std::forward<Source>(x));
  using T = typename Operand<X>::T;
  constexpr int R = Operand<X>::rank;
  constexpr int L = Operand<X>::layout;
  const GroupInfo& g = Access::group(ctx, axes, groups, false, name);
  const int n = static_cast<int>(g.members.size());
  const std::int64_t size = op.shape().size();
  Team& team = *Access::member(ctx).team;
  if constexpr (mpi_dtype<Acc>() != mpi::DType::none) {
    if (team.distributed() && groups.empty() && n == team.size())
      return finish_reduce<X>(distributed_reduce<K, Acc>(
          ctx, g, op, make_result<Acc, R, L>(op.shape()), name));
  }
  const bool split = !team.distributed() && n > 1 &&
                     size * static_cast<std::int64_t>(sizeof(Acc)) >= kSplitReductionBytes;
  Eigen::Tensor<Acc, R, L> result;
  if constexpr (std::is_same_v<Acc, T> && !Operand<X>::is_scalar) {
    if (split && op.owns_storage()) result = op.take();  // op.data() stays valid: same buffer
  }
  if (result.data() == nullptr) result = make_result<Acc, R, L>(ctx, op.shape());
  Acc* out = result.data();
  const bool stream = streams_into(result);
  rendezvous<T>(ctx, g, name, K, op.shape(), {static_cast<std::int64_t>(sizeof(Acc))},
                split ? 3 : 2, op.data(), out, [&](auto& peer, auto& peer_out, auto& sync) {
                  if (!split) {
                    reduce_block<K, Acc, T>(out, size, n, peer);
                    return;
                  }
                  auto chunk = [&](int p) { return size * p / n; };
                  const int me = g.position;
                  reduce_block<K, Acc, T>(
                      out + chunk(me), chunk(me + 1) - chunk(me), n,
                      [&](int k) { return peer(k) + chunk(me); },
                      static_cast<const void*>(out) == static_cast<const void*>(op.data()));
                  sync();
                  for (int p = 0; p < n; ++p)
                    if (p != me)
                      copy_run(out + chunk(p), static_cast<const Acc*>(peer_out(p)) + chunk(p),
                               static_cast<std::size_t>(chunk(p + 1) - chunk(p)) * sizeof(Acc),
                               stream);
                });
  if (static_cast<const void*>(out) != static_cast<const void*>(op.data())) recycle(ctx, op);
  return finish_reduce<X>(std::move(result));
}

template <bool Max, class X>
auto arg_reduce(Context& ctx, const X& x, const AxisNames& axes, const char* name) {
  Operand<X> op(x);
  using T = typename Operand<X>::T;
  constexpr int R = Operand<X>::rank;
  constexpr int L = Operand<X>::layout;
  const GroupInfo& g = Access::group(ctx, axes, {}, false, name);
  const int n = static_cast<int>(g.members.size());
  auto result = make_result<std::int32_t, R, L>(ctx, op.shape());
  const std::int64_t size = op.shape().size();
  std::int32_t* out = result.data();
  rendezvous<T>(ctx, g, name, Max ? OpKind::pargmax : OpKind::pargmin, op.shape(), {}, 2,
                op.data(), out, [&](auto& peer, auto&, auto&) {
                  for (std::int64_t j = 0; j < size; ++j) {
                    T best = peer(0)[j];
                    std::int32_t at = 0;
                    for (int k = 1; k < n; ++k) {
                      const T v = peer(k)[j];
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

// ---- data movement -------------------------------------------------------------------------
/// A shape seen in memory order (row-major equivalent) and split around one axis:
/// [outer, mid, inner].
struct Split3 {
  std::int64_t outer = 1, mid = 1, inner = 1;
};
inline Split3 split_around(const Shape& s, int axis, int layout) {
  Split3 r;
  for (int a = 0; a < s.rank; ++a) {
    const std::int64_t d = s.dims[static_cast<std::size_t>(a)];
    const bool before = layout == Eigen::RowMajor ? a < axis : a > axis;
    if (a == axis) r.mid = d;
    else if (before) r.outer *= d;
    else r.inner *= d;
  }
  return r;
}

/// Copies `in` ([outer, mid, inner]) into block k of `out` ([outer, n * mid, inner]).
template <class T>
void place_block(T* out, const T* in, const Split3& s, int n, int k, bool stream) {
  const std::int64_t run = s.mid * s.inner;
  for (std::int64_t o = 0; o < s.outer; ++o)
    copy_run(out + (o * n + k) * run, in + o * run, static_cast<std::size_t>(run) * sizeof(T),
             stream);
}

/// A box inside an array: extents and element strides per dimension, in memory order (the
/// outermost first).
struct Box {
  int rank = 0;
  std::array<std::int64_t, kMaxRank> extent{}, src_stride{}, dst_stride{};
};

/// Element strides of an array of shape `s`, by logical dimension.
inline std::array<std::int64_t, kMaxRank> strides_of(const Shape& s, int layout) {
  std::array<std::int64_t, kMaxRank> st{};
  std::int64_t step = 1;
  for (int i = 0; i < s.rank; ++i) {
    const int d = layout == Eigen::RowMajor ? s.rank - 1 - i : i;  // innermost first
    st[static_cast<std::size_t>(d)] = step;
    step *= s.dims[static_cast<std::size_t>(d)];
  }
  return st;
}

/// Copies a box of extents b.extent from src (strides b.src_stride) to dst (b.dst_stride):
/// dimensions contiguous in both arrays are merged first, so that a box made of whole rows
/// is a few large memcpy calls (streamed with `stream`, see streams()).
template <class T>
void copy_box(T* dst, const T* src, Box b, bool stream) {
  // Drop unit dimensions, then merge each dimension into the next inner one when both
  // arrays lay them out back to back.
  Box m;
  for (int i = 0; i < b.rank; ++i) {
    const auto u = static_cast<std::size_t>(i);
    if (b.extent[u] == 1) continue;
    if (b.extent[u] == 0) return;
    m.extent[static_cast<std::size_t>(m.rank)] = b.extent[u];
    m.src_stride[static_cast<std::size_t>(m.rank)] = b.src_stride[u];
    m.dst_stride[static_cast<std::size_t>(m.rank)] = b.dst_stride[u];
    ++m.rank;
  }
  int r = 0;  // merged dims, written in place
  for (int i = 0; i < m.rank; ++i) {
    const auto u = static_cast<std::size_t>(i);
    if (r > 0) {
      const auto prev = static_cast<std::size_t>(r - 1);
      if (m.src_stride[prev] == m.extent[u] * m.src_stride[u] &&
          m.dst_stride[prev] == m.extent[u] * m.dst_stride[u]) {
        m.extent[prev] *= m.extent[u];
        m.src_stride[prev] = m.src_stride[u];
        m.dst_stride[prev] = m.dst_stride[u];
        continue;
      }
    }
    m.extent[static_cast<std::size_t>(r)] = m.extent[u];
    m.src_stride[static_cast<std::size_t>(r)] = m.src_stride[u];
    m.dst_stride[static_cast<std::size_t>(r)] = m.dst_stride[u];
    ++r;
  }
  m.rank = r;
  if (m.rank == 0) {
    *dst = *src;
    return;
  }
  const auto inner = static_cast<std::size_t>(m.rank - 1);
  const std::int64_t run = m.extent[inner];
  const bool contiguous = m.src_stride[inner] == 1 && m.dst_stride[inner] == 1;
  std::array<std::int64_t, kMaxRank> index{};
  for (;;) {
    std::int64_t so = 0, dof = 0;
    for (std::size_t d = 0; d < inner; ++d) {
      so += index[d] * m.src_stride[d];
      dof += index[d] * m.dst_stride[d];
    }
    if (contiguous) {
      copy_run(dst + dof, src + so, static_cast<std::size_t>(run) * sizeof(T), stream);
    } else {
      for (std::int64_t j = 0; j < run; ++j)
        dst[dof + j * m.dst_stride[inner]] = src[so + j * m.src_stride[inner]];
    }
    int d = static_cast<int>(inner) - 1;
    for (; d >= 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      if (++index[u] < m.extent[u]) break;
      index[u] = 0;
    }
    if (d < 0) return;
  }
}

template <class T>
void copy_or_zero(T* out, const T* in, std::int64_t size) {
  const auto bytes = static_cast<std::size_t>(size) * sizeof(T);
  if (in)
    copy_run(out, in, bytes, streams(bytes));
  else
    std::fill(out, out + size, T{});
}

}  // namespace pmap::detail

namespace pmap {

template <class X>
auto Context::psum(const X& x, AxisNames axes, const Groups& groups) {
  using Acc = detail::psum_acc<typename detail::Operand<X>::T>;
  return detail::reduce<detail::OpKind::psum, Acc, X>(*this, x, axes, groups, "psum");
}

template <class T, int R, int L>
Eigen::Tensor<detail::psum_acc<T>, R, L> Context::psum(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                                       const Groups& groups) {
  using X = Eigen::Tensor<T, R, L>;
  return detail::reduce<detail::OpKind::psum, detail::psum_acc<T>, X>(*this, std::move(x), axes,
                                                                      groups, "psum");
}

template <class X>
auto Context::pmean(const X& x, AxisNames axes, const Groups& groups) {
  using Acc = detail::pmean_acc<typename detail::Operand<X>::T>;
  return detail::reduce<detail::OpKind::pmean, Acc, X>(*this, x, axes, groups, "pmean");
}

template <class T, int R, int L>
Eigen::Tensor<detail::pmean_acc<T>, R, L> Context::pmean(Eigen::Tensor<T, R, L>&& x,
                                                         AxisNames axes, const Groups& groups) {
  using X = Eigen::Tensor<T, R, L>;
  return detail::reduce<detail::OpKind::pmean, detail::pmean_acc<T>, X>(*this, std::move(x), axes,
                                                                        groups, "pmean");
}

template <class X>
auto Context::pmax(const X& x, AxisNames axes, const Groups& groups) {
  using T = typename detail::Operand<X>::T;
  return detail::reduce<detail::OpKind::pmax, T, X>(*this, x, axes, groups, "pmax");
}

template <class T, int R, int L>
Eigen::Tensor<T, R, L> Context::pmax(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                     const Groups& groups) {
  using X = Eigen::Tensor<T, R, L>;
  return detail::reduce<detail::OpKind::pmax, T, X>(*this, std::move(x), axes, groups, "pmax");
}

template <class X>
auto Context::pmin(const X& x, AxisNames axes, const Groups& groups) {
  using T = typename detail::Operand<X>::T;
  return detail::reduce<detail::OpKind::pmin, T, X>(*this, x, axes, groups, "pmin");
}

template <class T, int R, int L>
Eigen::Tensor<T, R, L> Context::pmin(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                     const Groups& groups) {
  using X = Eigen::Tensor<T, R, L>;
  return detail::reduce<detail::OpKind::pmin, T, X>(*this, std::move(x), axes, groups, "pmin");
}

template <class T, int R, int L>
void Context::donate(Eigen::Tensor<T, R, L>&& t) {
  Eigen::Tensor<T, R, L> owned(std::move(t));  // t is left empty either way
  detail::Access::keep_spare(*this, std::move(owned));
}

template <class X>
auto Context::pargmax(const X& x, AxisNames axes) {
  return detail::arg_reduce<true>(*this, x, axes, "pargmax");
}

template <class X>
auto Context::pargmin(const X& x, AxisNames axes) {
  return detail::arg_reduce<false>(*this, x, axes, "pargmin");
}

template <class X>
auto Context::all_gather(const X& x, AxisNames axes, int axis, const Groups& groups) {
  detail::Operand<X> op(x);
  using T = typename detail::Operand<X>::T;
  constexpr int R = detail::Operand<X>::rank;
  constexpr int L = detail::Operand<X>::is_scalar ? Eigen::RowMajor : detail::Operand<X>::layout;
  const detail::GroupInfo& g = detail::Access::group(*this, axes, groups, true, "all_gather");
  const int n = static_cast<int>(g.members.size());
  const int a = detail::canonical_axis(axis, R + 1);
  auto result = detail::make_result<T, R + 1, L>(*this, detail::insert_axis(op.shape(), a, n));
  // A new axis of extent 1 at `a`, then concatenated: block k is member k's input.
  const detail::Split3 s = detail::split_around(detail::insert_axis(op.shape(), a, 1), a, L);
  T* out = result.data();
  const bool stream = detail::streams_into(result);
  detail::rendezvous<T>(*this, g, "all_gather", detail::OpKind::all_gather, op.shape(), {a, 0}, 2,
                        op.data(), out, [&](auto& peer, auto&, auto&) {
                          for (int k = 0; k < n; ++k)
                            detail::place_block(out, peer(k), s, n, k, stream);
                        });
  return result;
}

template <class X>
auto Context::all_gather(const X& x, AxisNames axes, int axis, tiled_t, const Groups& groups) {
  detail::Operand<X> op(x);
  using T = typename detail::Operand<X>::T;
  constexpr int R = detail::Operand<X>::rank;
  constexpr int L = detail::Operand<X>::layout;
  const detail::GroupInfo& g = detail::Access::group(*this, axes, groups, true, "all_gather");
  const int n = static_cast<int>(g.members.size());
  const int a = detail::canonical_axis(axis, R);
  detail::Shape out_shape = op.shape();
  out_shape.dims[static_cast<std::size_t>(a)] *= n;
  auto result = detail::make_result<T, R, L>(*this, out_shape);
  const detail::Split3 s = detail::split_around(op.shape(), a, L);
  T* out = result.data();
  const bool stream = detail::streams_into(result);
  detail::rendezvous<T>(*this, g, "all_gather", detail::OpKind::all_gather, op.shape(), {a, 1}, 2,
                        op.data(), out, [&](auto& peer, auto&, auto&) {
                          for (int k = 0; k < n; ++k)
                            detail::place_block(out, peer(k), s, n, k, stream);
                        });
  return result;
}

namespace detail {

/// psum_scatter: member p sums block p (of n along the scatter dimension) of every input.
template <bool Tiled, class X>
auto scatter_sum(Context& ctx, const X& x, const AxisNames& axes, int dimension,
                 const Groups& groups) {
  Operand<X> op(x);
  using T = typename Operand<X>::T;
  using Acc = std::conditional_t<std::is_same_v<T, bool>, std::int32_t, T>;
  constexpr int R = Operand<X>::rank;
  constexpr int L = Operand<X>::layout;
  const GroupInfo& g = Access::group(ctx, axes, groups, true, "psum_scatter");
  const int n = static_cast<int>(g.members.size());
  const int a = canonical_axis(dimension, R);
  const std::int64_t extent = op.shape().dims[static_cast<std::size_t>(a)];
  if (!Tiled && extent != n)
    raise_value_error("reduce_scatter operand scatter dimension size " + std::to_string(extent) +
                      " must match shard count " + std::to_string(n));
  if (Tiled && extent % n != 0)
    raise_value_error("tiled reduce_scatter operand scatter dimension size " +
                      std::to_string(extent) + " must be divisible by shard_count " +
                      std::to_string(n));
  Shape block = op.shape();
  block.dims[static_cast<std::size_t>(a)] = extent / n;
  const Split3 s = split_around(block, a, L);
  constexpr int RO = Tiled ? R : R - 1;
  auto result = make_result<Acc, RO, L>(ctx, Tiled ? block : remove_axis(block, a));
  Acc* out = result.data();
  const int p = g.position;
  const std::int64_t run = s.mid * s.inner;
  rendezvous<T>(ctx, g, "psum_scatter", OpKind::psum_scatter, op.shape(), {a, Tiled}, 2,
                op.data(), out, [&](auto& peer, auto&, auto&) {
                  for (std::int64_t o = 0; o < s.outer; ++o)
                    reduce_block<OpKind::psum, Acc, T>(
                        out + o * run, run, n, [&](int k) { return peer(k) + (o * n + p) * run; });
                });
  return result;
}

/// all_to_all: member p receives block p (along split_axis) of every member's input and
/// places member k's block at position k along concat_axis.
template <bool Tiled, class X, class Source>
auto exchange(Context& ctx, Source&& x, const AxisNames& axes, int split_axis, int concat_axis,
              const Groups& groups) {
  Operand<X> op(std::forward<Source>(x));
  using T = typename Operand<X>::T;
  constexpr int R = Operand<X>::rank;
  constexpr int L = Operand<X>::layout;
  const GroupInfo& g = Access::group(ctx, axes, groups, true, "all_to_all");
  const int n = static_cast<int>(g.members.size());
  const int sa = canonical_axis(split_axis, R);
  const int ca = canonical_axis(concat_axis, R);
  const Shape in = op.shape();
  const std::int64_t extent = in.dims[static_cast<std::size_t>(sa)];
  if (!Tiled && extent != n)
    raise_value_error("all_to_all requires the size of the mapped axis " + g.axis_label +
                      " to equal x.shape[split_axis], but they are " + std::to_string(n) +
                      " and " + std::to_string(extent) + " respectively.");
  if (Tiled && extent % n != 0)
    raise_value_error("The size of all_to_all split_axis (" + std::to_string(extent) +
                      ") has to be divisible by the size of the named axis " + g.axis_label +
                      " (" + std::to_string(n) + ")");
  // Tiled: block = input with split extent / n, out = block with concat extent * n.
  // Untiled: the split axis (extent n) is removed and a new axis n inserted at concat_axis;
  // seen as blocks of extent 1 that is the same copy with reshaped indices.
  Shape block = in;
  block.dims[static_cast<std::size_t>(sa)] = extent / n;
  Shape out_shape;
  if constexpr (Tiled) {
    out_shape = block;
    out_shape.dims[static_cast<std::size_t>(ca)] *= n;
  } else {
    out_shape = insert_axis(remove_axis(in, sa), ca, n);
  }
  auto result = make_result<T, R, L>(ctx, out_shape);
  T* out = result.data();
  const int p = g.position;
  // Block p of every input (along split_axis) goes to place k (along concat_axis). Untiled,
  // the blocks have extent 1 there: dropping that unit dimension from both sides leaves the
  // same dimensions in the same order, so both forms are one box copy per member.
  const auto in_strides = strides_of(in, L);
  const auto out_strides = strides_of(out_shape, L);
  Box box;
  std::int64_t src_offset = 0, dst_step = 0;
  auto memory_order = [&](int i, int rank) { return L == Eigen::RowMajor ? i : rank - 1 - i; };
  if constexpr (Tiled) {
    box.rank = R;
    for (int i = 0; i < R; ++i) {
      const auto d = static_cast<std::size_t>(memory_order(i, R));
      box.extent[static_cast<std::size_t>(i)] = block.dims[d];
      box.src_stride[static_cast<std::size_t>(i)] = in_strides[d];
      box.dst_stride[static_cast<std::size_t>(i)] = out_strides[d];
    }
    src_offset = p * block.dims[static_cast<std::size_t>(sa)] * in_strides[static_cast<std::size_t>(sa)];
    dst_step = block.dims[static_cast<std::size_t>(ca)] * out_strides[static_cast<std::size_t>(ca)];
  } else {
    // The remaining dimensions of `in` (without sa) and of `out` (without ca) match one to one.
    std::array<std::int64_t, kMaxRank> src_st{}, dst_st{}, ext{};
    for (int d = 0, j = 0; d < R; ++d)
      if (d != sa) {
        ext[static_cast<std::size_t>(j)] = in.dims[static_cast<std::size_t>(d)];
        src_st[static_cast<std::size_t>(j++)] = in_strides[static_cast<std::size_t>(d)];
      }
    for (int d = 0, j = 0; d < R; ++d)
      if (d != ca) dst_st[static_cast<std::size_t>(j++)] = out_strides[static_cast<std::size_t>(d)];
    box.rank = R - 1;
    for (int i = 0; i < R - 1; ++i) {
      const auto d = static_cast<std::size_t>(memory_order(i, R - 1));
      box.extent[static_cast<std::size_t>(i)] = ext[d];
      box.src_stride[static_cast<std::size_t>(i)] = src_st[d];
      box.dst_stride[static_cast<std::size_t>(i)] = dst_st[d];
    }
    src_offset = p * in_strides[static_cast<std::size_t>(sa)];
    dst_step = out_strides[static_cast<std::size_t>(ca)];
  }
  const bool stream = streams_into(result);
  rendezvous<T>(ctx, g, "all_to_all", OpKind::all_to_all, in, {sa, ca, Tiled}, 2, op.data(), out,
                [&](auto& peer, auto&, auto&) {
                  for (int k = 0; k < n; ++k)
                    copy_box(out + k * dst_step, peer(k) + src_offset, box, stream);
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
  constexpr int R = Operand<X>::rank;
  constexpr int L = Operand<X>::layout;
  auto result = make_result<T, R, L>(ctx, op.shape());
  T* out = result.data();
  const int from = source(g.position);
  GroupInfo signed_group = g;
  signed_group.signature ^= perm_hash;
  rendezvous<T>(ctx, signed_group, name, kind, op.shape(), params, 2, op.data(), out,
                [&](auto& peer, auto&, auto&) {
                  copy_or_zero(out, from >= 0 ? peer(from) : nullptr, op.shape().size());
                });
  recycle(ctx, op);
  if constexpr (Operand<X>::is_scalar)
    return T(result());
  else
    return result;
}

}  // namespace detail

template <class X>
auto Context::psum_scatter(const X& x, AxisNames axes, int scatter_dimension,
                           const Groups& groups) {
  return detail::scatter_sum<false>(*this, x, axes, scatter_dimension, groups);
}

template <class X>
auto Context::psum_scatter(const X& x, AxisNames axes, int scatter_dimension, tiled_t,
                           const Groups& groups) {
  return detail::scatter_sum<true>(*this, x, axes, scatter_dimension, groups);
}

template <class X>
auto Context::all_to_all(const X& x, AxisNames axes, int split_axis, int concat_axis,
                         const Groups& groups) {
  return detail::exchange<false, X>(*this, x, axes, split_axis, concat_axis, groups);
}

template <class X>
auto Context::all_to_all(const X& x, AxisNames axes, int split_axis, int concat_axis, tiled_t,
                         const Groups& groups) {
  return detail::exchange<true, X>(*this, x, axes, split_axis, concat_axis, groups);
}

template <class T, int R, int L>
Eigen::Tensor<T, R, L> Context::all_to_all(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                           int split_axis, int concat_axis, const Groups& groups) {
  return detail::exchange<false, Eigen::Tensor<T, R, L>>(*this, std::move(x), axes, split_axis,
                                                         concat_axis, groups);
}

template <class T, int R, int L>
Eigen::Tensor<T, R, L> Context::all_to_all(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                           int split_axis, int concat_axis, tiled_t,
                                           const Groups& groups) {
  return detail::exchange<true, Eigen::Tensor<T, R, L>>(*this, std::move(x), axes, split_axis,
                                                        concat_axis, groups);
}

namespace detail {

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

}  // namespace detail

template <class X>
auto Context::ppermute(const X& x, AxisNames axes, const std::vector<std::pair<int, int>>& perm) {
  return detail::ppermute<X>(*this, x, axes, perm);
}

template <class T, int R, int L>
Eigen::Tensor<T, R, L> Context::ppermute(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                         const std::vector<std::pair<int, int>>& perm) {
  return detail::ppermute<Eigen::Tensor<T, R, L>>(*this, std::move(x), axes, perm);
}

template <class X>
auto Context::pshuffle(const X& x, AxisNames axes, const std::vector<int>& perm) {
  return detail::pshuffle<X>(*this, x, axes, perm);
}

template <class T, int R, int L>
Eigen::Tensor<T, R, L> Context::pshuffle(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                         const std::vector<int>& perm) {
  return detail::pshuffle<Eigen::Tensor<T, R, L>>(*this, std::move(x), axes, perm);
}

template <class X>
auto Context::pbroadcast(const X& x, AxisNames axes, int source) {
  return detail::pbroadcast<X>(*this, x, axes, source);
}

template <class T, int R, int L>
Eigen::Tensor<T, R, L> Context::pbroadcast(Eigen::Tensor<T, R, L>&& x, AxisNames axes,
                                           int source) {
  return detail::pbroadcast<Eigen::Tensor<T, R, L>>(*this, std::move(x), axes, source);
}

}  // namespace pmap
