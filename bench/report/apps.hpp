/// @file apps.hpp
/// @brief The per-block math of pmap-bench's application workloads (batched_solve,
/// mlp_step, heat_stencil, monte_carlo, ring_matmul), written once and called by the pmap and
/// shard_map kernels and by their OpenMP baselines alike: the two implementations differ only
/// in how the blocks are dispatched and how the per-block results are combined.
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
#include <cstdint>

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

// ---- heat_stencil ----------------------------------------------------------------------------

/// The explicit 1-D heat equation: r = alpha * dt / dx^2, stable below 0.5.
inline constexpr float kHeatR = 0.25f;

/// @brief One time step of a block of m >= 2 points, u[m] into next[m], with the points
/// just outside it (`left` of u[0], `right` of u[m - 1]): the same float expression for
/// every point whoever updates the block, so any split of a grid gives the same bits.
inline float heat_point(float l, float c, float r) { return c + kHeatR * ((l + r) - 2.f * c); }
/// @brief The points of a block (m >= 2) that need no halo: next[1, m - 1).
inline void heat_interior(const float* u, float* next, Eigen::Index m) {
  for (Eigen::Index k = 1; k + 1 < m; ++k) next[k] = heat_point(u[k - 1], u[k], u[k + 1]);
}
/// @brief The two points that need the halos `left` and `right`.
inline void heat_edges(const float* u, float left, float right, float* next, Eigen::Index m) {
  next[0] = heat_point(left, u[0], u[1]);
  next[m - 1] = heat_point(u[m - 2], u[m - 1], right);
}
inline void heat_block(const float* u, float left, float right, float* next, Eigen::Index m) {
  heat_interior(u, next, m);
  heat_edges(u, left, right, next, m);
}

/// @brief A grid of n points: a hot band, a cold band and a slope.
inline void heat_problem(float* u, Eigen::Index n) {
  for (Eigen::Index k = 0; k < n; ++k) {
    const float x = static_cast<float>(k) / static_cast<float>(n);
    u[k] = (x > 0.2f && x < 0.3f ? 100.f : 0.f) - (x > 0.6f && x < 0.65f ? 50.f : 0.f) + 10.f * x;
  }
}

// ---- monte_carlo -----------------------------------------------------------------------------

/// @brief A European call under geometric Brownian motion.
struct CallOption {
  double spot = 100, strike = 105, rate = 0.05, volatility = 0.2, years = 1;
};

/// @brief Sums over paths of the discounted payoff and of its square.
struct PayoffSums {
  double payoff = 0, squares = 0;
};

/// @brief The discounted payoffs of `paths` paths of random stream `stream`: a counter-based
/// generator (splitmix64 of stream and path number), so that a stream's numbers do not
/// depend on who draws them or in which order; one normal per path by Box-Muller.
inline PayoffSums call_payoffs(const CallOption& o, std::uint64_t stream, std::int64_t paths) {
  auto mix = [](std::uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  auto unit = [](std::uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1p-53; };
  const double drift = (o.rate - 0.5 * o.volatility * o.volatility) * o.years;
  const double spread = o.volatility * std::sqrt(o.years);
  const double discount = std::exp(-o.rate * o.years);
  PayoffSums sums;
  const std::uint64_t base = mix(stream);
  for (std::int64_t p = 0; p < paths; ++p) {
    const std::uint64_t key = mix(base + static_cast<std::uint64_t>(p));
    const double u1 = unit(key), u2 = unit(mix(key));
    const double z = std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    const double spot = o.spot * std::exp(drift + spread * z);
    const double payoff = discount * std::max(0.0, spot - o.strike);
    sums.payoff += payoff;
    sums.squares += payoff * payoff;
  }
  return sums;
}

// ---- ring_matmul -----------------------------------------------------------------------------

/// @brief One step of a collective matmul C = A B over d row blocks of r rows (n = d r):
/// c[r, n] += a[r, n] (the row block's columns of block j) times b[r, n] (row block j of B).
/// All RowMajor.
inline void ring_step(const float* a, const float* b, float* c, Eigen::Index r, Eigen::Index n,
                      Eigen::Index j) {
  using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Map<const RowMatrix> as(a, r, n), bs(b, r, n);
  Eigen::Map<RowMatrix>(c, r, n).noalias() += as.middleCols(j * r, r) * bs;
}

}  // namespace pmap::report
