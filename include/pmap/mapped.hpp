/// @file mapped.hpp
/// @brief pmap() and Mapped: validate the arguments, run one device per position of the
/// mapped axis, and assemble the results (SPEC 2, 3).
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "pmap/axes.hpp"
#include "pmap/context.hpp"
#include "pmap/detail/arguments.hpp"
#include "pmap/detail/diagnostics.hpp"
#include "pmap/detail/dispatch.hpp"
#include "pmap/detail/engine.hpp"
#include "pmap/detail/kernel.hpp"
#include "pmap/detail/outputs.hpp"
#include "pmap/detail/pool.hpp"
#include "pmap/detail/team.hpp"
#include "pmap/logging.hpp"
#include "pmap/options.hpp"
#include "pmap/runtime.hpp"

namespace pmap {
namespace detail {

/// View types, invocability and result type of a kernel over arguments Args under spec In.
template <class In, class Seq, class... Args>
struct mapping;
template <class In, std::size_t... K, class... Args>
struct mapping<In, std::index_sequence<K...>, Args...> {
  template <std::size_t J>
  using spec = arg_spec<In, J, std::remove_cvref_t<std::tuple_element_t<J, std::tuple<Args...>>>>;
  using views = std::tuple<arg_view_t<Args, typename spec<K>::type>...>;
  template <class F>
  static constexpr bool invocable = kernel_invocable_v<F, arg_view_t<Args, typename spec<K>::type>...>;
  template <class F>
  using result = kernel_result_t<F, arg_view_t<Args, typename spec<K>::type>...>;
  static constexpr bool all_none = (!std::is_same_v<typename spec<K>::type, int> && ...);
};

template <class In, class... Args>
using mapping_t = mapping<In, std::index_sequence_for<Args...>, Args...>;

/// The one compile-time rule of a call that SPEC makes a constraint (E9, 3.1): in_axes has
/// one entry, or one per argument, so that std::is_invocable_v is false otherwise.
template <class In, std::size_t N>
concept in_axes_has_one_entry_or_one_per_argument = in_axes_count_ok<In, N>;

/// Whether kernel F can take the views of Args (no arguments: E2 at run time).
template <class F, class In, class... Args>
constexpr bool kernel_fits() {
  if constexpr (sizeof...(Args) == 0) return true;
  else return mapping_t<In, Args...>::template invocable<F>;
}

/// SPEC 3.2: out_axes has one entry, or one per output (another count does not compile, and
/// std::is_invocable_v is false). A kernel that cannot take the views passes here, to get
/// its own diagnostic.
template <class F, class In, class Out, class... Args>
constexpr bool out_axes_fit() {
  if constexpr (!kernel_fits<F, In, Args...>() || sizeof...(Args) == 0) return true;
  else return out_axes_count_ok<Out, typename mapping_t<In, Args...>::template result<F>>;
}
template <class F, class In, class Out, class... Args>
concept out_axes_has_one_entry_or_one_per_output = out_axes_fit<F, In, Out, Args...>();

/// Fails to compile with the diagnostic that fits F over Args (diagnostics.hpp).
template <class F, class In, class... Args>
constexpr void diagnose_call() {
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    using M = mapping_t<In, Args...>;
    diagnose_kernel<F, arg_view_t<Args, typename M::template spec<K>::type>...>();
  }(std::index_sequence_for<Args...>{});
}

template <class F, class In, class... Args>
struct call_result {
  using type = typename mapping_t<In, Args...>::template result<F>;
};
template <class F, class In>
struct call_result<F, In> {
  using type = void;
};

}  // namespace detail

/// @brief A kernel mapped over an axis: call it like the kernel, with the mapped axis added.
///
/// `result = mapped(args...)` returns freshly allocated results; `mapped.into(out, args...)`
/// writes into caller-owned ones. Arguments are validated before any kernel runs (SPEC 5).
///
/// Example:
/// @code
///   const int n = pmap::device_count();
///   Eigen::Tensor<float, 2, Eigen::RowMajor> xs(n, 16), ys(n, 16);   // one row per device
///   xs.setRandom();
///   ys.setRandom();
///   auto f = pmap::pmap([](auto x, auto y) { return x * 2.f + y; });
///   Eigen::Tensor<float, 2, Eigen::RowMajor> r = f(xs, ys);   // r.chip(i, 0) == f(xs[i], ys[i])
/// @endcode
///
/// Thread safety: a Mapped may be called from several threads at once, and from inside a
/// kernel (nesting, SPEC 3.5).
template <class F, class In, class Out>
class Mapped {
 public:
  Mapped(F kernel, In in, Out out, Options options)
      : kernel_(std::move(kernel)),
        in_(in),
        out_(out),
        options_(std::move(options)),
        runtime_(options_.runtime ? options_.runtime : &Runtime::global()) {
    detail::check_devices_option(options_.devices, *runtime_);
  }

  /// @brief Runs the kernel on every device and returns the stacked results.
  template <class... Args>
    requires detail::in_axes_has_one_entry_or_one_per_argument<In, sizeof...(Args)> &&
             detail::out_axes_has_one_entry_or_one_per_output<F, In, Out, Args...>
  auto operator()(Args&&... args) const {
    if constexpr (!detail::kernel_fits<F, In, Args...>()) {
      detail::diagnose_call<F, In, Args...>();
    } else {
      using R = typename detail::call_result<F, In, Args...>::type;
      return run<R, std::nullptr_t>(nullptr, args...);
    }
  }

  /// @brief Like operator(), but writes into caller-owned results: `out` is one result tensor
  /// or TensorMap, or a std::tuple of references (std::tie) for several outputs.
  template <class Target, class... Args>
    requires(sizeof...(Args) > 0 &&
             detail::in_axes_has_one_entry_or_one_per_argument<In, sizeof...(Args)> &&
             detail::out_axes_has_one_entry_or_one_per_output<F, In, Out, Args...>)
  void into(Target&& out, Args&&... args) const {
    if constexpr (!detail::kernel_fits<F, In, Args...>()) {
      detail::diagnose_call<F, In, Args...>();
    } else {
      using R = typename detail::call_result<F, In, Args...>::type;
      static_assert(!std::is_void_v<R>, "pmap into: the kernel returns nothing");
      run<R>(&out, args...);
    }
  }

  /// @brief The options the function was created with.
  const Options& options() const { return options_; }

 private:
  /// One call: validate, bind the outputs, lease a team, run the devices, rethrow the first
  /// failure, finish the outputs.
  template <class R, class Target, class... Args>
  auto run(Target* target, const Args&... args) const {
    if constexpr (sizeof...(Args) == 0) {
      detail::raise_no_arguments(options_.name);
    } else {
      Context* const outer = detail::enclosing_device(*runtime_);
      const int processes = outer ? 1 : runtime_->process_count();
      const int n = validate(processes, outer, args...);
      const detail::DispatchTimer timer;
      if (!hinted_.load(std::memory_order_relaxed) && detail::log_enabled(spdlog::level::info) &&
          !hinted_.exchange(true))
        detail::hint_strided_slices(options_.name, leaves(args...));
      const detail::CallInfo call = call_info(n, outer);
      using M = detail::mapping_t<In, Args...>;
      auto views = [&](int i, detail::Staging& staging) {
        return make_views<M>(i, staging, std::index_sequence_for<Args...>{}, args...);
      };
      auto lease = [&] { return lease_team(outer, call, processes); };
      auto arguments = [&] { return detail::describe_arguments(args...); };
      auto finish = [&] {
        if (timer.on()) detail::log_dispatch(options_.name, n, call.devices, leaves(args...), timer.microseconds());
      };
      if constexpr (std::is_void_v<R>) {
        detail::execute<R>(kernel_, out_, target, call, *runtime_, processes, options_.check_replicated, lease,
                           views, arguments);
        finish();
      } else {
        auto result = detail::execute<R>(kernel_, out_, target, call, *runtime_, processes,
                                         options_.check_replicated, lease, views, arguments);
        finish();
        return result;
      }
    }
  }

  /// This call's n devices: the devices option, else the runtime's, from first_device().
  detail::CallInfo call_info(int n, const Context* outer) const {
    detail::CallInfo call;
    call.n = n;
    call.devices = !outer && options_.devices
                       ? options_.devices->data()
                       : runtime_->devices().data() + detail::first_device(*runtime_, outer, n);
    call.mesh = detail::MeshShape::line(n, &options_.axis_name);
    call.name = &options_.name;
    return call;
  }

  /// The team: cached for top-level calls, shared with the other outer devices if nested,
  /// spanning every process's devices under MPI.
  detail::TeamLease lease_team(Context* outer, const detail::CallInfo& call, int processes) const {
    if (outer) {
      const detail::AxisBinding axis{options_.axis_name, call.n};
      return detail::TeamLease(*outer, std::span(&axis, 1), "pmap", *runtime_);
    }
    return detail::TeamLease(cache_, *runtime_, options_.axis_name, call.n, processes, call);
  }

  template <class M, std::size_t... K, class... Args>
  auto make_views(int i, detail::Staging& staging, std::index_sequence<K...>,
                  const Args&... args) const {
    return typename M::views(
        detail::arg_view(args, M::template spec<K>::get(in_), i, staging)...);
  }

  /// SPEC 5, in JAX's order: E3, E4/E4b, E5, E6, E7/E8. Returns the local axis size.
  /// Under MPI every process learns every other's verdict first, so all raise the same error.
  template <class... Args>
  int validate(int processes, Context* outer, const Args&... args) const {
    if (processes == 1) {
      const int n = survey(args...);
      check_sizes(n, 1, outer);
      return n;
    }
    int n = 0;
    detail::Verdict verdict = detail::Verdict::valid;
    std::string error;
    try {
      n = survey(args...);
    } catch (const ValueError& e) {
      verdict = detail::Verdict::value_error, error = e.what();
    } catch (const TypeError& e) {
      verdict = detail::Verdict::type_error, error = e.what();
    }
    detail::agree_on_call(verdict, error, n,
                          verdict == detail::Verdict::valid ? leaves(args...) : std::vector<detail::LeafInfo>{});
    check_sizes(n, processes, outer);
    return n;
  }

  /// E3, E4/E4b, E5 on this process's arguments; returns the local axis size.
  template <class... Args>
  int survey(const Args&... args) const {
    using M = detail::mapping_t<In, Args...>;
    detail::Survey survey;
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (detail::survey_arg(args, M::template spec<K>::get(in_), K, survey), ...);
    }(std::index_sequence_for<Args...>{});
    if (survey.rank_error)
      detail::raise_rank_too_small(options_.name, survey.rank_error_axis, survey.rank_error_shape);
    if constexpr (M::all_none) detail::raise_all_none(options_.name);
    if (survey.mapped_leaves == 0) detail::raise_no_mapped_leaf();
    if (survey.sizes_differ) detail::raise_inconsistent_sizes(options_.name, leaves(args...));
    if (survey.n == 0) detail::raise_empty_axis(options_.name, leaves(args...).front());
    return static_cast<int>(survey.n);
  }

  /// E6, E7/E8 for a local axis size n on `processes` processes.
  void check_sizes(std::int64_t n, int processes, Context* outer) const {
    const std::int64_t global = n * processes;
    if (options_.axis_size && *options_.axis_size != global)
      detail::raise_axis_size_mismatch(*options_.axis_size, global, processes > 1);
    const std::int64_t enclosing = outer ? detail::Access::member(*outer).team->size() : 1;
    if (options_.devices) {
      if (static_cast<std::size_t>(n) != options_.devices->size())
        detail::raise_devices_mismatch(n, options_.devices->size());
    } else if (global * enclosing > runtime_->device_count()) {
      detail::raise_too_many_devices(global * enclosing, runtime_->device_count());
    }
  }

  template <class... Args>
  std::vector<detail::LeafInfo> leaves(const Args&... args) const {
    using M = detail::mapping_t<In, Args...>;
    std::vector<detail::LeafInfo> out;
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (detail::collect_leaves(args, M::template spec<K>::get(in_), K, out), ...);
    }(std::index_sequence_for<Args...>{});
    return out;
  }

  F kernel_;
  In in_;
  Out out_;
  Options options_;
  Runtime* runtime_;
  mutable detail::TeamCache cache_;
  mutable detail::CopyableFlag hinted_;  ///< the strided-slice hint was considered
};

/// @brief Maps `kernel` over axis 0 of every tensor argument; every output stacked at axis 0.
template <class F>
auto pmap(F&& kernel, Options options = {}) {
  return Mapped<std::decay_t<F>, InAxes<>, OutAxes<>>(std::forward<F>(kernel), {}, {},
                                                      std::move(options));
}
/// @brief Maps `kernel` with explicit in_axes.
template <class F, class... I>
auto pmap(F&& kernel, InAxes<I...> in, Options options = {}) {
  return Mapped<std::decay_t<F>, InAxes<I...>, OutAxes<>>(std::forward<F>(kernel), in, {},
                                                          std::move(options));
}
/// @brief Maps `kernel` with explicit out_axes.
template <class F, class... O>
auto pmap(F&& kernel, OutAxes<O...> out, Options options = {}) {
  return Mapped<std::decay_t<F>, InAxes<>, OutAxes<O...>>(std::forward<F>(kernel), {}, out,
                                                          std::move(options));
}
/// @brief Maps `kernel` with explicit in_axes and out_axes.
template <class F, class... I, class... O>
auto pmap(F&& kernel, InAxes<I...> in, OutAxes<O...> out, Options options = {}) {
  return Mapped<std::decay_t<F>, InAxes<I...>, OutAxes<O...>>(std::forward<F>(kernel), in, out,
                                                              std::move(options));
}

}  // namespace pmap
