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

template <class F, class In, class Out, class... Args>
struct call_ok {
  static constexpr bool value = [] {
    if constexpr (sizeof...(Args) == 0) {
      return true;  // raises E2 at run time
    } else if constexpr (!in_axes_count_ok<In, sizeof...(Args)>) {
      return false;
    } else if constexpr (!mapping_t<In, Args...>::template invocable<F>) {
      return false;
    } else {
      return out_axes_count_ok<Out, typename mapping_t<In, Args...>::template result<F>>;
    }
  }();
};

template <class F, class In, class... Args>
struct call_result {
  using type = typename mapping_t<In, Args...>::template result<F>;
};
template <class F, class In>
struct call_result<F, In> {
  using type = void;
};

/// Joins the nesting rendezvous of the enclosing call: every outer device calls the inner
/// pmap, the first creates the shared team of outer x inner devices.
std::shared_ptr<Team> join_nested(Context& outer, int n, const std::string* axis_name,
                                  const Runtime& runtime);

/// Multi-process: every process reports whether its arguments passed validation and what it
/// passed; raises the same ValueError / TypeError on every process unless all agree.
void agree_on_call(int error_kind, const std::string& error, std::int64_t n,
                   const std::vector<LeafInfo>& leaves);

/// Multi-process: after the local devices finished, learns every process's outcome and
/// raises the local failure, or a DeviceError naming another process's failing device.
void finish_distributed_call(const Team& team);

/// Logs one dispatch at debug level.
void log_dispatch(const std::string& name, int n, const Device* devices,
                  const std::vector<LeafInfo>& leaves, double microseconds);

/// Owns the team of the last top-level call of a Mapped, reused by the next one.
class TeamCache {
 public:
  TeamCache() = default;
  TeamCache(const TeamCache&) {}
  TeamCache& operator=(const TeamCache&) { return *this; }
  ~TeamCache() { delete team_.exchange(nullptr); }
  Team* take() { return team_.exchange(nullptr, std::memory_order_acquire); }
  void give(Team* team) { delete team_.exchange(team, std::memory_order_acq_rel); }

 private:
  std::atomic<Team*> team_{nullptr};
};

/// Checks the devices option of pmap(): non-empty (E1), distinct, all from the runtime.
void check_devices_option(const std::optional<std::vector<Device>>& devices,
                          const Runtime& runtime);

}  // namespace detail

/// @brief A kernel mapped over an axis: call it like the kernel, with the mapped axis added.
///
/// `result = mapped(args...)` returns freshly allocated results; `mapped.into(out, args...)`
/// writes into caller-owned ones. Arguments are validated before any kernel runs (SPEC 5).
///
/// Example:
/// @code
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
    requires detail::call_ok<F, In, Out, Args...>::value
  auto operator()(Args&&... args) const {
    using R = typename detail::call_result<F, In, Args...>::type;
    return run<R, std::nullptr_t>(nullptr, args...);
  }

  /// @brief Like operator(), but writes into caller-owned results: `out` is one result tensor
  /// or TensorMap, or a std::tuple of references (std::tie) for several outputs.
  template <class Target, class... Args>
    requires(sizeof...(Args) > 0 && detail::call_ok<F, In, Out, Args...>::value)
  void into(Target&& out, Args&&... args) const {
    using R = typename detail::call_result<F, In, Args...>::type;
    static_assert(!std::is_void_v<R>, "pmap into: the kernel returns nothing");
    run<R>(&out, args...);
  }

  /// @brief The options the function was created with.
  const Options& options() const { return options_; }

 private:
  template <class R, class Target, class... Args>
  auto run(Target* target, const Args&... args) const {
    using M = detail::mapping_t<In, Args...>;
    using Outputs = detail::OutputSet<R, Out>;
    if constexpr (sizeof...(Args) == 0) {
      detail::raise_no_arguments(options_.name);
    } else {
      auto* outer = static_cast<Context*>(detail::current_device);
      if (outer && detail::Access::runtime(*outer) != runtime_) outer = nullptr;
      const int processes = outer ? 1 : runtime_->process_count();
      const int n = validate(processes, outer, args...);
      const bool logging = detail::log_enabled(spdlog::level::debug);
      const auto start = logging ? std::chrono::steady_clock::now()
                                 : std::chrono::steady_clock::time_point{};

      // The team: cached for top-level calls, shared with the other outer devices if nested,
      // spanning every process's devices under MPI (this process runs [base, base + n)).
      // Outputs and into() targets first: once a nested call joined the nesting rendezvous,
      // it must start its inner devices, which its peers' inner devices may wait for.
      detail::CallInfo call;
      call.n = n;
      Outputs outputs(call, out_);
      if constexpr (!std::is_same_v<Target, std::nullptr_t>) outputs.bind(*target);

      std::shared_ptr<detail::Team> child;
      detail::Team* team = nullptr;
      int base = 0;
      if (outer) {
        child = detail::join_nested(*outer, n, &options_.axis_name, *runtime_);
        team = child.get();
        base = detail::Access::member(*outer).index * n;
        call.devices = runtime_->devices().data() + base;
      } else {
        base = runtime_->process_index() * n;
        call.devices = options_.devices ? options_.devices->data() : runtime_->devices().data() + base;
        const int global = n * processes;
        team = cache_.take();
        if (!team || team->size() != global) {
          delete team;
          const detail::AxisBinding axis{options_.axis_name, global};
          std::vector<int> ids(static_cast<std::size_t>(global));
          for (int c = 0; c < global; ++c)
            ids[static_cast<std::size_t>(c)] = c >= base && c < base + n
                                                   ? call.id(c - base)
                                                   : runtime_->devices()[static_cast<std::size_t>(c)].id;
          team = new detail::Team(global, std::span(&axis, 1), std::move(ids),
                                  runtime_->num_threads(), base, n);
        } else {
          team->reset();
        }
      }
      struct Release {
        const Mapped* self;
        detail::Team* team;
        bool cached;
        ~Release() {
          if (cached) self->cache_.give(team);
        }
      } release{this, team, !outer};

      void* const caller_device = detail::current_device;
      runtime_->pool().run(n, [&](int i) {
        const int index = base + i;
        Context ctx = detail::Access::make(team, index, &call.devices[i], runtime_);
        void* const previous = detail::current_device;
        detail::current_device = &ctx;
        team->slot(index).runner.store(&detail::thread_tag, std::memory_order_relaxed);
        try {
          if (team->cancelled()) throw detail::Cancelled{};
          detail::Staging staging;
          auto views = make_views<M>(i, staging, std::index_sequence_for<Args...>{}, args...);
          if constexpr (std::is_void_v<R>)
            detail::invoke_kernel(kernel_, ctx, std::move(views));
          else
            outputs.write(i, detail::invoke_kernel(kernel_, ctx, std::move(views)));
        } catch (const detail::Cancelled&) {
        } catch (...) {
          team->fail(std::current_exception(), index);
        }
        team->finish(index);
        detail::current_device = previous;
      });
      detail::current_device = caller_device;
      if (processes > 1)
        detail::finish_distributed_call(*team);
      else if (std::exception_ptr error = team->error())
        std::rethrow_exception(error);
      outputs.finish(options_.check_replicated);
      if (logging) log_call(n, call, start, args...);
      return outputs.take();
    }
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
    int kind = -1;
    std::string error;
    try {
      n = survey(args...);
    } catch (const ValueError& e) {
      kind = 0, error = e.what();
    } catch (const TypeError& e) {
      kind = 1, error = e.what();
    }
    detail::agree_on_call(kind, error, n, kind < 0 ? leaves(args...) : std::vector<detail::LeafInfo>{});
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

  template <class... Args>
  void log_call(int n, const detail::CallInfo& call, std::chrono::steady_clock::time_point start,
                const Args&... args) const {
    const double us = std::chrono::duration<double, std::micro>(
                          std::chrono::steady_clock::now() - start)
                          .count();
    detail::log_dispatch(options_.name, n, call.devices, leaves(args...), us);
  }

  F kernel_;
  In in_;
  Out out_;
  Options options_;
  Runtime* runtime_;
  mutable detail::TeamCache cache_;
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
