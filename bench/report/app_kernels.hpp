/// @file app_kernels.hpp
/// @brief The shard_maps of two application workloads, built once for pmap-bench's apps
/// group (bench/apps.cpp) and its runs under mpirun (mpi_apps.hpp): mlp_step's SGD step
/// and batched_solve's solver, each over a one-axis mesh "x".
///
/// Thread safety: building is not; the returned callables follow shard_map's rules.
#pragma once

#include <cstddef>
#include <vector>

#include <pmap/pmap.hpp>

#include "apps.hpp"

namespace pmap::report {

/// @brief One SGD step of apps.hpp's MLP: parameters replicated, the batch split, each
/// device the gradient of its block, one pmean of the flat gradient, and every device the
/// same update, returned replicated. `work` has a slot per device (scratch kept across
/// steps); `batch` is the global batch the gradient is averaged over.
inline auto mlp_stepper(const pmap::Mesh& mesh, std::vector<MlpWork>& work, Eigen::Index batch) {
  using Tensor1 = Eigen::Tensor<float, 1, Eigen::RowMajor>;
  const float weight = static_cast<float>(mesh.size()) / static_cast<float>(batch);
  return pmap::shard_map(
      [&work, weight](pmap::Context& ctx, auto params, auto xs, auto ys) {
        Tensor1 grad(kMlpParams);
        mlp_gradient(params.data(), xs.data(), ys.data(), xs.dimension(0), weight, grad.data(),
                     work[static_cast<std::size_t>(ctx.axis_index("x"))]);
        const Tensor1 mean = ctx.pmean(std::move(grad), "x");
        return pmap::eval(params - kMlpRate * mean);
      },
      mesh, {pmap::P(), pmap::P("x"), pmap::P("x")}, {pmap::P()});
}

/// @brief x = A^-1 r for a batch of systems (A [B, n, n], r [B, n]): each device solves the
/// systems of its block (zero-copy views) with one factorisation, into the [rows, n] block
/// it returns.
inline auto batch_solver(const pmap::Mesh& mesh) {
  return pmap::shard_map(
      [](auto a, auto r) {
        const Eigen::Index rows = a.dimension(0), n = a.dimension(1);
        Eigen::Tensor<double, 2, Eigen::RowMajor> x(rows, n);
        SolveLU lu(n);
        for (Eigen::Index s = 0; s < rows; ++s)
          solve_system(lu, a.data() + s * n * n, r.data() + s * n, x.data() + s * n, n);
        return x;
      },
      mesh, {pmap::P("x")}, {pmap::P("x")});
}

}  // namespace pmap::report
