// Collective matmul: C = A @ B with A's row blocks on the devices, computed two ways.
//
//   ring:       device i holds row block i of A and row block i of B. At each of n steps it
//               multiplies the column slice of its A block that matches the B block it holds
//               (B block j pairs with columns [j kb, (j+1) kb) of A), adds the product into
//               its C block, and passes the B block to its left neighbour by ppermute. After
//               n steps every B block has visited every device, and no device ever held
//               more than one block of B: the memory of all_gather's B is never needed.
//   all_gather: every device gathers all of B (all_gather, tiled), then does one product.
//
// Both are the kind of kernel JAX's shard_map collective-matmul examples write; here each
// product is an Eigen Core GEMM on Eigen::Map views of the blocks, single-threaded inside
// its device (EIGEN_DONT_PARALLELIZE: the devices are the parallelism, and an Eigen product
// that opened its own OpenMP team inside a oneTBB worker would oversubscribe the cores).
//
// The check: both results against the serial product A @ B, and against each other, within a
// rigorous rounding bound (see within_bound), so the check is exact about what floating
// point allows and never flaky.
//
//   pmap_ring_matmul [--size N] [--dtype float32|float64] [--devices D] [--threads T]
//
// A and B are N x N (uniform in [-1, 1]); N must be a multiple of D, since every device
// passes a B block of the same shape around the ring. Defaults: N = 1024, float32, D = 8
// devices on T = 2 threads.
#define EIGEN_DONT_PARALLELIZE  // before any Eigen include

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include <pmap/pmap.hpp>

#include "common.hpp"

namespace {

using Eigen::Index;
using examples::milliseconds;
template <class T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Tensor2 = Eigen::Tensor<T, 2, Eigen::RowMajor>;

/// A RowMajor matrix view of a rank-2 block (a kernel's TensorMap or a gathered tensor).
template <class T, class Block>
Eigen::Map<const Matrix<T>> as_matrix(const Block& block) {
  return {block.data(), block.dimension(0), block.dimension(1)};
}

/// (source, destination) pairs that send every device's value to its left neighbour, so that
/// at step s device i holds B block (i + s) mod n.
std::vector<std::pair<int, int>> to_left(int n) {
  std::vector<std::pair<int, int>> perm;
  for (int i = 0; i < n; ++i) perm.emplace_back(i, (i + n - 1) % n);
  return perm;
}

/// The ring: n steps of one block product and one ppermute of the B block held.
template <class T>
auto ring_matmul(const pmap::Mesh& mesh) {
  return pmap::shard_map(
      [](pmap::Context& ctx, auto a, auto b) {
        const int n = ctx.axis_size("x");
        const int me = ctx.axis_index("x");
        const auto perm = to_left(n);
        const auto a_block = as_matrix<T>(a);  // [M / n, K], zero-copy
        const Index kb = b.dimension(0);       // K / n rows of B per block
        Matrix<T> held = as_matrix<T>(b);      // the B block this device holds now
        Matrix<T> c = Matrix<T>::Zero(a_block.rows(), held.cols());
        for (int s = 0; s < n; ++s) {
          const Index j = (me + s) % n;
          c.noalias() += a_block.middleCols(j * kb, kb) * held;
          if (s + 1 == n) break;                      // the last block needs no passing on
          auto next = ctx.ppermute(held, "x", perm);  // a Matrix<T>, like held (SPEC 10)
          held = std::move(next);
        }
        return c;
      },
      mesh, {pmap::P("x")}, {pmap::P("x")});
}

/// The all_gather form: one collective for all of B, then one product per device.
template <class T>
auto gather_matmul(const pmap::Mesh& mesh) {
  return pmap::shard_map(
      [](pmap::Context& ctx, auto a, auto b) {
        // Rank-changing collectives take tensors (not Core matrices): b is the kernel's
        // TensorMap, and tiled concatenates the K / n row blocks into B's K rows.
        auto b_full = ctx.all_gather(b, "x", 0, pmap::tiled);
        Matrix<T> c = as_matrix<T>(a) * as_matrix<T>(b_full);
        return c;
      },
      mesh, {pmap::P("x")}, {pmap::P("x")});
}

/// Whether `got` (`what`) has the serial product's shape and matches it as closely as rounding
/// guarantees (examples::product_within_bound; a ring step chains kb products and additions
/// inside a block and n accumulations into C, kb + n <= K + 1 roundings); else says where not.
template <class T>
bool within_bound(const char* what, const Tensor2<T>& got, const Matrix<T>& want,
                  const Eigen::MatrixXd& mag, Index k, double* worst_ratio) {
  if (got.dimension(0) != want.rows() || got.dimension(1) != want.cols()) {
    std::fprintf(stderr, "ring_matmul: %s: C is %ldx%ld against %ldx%ld\n", what,
                 static_cast<long>(got.dimension(0)), static_cast<long>(got.dimension(1)),
                 static_cast<long>(want.rows()), static_cast<long>(want.cols()));
    return false;
  }
  return examples::product_within_bound<T>("ring_matmul", what, as_matrix<T>(got), want, mag, k,
                                           worst_ratio);
}

struct Args {
  long size = 1024;
  bool f64 = false;
  int devices = 8;
  int threads = 2;
};

Args parse(int argc, char** argv) {
  examples::Flags flags(argc, argv,
                        "[--size N] [--dtype float32|float64] [--devices D] [--threads T]");
  Args a;
  a.size = static_cast<long>(flags.integer("--size", a.size));
  const std::string dtype = flags.text("--dtype", "float32");
  a.devices = static_cast<int>(flags.integer("--devices", a.devices));
  a.threads = static_cast<int>(flags.integer("--threads", a.threads));
  flags.done();
  flags.require(dtype == "float32" || dtype == "float64", "--dtype is float32 or float64");
  a.f64 = dtype == "float64";
  flags.require(a.size >= 1 && a.devices >= 1 && a.threads >= 1 && a.size % a.devices == 0,
                "need --size a positive multiple of --devices, and positive counts");
  return a;
}

template <class T>
int run(const Args& args) {
  pmap::Runtime rt({.num_devices = args.devices, .num_threads = args.threads});
  const pmap::Mesh mesh({{"x", args.devices}}, &rt);
  const Index n = args.size;
  Tensor2<T> a(n, n), b(n, n);
  a.setRandom();  // uniform in [-1, 1], the same numbers every run
  b.setRandom();

  auto ring = ring_matmul<T>(mesh);
  auto gather = gather_matmul<T>(mesh);
  // The first calls start the workers and fault the results' pages in; the times reported
  // are of second calls into the same results, as in a loop.
  Tensor2<T> c_ring = ring(a, b);
  Tensor2<T> c_gather = gather(a, b);
  const double t_ring = milliseconds([&] { ring.into(c_ring, a, b); });
  const double t_gather = milliseconds([&] { gather.into(c_gather, a, b); });
  Matrix<T> want;
  const double t_serial = milliseconds([&] { want.noalias() = as_matrix<T>(a) * as_matrix<T>(b); });

  const Eigen::MatrixXd mag = as_matrix<T>(a).template cast<double>().cwiseAbs() *
                              as_matrix<T>(b).template cast<double>().cwiseAbs();
  double worst = 0;
  const Matrix<T> gathered = as_matrix<T>(c_gather);
  if (!within_bound("ring against the serial product", c_ring, want, mag, n, &worst) ||
      !within_bound("all_gather against the serial product", c_gather, want, mag, n, &worst) ||
      !within_bound("ring against all_gather", c_ring, gathered, mag, n, &worst))
    return 1;
  std::printf(
      "ring_matmul: C = A @ B, %ldx%ld %s on %d devices / %d threads: ring (ppermute) "
      "%.0f ms, all_gather %.0f ms, serial %.0f ms; all three agree, the worst difference "
      "%.2g of the rounding bound\n",
      static_cast<long>(n), static_cast<long>(n), args.f64 ? "float64" : "float32", args.devices,
      args.threads, t_ring, t_gather, t_serial, worst);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  return args.f64 ? run<double>(args) : run<float>(args);
}
