/// @file outputs.hpp
/// @brief Where results are assembled: out_axes resolution, per-output sinks that write each
/// device's output straight into its place in the result (SPEC 2.2, 3.2).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "pmap/axes.hpp"
#include "pmap/detail/errors.hpp"
#include "pmap/detail/memory.hpp"
#include "pmap/detail/tensor_traits.hpp"
#include "pmap/runtime.hpp"

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
constexpr bool check_output() {
  static_assert(valid_output_v<O>,
                "pmap: a kernel output must be an Eigen tensor, TensorMap, tensor expression or "
                "arithmetic scalar (or a std::tuple / std::vector of them)");
  static_assert(!is_dangling_expr_v<O>,
                "pmap: the kernel returns an Eigen expression that holds an owning Eigen::Tensor "
                "by reference (a kernel-local tensor or a collective's result), which dies when "
                "the kernel returns. Return pmap::eval(expr) instead, or wrap a long-lived tensor "
                "in an Eigen::TensorMap.");
  return true;
}

template <class O>
Shape output_shape(const O& value) {
  using U = std::remove_cvref_t<O>;
  if constexpr (is_arithmetic_scalar_v<U>) {
    return Shape{};
  } else if constexpr (requires { value.dimensions(); }) {
    return shape_of_dims(value.dimensions(), output_leaf<U>::rank);
  } else {
    Eigen::DefaultDevice device;
    Eigen::TensorEvaluator<const U, Eigen::DefaultDevice> evaluator(value, device);
    return shape_of_dims(evaluator.dimensions(), output_leaf<U>::rank);
  }
}

/// Waits (briefly, the owner is running) until a one-time initialisation is published.
class Once {
 public:
  Once() = default;
  Once(const Once& other) : state_(other.state_.load(std::memory_order_relaxed)) {}
  /// Returns true for the one caller that must initialise and then call publish().
  bool claim() {
    int expected = 0;
    if (state_.load(std::memory_order_acquire) == 2) return false;
    if (state_.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return true;
    while (state_.load(std::memory_order_acquire) != 2) std::this_thread::yield();
    return false;
  }
  void publish() { state_.store(2, std::memory_order_release); }
  void reset(bool done) { state_.store(done ? 2 : 0, std::memory_order_relaxed); }

 private:
  std::atomic<int> state_{0};
};

/// "float32", or "float32 (ColMajor)" for a column-major tensor: into() names the layout
/// too, since a result of the wrong layout has the right shape and scalar type.
template <class T>
std::string layout_tagged_dtype(int layout) {
  return std::string(dtype_name<T>()) + (layout == Eigen::ColMajor ? " (ColMajor)" : "");
}

/// Facts shared by the sinks of one call.
struct CallInfo {
  int n = 0;
  const Device* devices = nullptr;  ///< device i of this call is devices[i]
  int id(int i) const { return devices[i].id; }
};

template <class O, class S>
class Sink;

/// A mapped output: the device axis is inserted at `axis`; each device writes its place.
template <class O>
class Sink<O, int> {
  using Tr = output_leaf<std::remove_cvref_t<O>>;
  using T = typename Tr::scalar;
  static constexpr int R = Tr::rank;
  static constexpr int L = Tr::layout;

 public:
  using Result = Eigen::Tensor<T, R + 1, L>;

  Sink(const CallInfo& call, int axis, int index) : call_(call), index_(index) {
    if (axis < -(R + 1) || axis > R) raise_out_axis(axis, index, R);
    axis_ = axis < 0 ? axis + R + 1 : axis;
  }

  /// Writes into a caller-owned result instead of allocating one. Its shape is checked
  /// against what the call returns: here when that is known in advance (scalar outputs),
  /// else by the first device to finish, before anything is written.
  template <class Target>
  void bind(Target& target) {
    using TT = tensor_leaf<std::remove_cvref_t<Target>>;
    target_shape_ = shape_of_dims(target.dimensions(), TT::rank);
    target_dtype_ = layout_tagged_dtype<typename TT::scalar>(TT::layout);
    if constexpr (std::is_same_v<typename TT::scalar, T> && TT::rank == R + 1 && TT::layout == L) {
      data_ = target.data();  // nullptr for an empty target, which is still a valid one
      target_typed_ = true;
    }
    bound_ = true;
    if constexpr (R == 0) check_target(Shape{});
  }

  template <class V>
  void write(int i, const V& value) {
    const Shape s = output_shape(value);
    if (once_.claim()) {
      shape_ = s;
      owner_ = i;
      full_ = insert_axis(s, axis_, call_.n);
      if (bound_) {
        try {
          check_target(s);
        } catch (...) {
          target_rejected_ = true;
          once_.publish();
          throw;
        }
      } else {
        result_ = Result(dsizes<T, R + 1, L>(full_));
        data_ = result_.data();
        prepare_result(data_, static_cast<std::size_t>(full_.size()) * sizeof(T));
      }
      once_.publish();
    }
    if (target_rejected_) check_target(s);  // every device fails like the first one
    if (!(s == shape_)) raise_output_shapes_differ(index_, call_.id(owner_), shape_, call_.id(i), s);
    if constexpr (is_arithmetic_scalar_v<std::remove_cvref_t<V>>) {
      data_[i] = value;
    } else {
      const bool contiguous = (L == Eigen::RowMajor) ? axis_ == 0 : axis_ == R;
      if (contiguous)
        Eigen::TensorMap<Eigen::Tensor<T, R, L>>(data_ + shape_.size() * i, dsizes<T, R, L>(shape_)) =
            value;
      else  // a slice of extent 1 along the device axis, not chip(): GCC 12 -Warray-bounds
        Eigen::TensorMap<Eigen::Tensor<T, R + 1, L>>(data_, dsizes<T, R + 1, L>(full_))
            .slice(place(i), extent_one()) = value.reshape(extent_one());
    }
  }

  void finish(bool) {
    if (call_.n == 0 && !bound_) result_ = Result(dsizes<T, R + 1, L>(insert_axis(Shape{R}, axis_, 0)));
  }
  Result take() { return std::move(result_); }

 private:
  Eigen::DSizes<Eigen::DenseIndex, R + 1> place(int i) const {
    Eigen::DSizes<Eigen::DenseIndex, R + 1> at;
    for (int a = 0; a < R + 1; ++a) at[a] = a == axis_ ? i : 0;
    return at;
  }
  Eigen::DSizes<Eigen::DenseIndex, R + 1> extent_one() const {
    return dsizes<T, R + 1, L>(insert_axis(shape_, axis_, 1));
  }

  /// The caller-owned result must have the shape, scalar type and layout the call returns
  /// for a device output of shape s.
  void check_target(const Shape& s) const {
    const Shape expected = insert_axis(s, axis_, call_.n);
    if (!target_typed_ || !(expected == target_shape_))
      raise_into_mismatch(index_, layout_tagged_dtype<T>(L).c_str(), expected, target_dtype_.c_str(),
                          target_shape_);
  }

  const CallInfo& call_;
  int index_;
  int axis_ = 0;
  Once once_;
  Result result_;
  T* data_ = nullptr;
  Shape full_, shape_;
  int owner_ = 0;
  bool bound_ = false;
  bool target_typed_ = false;  ///< the bound target has this output's scalar, rank and layout
  bool target_rejected_ = false;
  Shape target_shape_;
  std::string target_dtype_;
};

/// A replicated output (out_axes none): device 0's value, checked against the others.
template <class O>
class Sink<O, none_t> {
  using Tr = output_leaf<std::remove_cvref_t<O>>;
  using T = typename Tr::scalar;
  static constexpr int R = Tr::rank;
  static constexpr int L = Tr::layout;

 public:
  using Result = Eigen::Tensor<T, R, L>;

  Sink(const CallInfo& call, none_t, int index)
      : call_(call), index_(index), values_(static_cast<std::size_t>(call.n)) {}

  /// The caller-owned result is checked and written once every device returned.
  template <class Target>
  void bind(Target& target) {
    using TT = tensor_leaf<std::remove_cvref_t<Target>>;
    target_shape_ = shape_of_dims(target.dimensions(), TT::rank);
    target_dtype_ = layout_tagged_dtype<typename TT::scalar>(TT::layout);
    bound_ = true;
    if constexpr (std::is_same_v<typename TT::scalar, T> && TT::rank == R && TT::layout == L) {
      target_ = target.data();  // nullptr for an empty target, which is still a valid one
      target_typed_ = true;
    }
  }

  template <class V>
  void write(int i, const V& value) {
    Result& slot = values_[static_cast<std::size_t>(i)];
    if constexpr (is_arithmetic_scalar_v<std::remove_cvref_t<V>>)
      slot() = value;
    else
      slot = value;
  }

  /// After every device returned: E12 / E13 checks, then the caller-owned copy.
  void finish(bool check_replicated) {
    if (call_.n == 0) return;
    const Result& first = values_[0];
    const Shape s0 = output_shape(first);
    for (int i = 1; i < call_.n; ++i) {
      const Result& v = values_[static_cast<std::size_t>(i)];
      const Shape si = output_shape(v);
      if (!(si == s0)) raise_output_shapes_differ(index_, call_.id(0), s0, call_.id(i), si);
    }
    if (check_replicated)
      for (int i = 1; i < call_.n; ++i) {
        const T* a = first.data();
        const T* b = values_[static_cast<std::size_t>(i)].data();
        for (std::int64_t k = 0; k < s0.size(); ++k)
          if (!(a[k] == b[k]) && !(a[k] != a[k] && b[k] != b[k])) raise_not_replicated(index_, i);
      }
    if (bound_) {
      if (!target_typed_ || !(target_shape_ == s0))
        raise_into_mismatch(index_, layout_tagged_dtype<T>(L).c_str(), s0, target_dtype_.c_str(),
                            target_shape_);
      std::copy(first.data(), first.data() + s0.size(), target_);
    }
  }
  Result take() { return std::move(values_[0]); }

 private:
  const CallInfo& call_;
  int index_;
  std::vector<Result> values_;
  T* target_ = nullptr;
  bool bound_ = false;
  bool target_typed_ = false;
  Shape target_shape_;
  std::string target_dtype_;
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
  template <class V>
  void write(int i, const V& value) { sink_.write(i, value); }
  template <class Target>
  void bind(Target& target) { sink_.bind(target); }
  void finish(bool check_replicated) { sink_.finish(check_replicated); }
  Result take() { return sink_.take(); }

 private:
  Sink<O, typename Spec::type> sink_;
};

template <class Out>
class OutputSet<void, Out> {
 public:
  OutputSet(const CallInfo&, const Out&) {}
  void finish(bool) {}
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
  void write(int i, const V& values) {
    std::apply([&](auto&... sink) { std::apply([&](const auto&... v) { (sink.write(i, v), ...); }, values); },
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
  void finish(bool check) { std::apply([&](auto&... sink) { (sink.finish(check), ...); }, sinks_); }
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
  void write(int i, const V& values) {
    if (once_.claim()) {
      for (std::size_t k = 0; k < values.size(); ++k) sinks_.emplace_back(call_, spec_, static_cast<int>(k));
      owner_ = i;
      once_.publish();
    }
    if (values.size() != sinks_.size())
      raise_output_count_differs(call_.id(i), values.size(), call_.id(owner_), sinks_.size());
    for (std::size_t k = 0; k < values.size(); ++k) sinks_[k].write(i, values[k]);
  }
  void finish(bool check) {
    for (auto& sink : sinks_) sink.finish(check);
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

}  // namespace pmap::detail
