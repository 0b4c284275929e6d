/// @file outputs.hpp
/// @brief Where results are assembled: out_axes resolution, the kernel result's outputs and
/// their sinks (sinks.hpp), and the pass that finishes them (SPEC 2.2, 3.2).
#pragma once

#include <array>
#include <atomic>
#include <cstring>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "pmap/axes.hpp"
#include "pmap/detail/blocks.hpp"
#include "pmap/detail/pool.hpp"
#include "pmap/detail/sinks.hpp"
#include "pmap/detail/errors.hpp"
#include "pmap/detail/memory.hpp"
#include "pmap/detail/tensor_traits.hpp"
#include "pmap/runtime.hpp"

namespace pmap {
template <class R>
class Pending;
}  // namespace pmap

namespace pmap::detail {

// ---- out_axes resolution ---------------------------------------------------------------------
template <class Spec, std::size_t K>
struct out_spec;
template <std::size_t K>
struct out_spec<OutAxes<>, K> {
  using type = int;
  static int get(const OutAxes<>&) { return 0; }
};
template <class A, std::size_t K>
struct out_spec<OutAxes<A>, K> {
  using type = A;
  static A get(const OutAxes<A>& s) { return std::get<0>(s.entries); }
};
template <class A0, class A1, class... A, std::size_t K>
struct out_spec<OutAxes<A0, A1, A...>, K> {
  using type = std::tuple_element_t<K, std::tuple<A0, A1, A...>>;
  static type get(const OutAxes<A0, A1, A...>& s) { return std::get<K>(s.entries); }
};

// ---- kernel results -----------------------------------------------------------------------
/// How a kernel's return type splits into outputs.
template <class R>
struct result_kind {
  static constexpr bool is_void = std::is_void_v<R>;
  static constexpr bool is_tuple = false;
  static constexpr bool is_vector = false;
  static constexpr std::size_t count = is_void ? 0 : 1;
};
template <class... O>
struct result_kind<std::tuple<O...>> {
  static constexpr bool is_void = false, is_tuple = true, is_vector = false;
  static constexpr std::size_t count = sizeof...(O);
};
template <class O, class A>
struct result_kind<std::vector<O, A>> {
  static constexpr bool is_void = false, is_tuple = false, is_vector = true;
  static constexpr std::size_t count = 1;  // one spec entry applies to every element
};

template <class Spec, class R>
inline constexpr bool out_axes_count_ok = false;
template <class... A, class R>
inline constexpr bool out_axes_count_ok<OutAxes<A...>, R> =
    sizeof...(A) == 0 || sizeof...(A) == 1 ||
    (!result_kind<R>::is_vector && sizeof...(A) == result_kind<R>::count);

template <class O>
inline constexpr bool valid_output_v = output_leaf<std::remove_cvref_t<O>>::value;

template <class O>
inline constexpr bool is_pending_v = false;
template <class R>
inline constexpr bool is_pending_v<Pending<R>> = true;

template <class O>
constexpr bool check_output() {
  static_assert(!is_pending_v<O>,
                "pmap: a kernel cannot return a pmap::Pending (a collective in flight belongs to "
                "the device invocation that started it): return its wait() instead");
  static_assert(valid_output_v<O>,
                "pmap: a kernel output must be an Eigen tensor, TensorMap, tensor expression, "
                "Eigen::Matrix / Eigen::Array (or a Map of one) or arithmetic scalar (or a "
                "std::tuple / std::vector of them)");
  static_assert(!is_core_dense_v<O> || is_core_plain_v<O> || is_core_map_v<O>,
                "pmap: the kernel returns an Eigen Core expression, which holds its operands by "
                "reference and would dangle once the kernel returns. Return expr.eval() (an "
                "Eigen::Matrix / Eigen::Array) instead.");
  static_assert(!is_dangling_expr_v<O>,
                "pmap: the kernel returns an Eigen expression that holds an owning Eigen::Tensor "
                "by reference (a kernel-local tensor or a collective's result), which dies when "
                "the kernel returns. Return pmap::eval(expr) instead, or wrap a long-lived tensor "
                "in an Eigen::TensorMap.");
  return true;
}

/// shard_map's out_specs, resolved: one Partition for every output, or one per output.
struct ShardOutSpecs {
  std::vector<Partition> parts;
};
template <std::size_t K>
struct out_spec<ShardOutSpecs, K> {
  using type = Partition;
  static const Partition& get(const ShardOutSpecs& s) { return s.parts.size() == 1 ? s.parts[0] : s.parts[K]; }
};

// ---- all outputs of one call ------------------------------------------------------------
/// The sinks of a kernel result type R: nothing (void), one, a tuple, or a vector.
template <class R, class Out>
class OutputSet {
  using O = std::remove_cvref_t<R>;
  using Spec = out_spec<Out, 0>;
  static_assert(check_output<O>());

 public:
  using Result = typename Sink<O, typename Spec::type>::Result;
  OutputSet(const CallInfo& call, const Out& out) : sink_(call, Spec::get(out), 0) {}
  /// A kernel's result arrives as an rvalue: a sink that keeps device values (shard_map's
  /// blocks) moves an owning tensor instead of copying it.
  template <class V>
  void write(int i, V&& value) { sink_.write(i, std::forward<V>(value)); }
  template <class Target>
  void bind(Target& target) { sink_.bind(target); }
  template <class Fn>
  void each(Fn&& fn) { fn(sink_); }
  Result take() { return sink_.take(); }

 private:
  Sink<O, typename Spec::type> sink_;
};

template <class Out>
class OutputSet<void, Out> {
 public:
  OutputSet(const CallInfo&, const Out&) {}
  template <class Fn>
  void each(Fn&&) {}
  void take() {}
};

template <class... Os, class Out>
class OutputSet<std::tuple<Os...>, Out> {
  static_assert((check_output<std::remove_cvref_t<Os>>() && ...));
  template <std::size_t... K>
  static auto make(const CallInfo& call, const Out& out, std::index_sequence<K...>) {
    return std::tuple<Sink<std::remove_cvref_t<Os>, typename out_spec<Out, K>::type>...>(
        Sink<std::remove_cvref_t<Os>, typename out_spec<Out, K>::type>(
            call, out_spec<Out, K>::get(out), static_cast<int>(K))...);
  }
  using Sinks = decltype(make(std::declval<const CallInfo&>(), std::declval<const Out&>(),
                              std::index_sequence_for<Os...>{}));

 public:
  OutputSet(const CallInfo& call, const Out& out)
      : sinks_(make(call, out, std::index_sequence_for<Os...>{})) {}
  template <class V>
  void write(int i, V&& values) {
    std::apply(
        [&](auto&... sink) {
          std::apply([&](auto&&... v) { (sink.write(i, std::forward<decltype(v)>(v)), ...); },
                     std::forward<V>(values));
        },
        sinks_);
  }
  template <class... Targets>
  void bind(std::tuple<Targets...>& targets) {
    static_assert(sizeof...(Targets) == sizeof...(Os),
                  "pmap into: pass one output per kernel output (std::tie(a, b, ...))");
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (std::get<K>(sinks_).bind(std::get<K>(targets)), ...);
    }(std::index_sequence_for<Os...>{});
  }
  template <class Fn>
  void each(Fn&& fn) { std::apply([&](auto&... sink) { (fn(sink), ...); }, sinks_); }
  auto take() { return std::apply([](auto&... sink) { return std::make_tuple(sink.take()...); }, sinks_); }

 private:
  Sinks sinks_;
};

template <class O, class A, class Out>
class OutputSet<std::vector<O, A>, Out> {
  using Spec = out_spec<Out, 0>;
  using S = Sink<std::remove_cvref_t<O>, typename Spec::type>;
  static_assert(check_output<std::remove_cvref_t<O>>());

 public:
  OutputSet(const CallInfo& call, const Out& out) : call_(call), spec_(Spec::get(out)) {
    S probe(call, spec_, 0);  // out_axes range check before any kernel runs
  }
  template <class V>
  void write(int i, V&& values) {
    if (Once::Owner owner = once_.claim()) {
      for (std::size_t k = 0; k < values.size(); ++k) sinks_.emplace_back(call_, spec_, static_cast<int>(k));
      owner_ = i;
      owner.publish();
    }
    if (values.size() != sinks_.size())
      raise_output_count_differs(call_.id(i), values.size(), call_.id(owner_), sinks_.size());
    for (std::size_t k = 0; k < values.size(); ++k) {
      if constexpr (std::is_lvalue_reference_v<V>)
        sinks_[k].write(i, values[k]);
      else
        sinks_[k].write(i, std::move(values[k]));
    }
  }
  template <class Fn>
  void each(Fn&& fn) {
    for (auto& sink : sinks_) fn(sink);
  }
  std::vector<typename S::Result> take() {
    std::vector<typename S::Result> out;
    out.reserve(sinks_.size());
    for (auto& sink : sinks_) out.push_back(sink.take());
    return out;
  }

 private:
  const CallInfo& call_;
  typename Spec::type spec_;
  Once once_;
  std::vector<S> sinks_;
  int owner_ = 0;
};

/// Outputs of fewer bytes over all devices are compared and copied on the calling thread:
/// below this, waking the workers costs more than the work.
inline constexpr std::size_t kParallelPassBytes = 256 * 1024;

/// Large blocks are copied into place in this many parts, so that one device's large block
/// (a shard_map output of uneven blocks) is shared by the threads.
inline constexpr int kPlaceParts = 4;

/// The first part of finish_outputs(): each output's plan, then (check) the comparison of
/// replicas over the devices. Returns whether copies are left, and (`parallel`) whether they
/// are large enough for the threads.
template <class Outputs>
bool plan_outputs(Outputs& outputs, const CallInfo& call, Pool& pool, bool check, bool& parallel) {
  bool pass = false;
  std::size_t bytes = 0;
  outputs.each([&](auto& sink) {
    sink.plan();
    if (sink.pass(check)) pass = true, bytes += sink.bytes();
  });
  if (!pass) return false;
  parallel = bytes >= kParallelPassBytes;
  if (check && call.n > 1) {
    auto compare = [&](int i) { outputs.each([&](auto& sink) { sink.compare(i); }); };
    if (parallel)
      pool.run(call.n, compare);
    else
      for (int i = 0; i < call.n; ++i) compare(i);
    outputs.each([](auto& sink) { sink.raise_mismatch(); });
  }
  return true;
}

/// Across processes: this process's outputs planned (or `error`, its failure since the
/// devices returned), then agreed with the other processes' (ProcessSpan::agree_on_outputs).
template <class Outputs>
bool agree_on_outputs(Outputs& outputs, const CallInfo& call, Pool& pool, bool check,
                      bool& parallel, std::exception_ptr error) {
  bool pass = false;
  std::vector<OutputDigest> digests;
  if (!error) {
    try {
      pass = plan_outputs(outputs, call, pool, check, parallel);
      outputs.each([&](auto& sink) {
        if constexpr (requires { sink.digest(check); }) digests.push_back(sink.digest(check));
      });
    } catch (...) {
      error = std::current_exception();
    }
  }
  call.span->agree_on_outputs(error, digests);
  return pass;
}

/// After every device returned: each output's plan (shapes, result, target), then the
/// comparison of replicas over the devices, and the copies of the blocks into place, in
/// parallel when they are large (each block in kPlaceParts parts). Nothing is written when the
/// comparison fails. Across processes (call.span), the processes agree before the copies;
/// `error` is this process's failure since its devices returned, raised on every process.
template <class Outputs>
void finish_outputs(Outputs& outputs, const CallInfo& call, Pool& pool, bool check,
                    std::exception_ptr error = nullptr) {
  bool parallel = false;
  const bool pass = call.span ? agree_on_outputs(outputs, call, pool, check, parallel, error)
                              : plan_outputs(outputs, call, pool, check, parallel);
  if (!pass) return;
  if (!parallel) {
    for (int i = 0; i < call.n; ++i) outputs.each([&](auto& sink) { sink.place(i, 0, 1); });
    return;
  }
  pool.run(call.n * kPlaceParts, [&](int t) {
    outputs.each([&](auto& sink) { sink.place(t / kPlaceParts, t % kPlaceParts, kPlaceParts); });
  });
}

}  // namespace pmap::detail
