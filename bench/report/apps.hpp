/// @file apps.hpp
/// @brief The per-block math of pmap-bench's application workloads (batched_solve,
/// mlp_step), written once and called by the shard_map kernels and by their OpenMP baselines
/// alike: the two implementations differ only in how the blocks are dispatched and how the
/// per-block results are combined.
///
/// Every product here is an Eigen Core product, which opens an OpenMP team of its own when
/// it runs outside one (the translation unit is built with -fopenmp) unless
/// EIGEN_DONT_PARALLELIZE is defined: inside a oneTBB worker it would, inside an OpenMP
/// region it would not, and the comparison would measure that. Hence the check below.
///
/// Thread safety: every function may run on several threads at once, on disjoint outputs and
/// disjoint workspaces.
#pragma once

#if !defined(EIGEN_DONT_PARALLELIZE)
#error "bench/report/apps.hpp needs EIGEN_DONT_PARALLELIZE before the first Eigen include"
#endif

#include <algorithm>
#include <cmath>

#include <Eigen/Core>
#include <Eigen/LU>

namespace pmap::report {

// ---- batched_solve ---------------------------------------------------------------------------

/// @brief One system's matrix: n x n, RowMajor as the [B, n, n] batch stores it.
using SolveMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// @brief The factorisation of one system; construct it with n and reuse it across the
/// systems of a block (after the first, compute() allocates nothing).
using SolveLU = Eigen::PartialPivLU<SolveMatrix>;

/// @brief Solves a x = r for one n x n system (a: n * n doubles, RowMajor; r, x: n doubles).
inline void solve_system(SolveLU& lu, const double* a, const double* r, double* x, Eigen::Index n) {
  lu.compute(Eigen::Map<const SolveMatrix>(a, n, n));
  Eigen::Map<Eigen::VectorXd>(x, n) = lu.solve(Eigen::Map<const Eigen::VectorXd>(r, n));
}

/// @brief Fills a batch of `batch` well-conditioned systems: a [batch, n, n] uniform in
/// [-1, 1] plus n on the diagonal (diagonally dominant), r [batch, n] uniform in [-1, 1].
inline void solve_problem(double* a, double* r, Eigen::Index batch, Eigen::Index n) {
  Eigen::Map<Eigen::VectorXd>(a, batch * n * n).setRandom();
  Eigen::Map<Eigen::VectorXd>(r, batch * n).setRandom();
  for (Eigen::Index s = 0; s < batch; ++s)
    for (Eigen::Index i = 0; i < n; ++i) a[(s * n + i) * n + i] += static_cast<double>(n);
}

/// @brief max over the batch of |a x - r| / max(1, |r|) (infinity norms).
inline double solve_residual(const double* a, const double* r, const double* x, Eigen::Index batch,
                             Eigen::Index n) {
  double worst = 0;
  for (Eigen::Index s = 0; s < batch; ++s) {
    const Eigen::Map<const SolveMatrix> as(a + s * n * n, n, n);
    const Eigen::Map<const Eigen::VectorXd> rs(r + s * n, n), xs(x + s * n, n);
    const double scale = std::max(1.0, rs.lpNorm<Eigen::Infinity>());
    worst = std::max(worst, (as * xs - rs).lpNorm<Eigen::Infinity>() / scale);
  }
  return worst;
}

// ---- mlp_step --------------------------------------------------------------------------------

/// The model: pred = relu(x W1 + b1) W2 + b2, x of kMlpIn features, kMlpHidden hidden units,
/// one output; loss = mean over the batch of (pred - y)^2 / 2; one SGD step of kMlpRate.
inline constexpr Eigen::Index kMlpIn = 64;
inline constexpr Eigen::Index kMlpHidden = 256;
inline constexpr float kMlpRate = 0.01f;
/// The parameters as one flat vector: W1 [kMlpIn, kMlpHidden] RowMajor, b1 [kMlpHidden],
/// W2 [kMlpHidden] (its one column), b2. The gradient has the same layout.
inline constexpr Eigen::Index kMlpW1 = 0;
inline constexpr Eigen::Index kMlpB1 = kMlpW1 + kMlpIn * kMlpHidden;
inline constexpr Eigen::Index kMlpW2 = kMlpB1 + kMlpHidden;
inline constexpr Eigen::Index kMlpB2 = kMlpW2 + kMlpHidden;
inline constexpr Eigen::Index kMlpParams = kMlpB2 + 1;

/// @brief One block's scratch (one per device or per thread, kept across steps: after the
/// first step nothing is allocated).
struct MlpWork {
  Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> a;   ///< activations
  Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> da;  ///< their grad
  Eigen::VectorXf e;  ///< weight * (pred - y), per row
};

/// @brief The gradient, into grad[kMlpParams], of `weight` times the sum over the block's
/// `rows` rows (x [rows, kMlpIn] RowMajor, y [rows]) of (pred - y)^2 / 2, at parameters
/// theta[kMlpParams]. With weight = blocks / batch, the mean over the blocks of these
/// gradients is the gradient of the batch's mean loss, whatever the block sizes (for even
/// blocks weight = 1 / rows: each block's gradient is that of its own mean loss).
inline void mlp_gradient(const float* theta, const float* x, const float* y, Eigen::Index rows,
                         float weight, float* grad, MlpWork& work) {
  using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Map<const RowMatrix> w1(theta + kMlpW1, kMlpIn, kMlpHidden);
  const Eigen::Map<const Eigen::RowVectorXf> b1(theta + kMlpB1, kMlpHidden);
  const Eigen::Map<const Eigen::VectorXf> w2(theta + kMlpW2, kMlpHidden);
  const float b2 = theta[kMlpB2];
  const Eigen::Map<const RowMatrix> xs(x, rows, kMlpIn);
  const Eigen::Map<const Eigen::VectorXf> ys(y, rows);
  // Forward.
  work.a.resize(rows, kMlpHidden);
  work.a.noalias() = xs * w1;
  work.a.rowwise() += b1;
  work.a = work.a.cwiseMax(0.f);
  work.e.resize(rows);
  work.e.noalias() = work.a * w2;
  work.e = weight * (work.e.array() + b2 - ys.array()).matrix();
  // Backward.
  Eigen::Map<Eigen::VectorXf>(grad + kMlpW2, kMlpHidden).noalias() = work.a.transpose() * work.e;
  grad[kMlpB2] = work.e.sum();
  work.da.resize(rows, kMlpHidden);
  work.da.noalias() = work.e * w2.transpose();
  work.da = (work.a.array() > 0.f).select(work.da.array(), 0.f).matrix();
  Eigen::Map<RowMatrix>(grad + kMlpW1, kMlpIn, kMlpHidden).noalias() = xs.transpose() * work.da;
  Eigen::Map<Eigen::RowVectorXf>(grad + kMlpB1, kMlpHidden) = work.da.colwise().sum();
}

/// @brief A problem: theta[kMlpParams] (W scaled by 1 / sqrt(fan-in), b = 0),
/// x [batch, kMlpIn] uniform in [-1, 1], y [batch] = sin(sum of x's row).
inline void mlp_problem(float* theta, float* x, float* y, Eigen::Index batch) {
  Eigen::Map<Eigen::VectorXf> params(theta, kMlpParams);
  params.setRandom();
  params.segment(kMlpW1, kMlpIn * kMlpHidden) /= std::sqrt(static_cast<float>(kMlpIn));
  params.segment(kMlpB1, kMlpHidden).setZero();
  params.segment(kMlpW2, kMlpHidden) /= std::sqrt(static_cast<float>(kMlpHidden));
  params(kMlpB2) = 0.f;
  Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> xs(x, batch,
                                                                                       kMlpIn);
  xs.setRandom();
  Eigen::Map<Eigen::VectorXf>(y, batch) = xs.rowwise().sum().array().sin().matrix();
}

}  // namespace pmap::report
