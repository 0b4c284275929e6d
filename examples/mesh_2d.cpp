// One linear layer Y = X @ W on a data x model mesh of devices (pmap::Mesh with axes
// {"data", D} and {"model", M}), in the two layouts of tensor-parallel training (Megatron-LM's
// column- and row-parallel linear layers), each a shard_map:
//
//   column-sharded:      X split by rows over data, W by columns over model. Device (d, m)
//                        holds all of the contraction dimension, so its [rows, cols] block of
//                        Y is one local product: no communication.
//   contraction-sharded: X split by rows over data and by columns over model, W by rows over
//                        model. Device (d, m) multiplies its block of X (row block d, column
//                        block m) by row block m of W: the two K blocks m match, since both
//                        split K over model by the same rule. The partial products are
//                        summed with psum over "model" only (the M devices that share a data
//                        index), never over "data". The sum is the same on every model
//                        device, so Y is replicated along model: its out_spec names data
//                        alone, and shard_map checks that the model devices agree.
//
// The first layout's output is split exactly as the second one's input is, which is why a
// two-layer block (column-sharded, then contraction-sharded) needs one psum in all. Sizes need
// not divide by D or M: shard_map splits unevenly (SPEC 9). Each device's product is an Eigen
// Tensor contraction of its blocks, on one thread (the devices are the parallelism).
//
// The check: both results against the serial product X @ W, within a rigorous rounding bound
// (see within_bound), so the check is exact about what floating point allows and never flaky.
//
//   pmap_mesh_2d [--size N] [--data D] [--model M] [--threads T]
//
// X and W are N x N float32 (uniform in [-1, 1]); the runtime has D * M devices. Defaults:
// N = 1024, a 2 x 4 mesh, T = 2 threads.
#define EIGEN_DONT_PARALLELIZE  // before any Eigen include

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include <Eigen/Core>

#include <pmap/pmap.hpp>

#include "common.hpp"

namespace {

using Eigen::Index;
using examples::milliseconds;
using Tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Contract dimension 1 of the left operand with dimension 0 of the right: a matrix product.
const Eigen::array<Eigen::IndexPair<int>, 1> kProduct{Eigen::IndexPair<int>(1, 0)};

/// Y = X @ W with W's columns split over model: a local product per device.
auto column_sharded(const pmap::Mesh& mesh) {
  return pmap::shard_map(
      // x: [N / D, K], w: [K, N / M]. The contraction of the kernel's own views is returned
      // as an expression: pmap evaluates it into this device's block of Y (SPEC 2.2).
      [](auto x, auto w) { return x.contract(w, kProduct); }, mesh,
      {pmap::P("data", pmap::none), pmap::P(pmap::none, "model")}, {pmap::P("data", "model")});
}

/// Y = X @ W with the contraction dimension K split over model: partial products and a psum.
auto contraction_sharded(const pmap::Mesh& mesh) {
  return pmap::shard_map(
      // x: [N / D, K / M], w: [K / M, N]; the sum of the M partial products is this data
      // block's rows of Y, returned as the owning tensor psum gives.
      [](pmap::Context& ctx, auto x, auto w) { return ctx.psum(x.contract(w, kProduct), "model"); },
      mesh, {pmap::P("data", "model"), pmap::P("model", pmap::none)}, {pmap::P("data")});
}

/// A RowMajor matrix view of a rank-2 tensor.
Eigen::Map<const Matrix> as_matrix(const Tensor2& t) {
  return {t.data(), t.dimension(0), t.dimension(1)};
}

/// Whether `got` has the serial product's shape and matches it as closely as rounding
/// guarantees (examples::product_within_bound; the psum over model adds the M partial sums,
/// K / M + M <= K + 1 roundings in a chain); else says where it does not.
bool within_bound(const char* what, const Tensor2& got, const Matrix& want,
                  const Eigen::MatrixXd& mag, Index k, double* worst_ratio) {
  if (got.dimension(0) != want.rows() || got.dimension(1) != want.cols()) {
    std::fprintf(stderr, "mesh_2d: %s: Y is %ldx%ld, the serial product %ldx%ld\n", what,
                 static_cast<long>(got.dimension(0)), static_cast<long>(got.dimension(1)),
                 static_cast<long>(want.rows()), static_cast<long>(want.cols()));
    return false;
  }
  return examples::product_within_bound<float>("mesh_2d", what, got, want, mag, k, worst_ratio);
}

struct Args {
  long size = 1024;
  int data = 2;
  int model = 4;
  int threads = 2;
};

Args parse(int argc, char** argv) {
  examples::Flags flags(argc, argv, "[--size N] [--data D] [--model M] [--threads T]");
  Args a;
  a.size = static_cast<long>(flags.integer("--size", a.size));
  a.data = static_cast<int>(flags.integer("--data", a.data));
  a.model = static_cast<int>(flags.integer("--model", a.model));
  a.threads = static_cast<int>(flags.integer("--threads", a.threads));
  flags.done();
  flags.require(a.size >= 1 && a.data >= 1 && a.model >= 1 && a.threads >= 1,
                "need a positive --size, --data, --model and --threads");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  pmap::Runtime rt({.num_devices = args.data * args.model, .num_threads = args.threads});
  const pmap::Mesh mesh({{"data", args.data}, {"model", args.model}}, &rt);
  const Index n = args.size;
  Tensor2 x(n, n), w(n, n);
  x.setRandom();  // uniform in [-1, 1], the same numbers every run
  w.setRandom();

  auto by_columns = column_sharded(mesh);
  auto by_contraction = contraction_sharded(mesh);
  // The first calls start the workers and fault the results' pages in; the times reported
  // are of second calls into the same results, as in a loop.
  Tensor2 y_columns = by_columns(x, w);
  Tensor2 y_contraction = by_contraction(x, w);
  const double t_columns = milliseconds([&] { by_columns.into(y_columns, x, w); });
  const double t_contraction = milliseconds([&] { by_contraction.into(y_contraction, x, w); });
  Matrix want;
  const double t_serial = milliseconds([&] { want.noalias() = as_matrix(x) * as_matrix(w); });

  const Eigen::MatrixXd mag =
      as_matrix(x).cast<double>().cwiseAbs() * as_matrix(w).cast<double>().cwiseAbs();
  double worst = 0;
  if (!within_bound("column-sharded", y_columns, want, mag, n, &worst) ||
      !within_bound("contraction-sharded", y_contraction, want, mag, n, &worst))
    return 1;
  std::printf(
      "mesh_2d: Y = X @ W, %ldx%ld float32 on a %d x %d (data x model) mesh / %d "
      "threads: column-sharded %.0f ms, contraction-sharded with psum over model %.0f "
      "ms, serial %.0f ms; both agree with the serial product, the worst difference %.2g "
      "of the rounding bound\n",
      static_cast<long>(n), static_cast<long>(n), args.data, args.model, args.threads, t_columns,
      t_contraction, t_serial, worst);
  return 0;
}
