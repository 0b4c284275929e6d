// Data-parallel training of a two-layer MLP, as jax.shard_map writes it: the batch is split
// over the devices of a one-axis mesh named "data" (in spec P("data")), the parameters are
// replicated (P()), and every step each device computes the gradients of its block, the
// devices average them with one pmean of the gradient tree (a std::tuple of Eigen matrices,
// the block's share of the loss riding along as one more leaf), and every device applies
// the same SGD update, returned replicated (out spec P(), checked bitwise by shard_map).
//
// The model: pred = relu(x W1 + b1) W2 + b2, x of kIn features, kHidden hidden units, one
// output; loss = mean over the batch of (pred - y)^2 / 2; full-batch gradient descent. The
// data are synthetic: x uniform in [-1, 1], y = sin(x.v) for a fixed random direction v.
//
// The check: the same gradient descent run serially on the whole batch must give the same
// loss at every step and the same final parameters, up to float rounding (see kLossTolerance
// for why it cannot be bitwise).
//
// Under `mpirun -np P` the mesh spans the D devices of each of the P processes: each process
// passes its rows of the batch (its process block, SPEC 13); the pmean spans the processes.
//
//   pmap_train_mlp [--size B] [--steps S] [--devices D] [--threads T]
//
// Defaults: a batch of B = 4096 rows, S = 100 steps, D = 8 devices on T = 2 threads (per
// process). The batch need not divide by D: shard_map gives the devices blocks of B / D or
// B / D + 1 rows.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include <pmap/distributed.hpp>
#include <pmap/pmap.hpp>

#include "common.hpp"

namespace {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vector = Eigen::RowVectorXf;
using MatrixView = Eigen::Map<const Matrix>;
using VectorView = Eigen::Map<const Vector>;
using Tensor1 = Eigen::Tensor<float, 1, Eigen::RowMajor>;
using Tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;

constexpr Eigen::Index kIn = 16;
constexpr Eigen::Index kHidden = 64;
constexpr float kRate = 0.1f;  // the SGD step: 0.2 already overshoots on this model and data

// Each step's loss must agree with the serial run to this relative tolerance, and each final
// parameter to kParamTolerance (relative to the largest parameter). The runs cannot agree
// bitwise: the serial run sums the gradient over all B rows in one matrix product, the
// sharded run sums each block's rows, then the pmean adds the D block sums, so every sum is
// associated differently. Each reassociation changes a float sum by a few units of float
// epsilon (6e-8) relative to the sum of its terms' magnitudes; gradient descent at a stable
// rate does not amplify such perturbations, and the rare ReLU whose input lies within
// rounding of 0, so that the runs disagree on its side, changes one row's share (1 / B) of
// the gradient. Measured (relative): the losses differ by 1e-6 at the defaults and at the
// ctest size, 4e-6 at 30,000 rows over 1,000 steps and 9e-6 at 500,000 rows (the rounding
// of a sum grows with its length); the parameters by 1e-7 after 100 steps and at most 1.4e-6
// in all these runs. The tolerances leave a margin of 10 to 100, while a real bug (a block
// dropped or counted twice, a weight off by 1 %) moves the loss by a percent or more from
// the first step.
constexpr double kLossTolerance = 1e-4;
constexpr double kParamTolerance = 1e-4;

/// The parameters, as the host holds them and shard_map returns them: W1 [kIn, kHidden],
/// b1 [kHidden], W2 [kHidden, 1], b2 [1].
using Params = std::tuple<Tensor2, Tensor1, Tensor2, Tensor1>;

/// The gradients of the four parameters, in the order of Params, then the loss. pmap's
/// collectives take a tuple of Eigen Core objects and scalars as one tree and return the
/// same types.
using Gradients = std::tuple<Matrix, Vector, Matrix, Vector, float>;

/// The parameters as Eigen Core matrices: the serial run's, and what the kernel returns.
using CoreParams = std::tuple<Matrix, Vector, Matrix, Vector>;

/// Read-only Eigen Core views of the four parameters.
struct Model {
  MatrixView w1;
  VectorView b1;
  MatrixView w2;
  VectorView b2;
};

/// The model's views over any four-leaf tree of contiguous parameters: the host's Params,
/// the kernel's tuple of TensorMaps of them, or the serial run's matrices.
template <class Tree>
Model model(const Tree& p) {
  return {MatrixView(std::get<0>(p).data(), kIn, kHidden),
          VectorView(std::get<1>(p).data(), kHidden), MatrixView(std::get<2>(p).data(), kHidden, 1),
          VectorView(std::get<3>(p).data(), 1)};
}

/// The gradients and the loss of `weight` * sum over the rows of (pred - y)^2 / 2, for the
/// rows x [rows, kIn], y [rows, 1]. With weight = D / B, the mean over the D blocks of these
/// is the batch's mean loss and its gradient, whatever the block sizes; with weight = 1 / B
/// on the whole batch it is the same thing serially. Kernel and serial run share this code.
Gradients gradients(const Model& m, MatrixView x, MatrixView y, float weight) {
  // Forward: the hidden activations a [rows, kHidden] and the weighted residuals e [rows, 1].
  Matrix a = x * m.w1;
  a.rowwise() += m.b1;
  a = a.cwiseMax(0.f);
  Matrix e = a * m.w2;
  e.array() += m.b2(0) - y.array();
  const float loss = 0.5f * weight * e.squaredNorm();
  e *= weight;
  // Backward, through the output layer and the ReLU.
  Matrix grad_w2 = a.transpose() * e;
  Vector grad_b2 = Vector::Constant(1, e.sum());
  Matrix da = e * m.w2.transpose();
  da = (a.array() > 0.f).select(da.array(), 0.f).matrix();
  Matrix grad_w1 = x.transpose() * da;
  Vector grad_b1 = da.colwise().sum();
  return {std::move(grad_w1), std::move(grad_b1), std::move(grad_w2), std::move(grad_b2), loss};
}

/// One SGD step from m with the (averaged) gradients g: the four new parameters.
template <class G>
CoreParams sgd(const Model& m, const G& g) {
  return {m.w1 - kRate * std::get<0>(g), m.b1 - kRate * std::get<1>(g),
          m.w2 - kRate * std::get<2>(g), m.b2 - kRate * std::get<3>(g)};
}

/// A [rows, cols] tensor as an Eigen Core matrix view.
MatrixView rows_of(const Tensor2& t) {
  return MatrixView(t.data(), t.dimension(0), t.dimension(1));
}

/// The synthetic problem: x [batch, kIn] uniform in [-1, 1], y = sin(x.v) with v a fixed
/// random direction, and He-initialised parameters. Seeded, so every run is the same.
struct Problem {
  Tensor2 x, y;
  Params params;
};

Problem make_problem(Eigen::Index batch) {
  std::mt19937 gen(2024);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::normal_distribution<float> normal(0.f, 1.f);
  Problem p{Tensor2(batch, kIn), Tensor2(batch, 1), {}};
  Eigen::VectorXf v(kIn);
  for (auto& c : v) c = normal(gen) * std::sqrt(3.f / kIn);  // x.v has unit variance
  for (Eigen::Index k = 0; k < p.x.size(); ++k) p.x.data()[k] = uniform(gen);
  const Eigen::VectorXf z = rows_of(p.x) * v;
  for (Eigen::Index r = 0; r < batch; ++r) p.y(r, 0) = std::sin(z(r));
  auto& [w1, b1, w2, b2] = p.params;
  w1 = Tensor2(kIn, kHidden);
  w2 = Tensor2(kHidden, 1);
  b1 = Tensor1(kHidden);
  b2 = Tensor1(1);
  // He initialisation for inputs of variance 1/3: Var(W1) = 2 / (kIn / 3).
  for (Eigen::Index k = 0; k < w1.size(); ++k) w1.data()[k] = normal(gen) * std::sqrt(6.f / kIn);
  for (Eigen::Index k = 0; k < w2.size(); ++k)
    w2.data()[k] = normal(gen) * std::sqrt(1.f / kHidden);
  b1.setZero();
  b2.setZero();
  return p;
}

/// The reference: the same gradient descent on the whole batch in one thread. Returns the
/// loss before each step and leaves the final parameters in `out`.
std::vector<float> serial_train(const Problem& p, int steps, CoreParams& out) {
  const Model m0 = model(p.params);
  out = {m0.w1, m0.b1, m0.w2, m0.b2};
  std::vector<float> losses;
  const float weight = 1.f / static_cast<float>(p.x.dimension(0));
  for (int s = 0; s < steps; ++s) {
    const Model m = model(out);
    const Gradients g = gradients(m, rows_of(p.x), rows_of(p.y), weight);
    losses.push_back(std::get<4>(g));
    out = sgd(m, g);
  }
  return losses;
}

struct Args {
  long size = 4096;
  int steps = 100;
  int devices = 8;
  int threads = 2;
};

Args parse(int argc, char** argv) {
  examples::Flags flags(argc, argv, "[--size B] [--steps S] [--devices D] [--threads T]");
  Args a;
  a.size = static_cast<long>(flags.integer("--size", a.size));
  a.steps = static_cast<int>(flags.integer("--steps", a.steps));
  a.devices = static_cast<int>(flags.integer("--devices", a.devices));
  a.threads = static_cast<int>(flags.integer("--threads", a.threads));
  flags.done();
  flags.require(a.size >= 1 && a.steps >= 1 && a.devices >= 1 && a.threads >= 1,
                "need a positive --size, --steps, --devices and --threads");
  return a;
}

/// The largest difference between a parameter of the sharded run and the serial run's,
/// relative to the largest parameter.
double params_apart(const Params& got, const CoreParams& want) {
  const Model a = model(got), b = model(want);
  const double diff =
      std::max({(a.w1 - b.w1).lpNorm<Eigen::Infinity>(), (a.b1 - b.b1).lpNorm<Eigen::Infinity>(),
                (a.w2 - b.w2).lpNorm<Eigen::Infinity>(), (a.b2 - b.b2).lpNorm<Eigen::Infinity>()});
  const double scale = std::max({b.w1.lpNorm<Eigen::Infinity>(), b.b1.lpNorm<Eigen::Infinity>(),
                                 b.w2.lpNorm<Eigen::Infinity>(), b.b2.lpNorm<Eigen::Infinity>()});
  return diff / scale;
}

/// The check: the sharded run's losses and final parameters against the serial run's.
/// Says what differs on stderr; on success, the worst loss and parameter differences.
bool same_as_serial(const Problem& problem, const std::vector<float>& losses, const Params& params,
                    double& loss_apart, double& param_apart) {
  CoreParams want_params;
  const std::vector<float> want =
      serial_train(problem, static_cast<int>(losses.size()), want_params);
  loss_apart = 0;
  for (std::size_t s = 0; s < losses.size(); ++s) {
    const double apart = std::abs(losses[s] - want[s]) / std::abs(want[s]);
    loss_apart = std::max(loss_apart, apart);
    if (!(apart <= kLossTolerance)) {
      std::fprintf(stderr,
                   "train_mlp: the loss before step %zu is %.9g, serial gradient descent gives "
                   "%.9g\n",
                   s, static_cast<double>(losses[s]), static_cast<double>(want[s]));
      return false;
    }
  }
  param_apart = params_apart(params, want_params);
  if (!(param_apart <= kParamTolerance)) {
    std::fprintf(stderr,
                 "train_mlp: the final parameters differ from serial gradient descent's by %.3g "
                 "of the largest parameter\n",
                 param_apart);
    return false;
  }
  return true;
}

/// The program proper, between initialize() and finalize(). Under mpirun the mesh spans
/// every process's devices (--devices each): every process makes the same problem and passes
/// the rows of it that its devices hold; the parameters and losses come back replicated.
bool run(const Args& args) {
  pmap::Runtime rt({.num_devices = args.devices, .num_threads = args.threads});
  const int devices = rt.device_count();
  const pmap::Mesh mesh({{"data", devices}}, &rt);
  const Problem problem = make_problem(args.size);
  const Tensor2 x = pmap::process_block(problem.x, mesh, pmap::P("data"));
  const Tensor2 y = pmap::process_block(problem.y, mesh, pmap::P("data"));

  // One training step: the block's gradients, one pmean of the whole tree over "data", and
  // the same update on every device. weight = D / B makes the pmean the batch mean.
  const float weight = static_cast<float>(devices) / static_cast<float>(args.size);
  auto train_step = pmap::shard_map(
      [weight](pmap::Context& ctx, const auto& params, auto xb, auto yb) {
        const Model m = model(params);
        const MatrixView xs(xb.data(), xb.dimension(0), kIn), ys(yb.data(), yb.dimension(0), 1);
        const auto mean = ctx.pmean(gradients(m, xs, ys, weight), "data");
        return std::tuple_cat(sgd(m, mean), std::make_tuple(std::get<4>(mean)));
      },
      mesh, {pmap::P(), pmap::P("data"), pmap::P("data")}, {pmap::P()});

  // The training loop, as with a jitted JAX step: parameters in, new parameters out.
  Params params = problem.params;
  std::vector<float> losses;
  for (int s = 0; s < args.steps; ++s) {
    auto [w1, b1, w2, b2, loss] = train_step(params, x, y);
    params = Params{std::move(w1), std::move(b1), std::move(w2), std::move(b2)};
    losses.push_back(loss());
  }

  double loss_apart = 0, param_apart = 0;
  if (!same_as_serial(problem, losses, params, loss_apart, param_apart)) return false;
  if (rt.process_index() == 0)
    std::printf(
        "train_mlp: batch %ld, %d steps on %d %s x %d devices / %d threads: loss %.6f -> "
        "%.6f, equal to serial gradient descent (losses within %.1e, parameters within %.1e)\n",
        args.size, args.steps, rt.process_count(),
        rt.process_count() == 1 ? "process" : "processes", rt.local_device_count(), args.threads,
        static_cast<double>(losses.front()), static_cast<double>(losses.back()), loss_apart,
        param_apart);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  pmap::distributed::initialize();  // under mpirun: one mesh over every process's devices
  const bool ok = run(args);
  pmap::distributed::finalize();
  return ok ? 0 : 1;
}
