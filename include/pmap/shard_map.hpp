/// @file shard_map.hpp
/// @brief shard_map(): a kernel over the blocks of tensors split across a device mesh
/// (SPEC 9). Runs on the engine pmap runs on (engine.hpp).
#pragma once

#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "pmap/context.hpp"
#include "pmap/errors.hpp"
#include "pmap/detail/arguments.hpp"
#include "pmap/detail/blocks.hpp"
#include "pmap/detail/diagnostics.hpp"
#include "pmap/detail/dispatch.hpp"
#include "pmap/detail/engine.hpp"
#include "pmap/detail/kernel.hpp"
#include "pmap/detail/outputs.hpp"
#include "pmap/detail/process_blocks.hpp"
#include "pmap/detail/team.hpp"
#include "pmap/mesh.hpp"
#include "pmap/runtime.hpp"

namespace pmap {
namespace detail {

/// A spec resolved against a mesh: its Partition, or the error it raises at a call.
struct ResolvedSpec {
  Partition partition;
  int entries = 0;         ///< number of entries given (the rank it needs at least)
  bool splits = false;     ///< some entry names an axis
};

/// Resolves in_specs (kind "in_specs") or out_specs against `mesh`: NameError for an axis
/// the mesh lacks, ValueError for an axis used twice or more entries than kMaxRank.
std::vector<ResolvedSpec> resolve_specs(const Mesh& mesh, const std::vector<PartitionSpec>& specs,
                                        const char* kind, const std::string& name);

[[noreturn]] void raise_spec_count(const std::string& name, const char* kind, std::size_t count,
                                   std::size_t expected, const char* what);
[[noreturn]] void raise_spec_rank(const std::string& name, const char* kind, std::size_t k,
                                  int entries, const std::string& what, const char* dtype,
                                  const Shape& shape);
[[noreturn]] void raise_spec_splits_non_tensor(const std::string& name, std::size_t k,
                                               const char* dtype);
/// A shard_map nested in the kernel of `outer` (SPEC 13): the inner mesh reuses no axis name
/// of the enclosing calls, and the outer devices times the mesh fit the runtime (E7).
void check_inner_mesh(const Context& outer, const Mesh& mesh, const std::string& name);
/// Where this process's block (SPEC 13) of a tensor of shape `global` split by `spec` over
/// `mesh` lies in it: all of it on one process. Raises as a shard_map call would.
Block process_block_of(const Mesh& mesh, const PartitionSpec& spec, const Shape& global,
                       const char* dtype);

template <class R>
inline constexpr std::size_t output_count_v = result_kind<R>::count;

/// Rank of output K of a kernel result type R (a tuple, a vector, or a single output).
template <class R, std::size_t K>
constexpr int output_rank() {
  using O = std::remove_cvref_t<R>;
  if constexpr (result_kind<O>::is_tuple)
    return output_leaf<std::remove_cvref_t<std::tuple_element_t<K, O>>>::rank;
  else if constexpr (result_kind<O>::is_vector)
    return output_leaf<std::remove_cvref_t<typename O::value_type>>::rank;
  else
    return output_leaf<O>::rank;
}

}  // namespace detail

/// @brief A kernel mapped over the blocks of a device mesh (SPEC 9): call it like the
/// kernel with whole tensors; each device receives its block of every argument.
///
/// Called inside a pmap or shard_map kernel of the same runtime, it maps over an inner mesh
/// (SPEC 13): every outer device calls it, and collectives may name outer and inner axes.
///
/// Thread safety: may be called from several threads at once.
template <class F>
class ShardMapped {
 public:
  ShardMapped(F kernel, Mesh mesh, std::vector<PartitionSpec> in_specs,
              std::vector<PartitionSpec> out_specs, ShardOptions options)
      : kernel_(std::move(kernel)), mesh_(std::move(mesh)), in_count_(in_specs.size()),
        out_count_(out_specs.size()), options_(std::move(options)) {
    for (const auto& [name, size] : mesh_.axes()) axes_.push_back({name, size});
    // Resolved once; an invalid spec raises its error at every call, before any kernel runs.
    try {
      in_ = detail::resolve_specs(mesh_, in_specs, "in_specs", options_.name);
      out_resolved_ = detail::resolve_specs(mesh_, out_specs, "out_specs", options_.name);
      for (const auto& r : out_resolved_) out_.parts.push_back(r.partition);
    } catch (...) {
      spec_error_ = std::current_exception();
    }
  }

  /// @brief Runs the kernel on every device of the mesh and returns the assembled results.
  template <class... Args>
  auto operator()(Args&&... args) const {
    if constexpr (!detail::kernel_invocable_v<F, detail::arg_view_t<Args, detail::ShardCut>...>) {
      detail::diagnose_kernel<F, detail::arg_view_t<Args, detail::ShardCut>...>();
    } else {
      using R = detail::kernel_result_t<F, detail::arg_view_t<Args, detail::ShardCut>...>;
      return run<R, std::nullptr_t>(nullptr, args...);
    }
  }

  /// @brief Like operator(), but writes into caller-owned results (one tensor, or a
  /// std::tuple of references for several outputs).
  template <class Target, class... Args>
  void into(Target&& out, Args&&... args) const {
    if constexpr (!detail::kernel_invocable_v<F, detail::arg_view_t<Args, detail::ShardCut>...>) {
      detail::diagnose_kernel<F, detail::arg_view_t<Args, detail::ShardCut>...>();
    } else {
      using R = detail::kernel_result_t<F, detail::arg_view_t<Args, detail::ShardCut>...>;
      static_assert(!std::is_void_v<R>, "shard_map into: the kernel returns nothing");
      run<R>(&out, args...);
    }
  }

  const Mesh& mesh() const { return mesh_; }
  const ShardOptions& options() const { return options_; }

 private:
  template <class R, class Target, class... Args>
  auto run(Target* target, const Args&... args) const {
    Context* const outer = detail::enclosing_device(mesh_.runtime());
    const int processes = outer ? 1 : mesh_.runtime().process_count();
    std::optional<detail::ProcessSpan> span;
    if (processes > 1)
      span.emplace(agree<R>(args...));
    else
      validate<R>(outer, args...);
    detail::CallInfo call;
    call.n = span ? span->local() : mesh_.size();
    // Nested, the inner mesh gives names and sizes; the devices are the nested call's. Across
    // processes, this process runs its box of the global mesh.
    call.devices = outer ? mesh_.runtime().devices().data() +
                               detail::first_device(mesh_.runtime(), outer, call.n)
                         : mesh_.devices().data() + (span ? span->base() : 0);
    call.mesh = span ? span->local_mesh() : mesh_shape();
    call.span = span ? &*span : nullptr;
    call.first_position = span ? span->base() : 0;
    call.name = &options_.name;
    call.shard = true;
    auto views = [&](int i, detail::Staging& staging) {
      return [&]<std::size_t... K>(std::index_sequence<K...>) {
        return std::tuple<detail::arg_view_t<Args, detail::ShardCut>...>(
            detail::arg_view(args, detail::ShardCut{&in_part(K), &call.mesh}, i, staging)...);
      }(std::index_sequence_for<Args...>{});
    };
    auto lease = [&] {
      if (outer) return detail::TeamLease(*outer, axes_, "shard_map", mesh_.runtime());
      return detail::TeamLease(cache_, mesh_.runtime(), axes_, call);
    };
    auto arguments = [&] { return detail::describe_arguments(args...); };
    return detail::execute<R>(kernel_, out_, target, call, mesh_.runtime(), processes,
                              options_.check_replicated, lease, views, arguments);
  }

  detail::MeshShape mesh_shape() const {
    detail::MeshShape shape;
    shape.num_axes = static_cast<int>(axes_.size());
    for (std::size_t a = 0; a < axes_.size(); ++a) {
      shape.sizes[a] = axes_[a].size;
      shape.names[a] = &axes_[a].name;
    }
    return shape;
  }

  /// Across processes (SPEC 13): this process's validation, the mesh's fit to the processes,
  /// and the contiguity of every spec, then the agreement of every process on them and on
  /// the global shapes; the same error on every process.
  template <class R, class... Args>
  detail::ProcessSpan agree(const Args&... args) const {
    const Runtime& runtime = mesh_.runtime();
    bool in_order = true;
    for (int i = 0; in_order && i < mesh_.size(); ++i) in_order = mesh_.devices()[static_cast<std::size_t>(i)].id == i;
    detail::ProcessSpan span(mesh_shape(), runtime.process_count(), runtime.local_device_count(),
                             runtime.process_index(), in_order, options_.name);
    std::exception_ptr error;
    std::vector<detail::ProcessLeaf> leaves;
    try {
      validate<R>(nullptr, args...);
      span.check();
      for (std::size_t k = 0; k < out_resolved_.size(); ++k)
        span.check_contiguous(out_resolved_[k].partition, "out_specs[" + std::to_string(k) + "]",
                              "output " + std::to_string(k));
      [&]<std::size_t... K>(std::index_sequence<K...>) {
        (process_leaves(span, args, K, leaves), ...);
      }(std::index_sequence_for<Args...>{});
    } catch (const Error&) {
      error = std::current_exception();
    }
    std::vector<detail::Partition> specs;
    for (const detail::ResolvedSpec& r : in_) specs.push_back(r.partition);
    span.agree_on_arguments(error, leaves, specs);
    return span;
  }

  /// Argument k's leaves as this process passes them: shapes, and the hashes of those that
  /// other processes replicate (check_replicated).
  template <class Arg>
  void process_leaves(const detail::ProcessSpan& span, const Arg& arg, std::size_t k,
                      std::vector<detail::ProcessLeaf>& out) const {
    const std::size_t s = in_.size() == 1 ? 0 : k;
    auto fn = [&](const auto& leaf, const detail::LeafPath& path) {
      using L = std::remove_cvref_t<decltype(leaf)>;
      detail::ProcessLeaf p{path.str(), detail::leaf_dtype<L>(), 0, -1, detail::leaf_shape(leaf), 0};
      if constexpr (detail::is_tensor_leaf_v<L>) {
        using T = typename detail::tensor_leaf<L>::scalar;
        p.layout = detail::tensor_leaf<L>::layout;
        p.spec = static_cast<int>(s);
        const detail::Partition& part = in_[s].partition;
        span.check_contiguous(part, "in_specs[" + std::to_string(s) + "]", p.path);
        if (options_.check_replicated && span.replicated(part))
          p.hash = detail::hash_bytes(detail::kHashSeed, leaf.data(), static_cast<std::size_t>(leaf.size()) * sizeof(T));
      } else if constexpr (std::is_arithmetic_v<L> && !std::is_same_v<L, long double>) {
        if (options_.check_replicated) p.hash = detail::hash_bytes(detail::kHashSeed, &leaf, sizeof leaf);
      }
      out.push_back(std::move(p));
    };
    detail::for_each_leaf(arg, detail::LeafPath{nullptr, k}, fn);
  }

  const detail::Partition& in_part(std::size_t k) const { return in_[in_.size() == 1 ? 0 : k].partition; }

  /// SPEC 9's errors, and nested (SPEC 13) the inner mesh's, before any kernel runs.
  template <class R, class... Args>
  void validate(Context* outer, const Args&... args) const {
    if (outer) detail::check_inner_mesh(*outer, mesh_, options_.name);
    constexpr std::size_t nargs = sizeof...(Args);
    if (!(in_count_ == 1 || in_count_ == nargs || (nargs == 0 && in_count_ == 0)))
      detail::raise_spec_count(options_.name, "in_specs", in_count_, nargs, "arguments");
    if constexpr (!std::is_void_v<R>) {
      constexpr std::size_t nout = detail::result_kind<std::remove_cvref_t<R>>::count;
      constexpr bool vec = detail::result_kind<std::remove_cvref_t<R>>::is_vector;
      if (!(out_count_ == 1 || (!vec && out_count_ == nout)))
        detail::raise_spec_count(options_.name, "out_specs", out_count_, nout,
                                 vec ? "outputs (a std::vector of outputs takes one spec)" : "outputs");
    } else if (out_count_ > 1) {
      detail::raise_spec_count(options_.name, "out_specs", out_count_, 0, "outputs");
    }
    if (spec_error_) std::rethrow_exception(spec_error_);
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (check_arg(args, K, sizeof...(Args)), ...);
    }(std::index_sequence_for<Args...>{});
    if constexpr (!std::is_void_v<R>) {
      [&]<std::size_t... K>(std::index_sequence<K...>) {
        (check_out<R, K>(), ...);
      }(std::make_index_sequence<detail::result_kind<std::remove_cvref_t<R>>::count>{});
    }
  }

  /// A spec shared by every argument applies to the tensors only; a non-tensor argument's
  /// own spec must not split anything.
  template <class Arg>
  void check_arg(const Arg& arg, std::size_t k, std::size_t nargs) const {
    const detail::ResolvedSpec& spec = in_[in_.size() == 1 ? 0 : k];
    if constexpr (!detail::is_tree_v<std::remove_cvref_t<Arg>>) {
      if (in_count_ == nargs && spec.splits)
        detail::raise_spec_splits_non_tensor(options_.name, k, detail::leaf_dtype<Arg>());
    } else {
      auto fn = [&](const auto& leaf, const detail::LeafPath& path) {
        using L = std::remove_cvref_t<decltype(leaf)>;
        const detail::Shape shape = detail::leaf_shape(leaf);
        if (spec.entries > shape.rank)
          detail::raise_spec_rank(options_.name, "in_specs", in_.size() == 1 ? 0 : k, spec.entries,
                                  path.str(), detail::leaf_dtype<L>(), shape);
      };
      detail::for_each_leaf(arg, detail::LeafPath{nullptr, k}, fn);
    }
  }
  template <class R, std::size_t K>
  void check_out() const {
    const std::size_t k = out_resolved_.size() == 1 ? 0 : K;
    constexpr int rank = detail::output_rank<R, K>();
    if (out_resolved_[k].entries > rank)
      detail::raise_spec_rank(options_.name, "out_specs", k, out_resolved_[k].entries,
                              "output " + std::to_string(K), nullptr, detail::Shape{rank, {}});
  }

  F kernel_;
  Mesh mesh_;
  std::size_t in_count_, out_count_;
  ShardOptions options_;
  std::vector<detail::AxisBinding> axes_;
  std::vector<detail::ResolvedSpec> in_, out_resolved_;
  detail::ShardOutSpecs out_;
  std::exception_ptr spec_error_;
  mutable detail::TeamCache cache_;
};

/// @brief Maps `kernel` over the blocks of its arguments split across `mesh` (SPEC 9).
///
/// in_specs: one PartitionSpec per positional argument, or one for every argument;
/// out_specs: one per output, or one for every output.
///
/// Example: a batch of 1001 rows on every device of a 2-device mesh:
/// @code
///   pmap::Mesh mesh({{"batch", 2}});
///   Eigen::Tensor<float, 2, Eigen::RowMajor> xs(1001, 8);
///   xs.setRandom();
///   auto f = pmap::shard_map([](auto x) { return pmap::eval(x * 2.f); }, mesh,
///                            {pmap::P("batch")}, {pmap::P("batch")});
///   Eigen::Tensor<float, 2, Eigen::RowMajor> y = f(xs);   // blocks of 501 and 500 rows
/// @endcode
template <class F>
auto shard_map(F&& kernel, const Mesh& mesh, std::vector<PartitionSpec> in_specs,
               std::vector<PartitionSpec> out_specs, ShardOptions options = {}) {
  return ShardMapped<std::decay_t<F>>(std::forward<F>(kernel), mesh, std::move(in_specs),
                                      std::move(out_specs), std::move(options));
}

/// @brief This process's *process block* of `global` (SPEC 13): the part of a tensor that
/// `spec` splits over `mesh` which this process's devices hold, i.e. what each process
/// passes to a shard_map over a mesh across processes (JAX:
/// `multihost_utils.global_array_to_host_local_array`). A copy of `global` on one process,
/// or where `spec` names no axis that spans processes. NameError for an axis the mesh lacks;
/// ValueError where `spec` has more entries than `global` dimensions, the mesh does not span
/// every process's devices in id order, or this process's blocks are not contiguous.
///
/// Example: 2 processes of 2 devices, 1001 rows over the 4 devices (blocks 251, 250, 250,
/// 250): process 0 gets rows [0, 501), process 1 rows [501, 1001).
/// @code
///   pmap::Mesh mesh({{"proc", pmap::process_count()}, {"x", pmap::local_device_count()}});
///   Eigen::Tensor<float, 2, Eigen::RowMajor> xs(1001, 8);   // the same on every process
///   xs.setRandom();
///   auto mine = pmap::process_block(xs, mesh, pmap::P(std::vector<std::string>{"proc", "x"}));
/// @endcode
template <class T, int R, int Layout, class Index>
Eigen::Tensor<T, R, Layout, Index> process_block(const Eigen::Tensor<T, R, Layout, Index>& global,
                                                 const Mesh& mesh, const PartitionSpec& spec) {
  using L = Eigen::Tensor<T, R, Layout, Index>;
  const detail::Block b =
      detail::process_block_of(mesh, spec, detail::leaf_shape(global), detail::leaf_dtype<L>());
  Eigen::array<Index, R> offsets{}, extents{};
  for (int d = 0; d < R; ++d) {
    offsets[static_cast<std::size_t>(d)] = static_cast<Index>(b.start[static_cast<std::size_t>(d)]);
    extents[static_cast<std::size_t>(d)] = static_cast<Index>(b.extent.dims[static_cast<std::size_t>(d)]);
  }
  return global.slice(offsets, extents);
}

}  // namespace pmap
