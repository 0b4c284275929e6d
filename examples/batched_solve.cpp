// A batch of small dense linear systems A_s x_s = b_s (s < B), solved with one
// Eigen::PartialPivLU per system and split over the devices by shard_map: A is a [B, n, n]
// tensor, b a [B, n] one, both split P("batch") along their first dimension. B need not
// divide by the device count: shard_map cuts a dimension of size B over k devices into
// blocks of B / k + (d < B % k ? 1 : 0) systems (SPEC 9), so with the default B = 1001 on 8
// devices, device 0 solves 126 systems and the others 125; with fewer systems than devices,
// some blocks are empty. Each device factorises and solves the systems of its block, reusing
// one LU workspace, and writes its block of x; `into` places the blocks into a caller-owned
// [B, n] result, the way a solver called in a loop would reuse its output buffer.
//
// The kernel also returns how many systems it solved (a [1] block per device, so a [D]
// result), and the program checks those counts against the formula above.
//
// The check: x against a serial loop that solves the same systems with the same function;
// it is the same code on the same bytes, so the results must be bit-identical. And the
// backward error of every system (see backward_error), which says the solve is right
// independently of the reference.
//
// Under `mpirun -np P` the mesh spans the D devices of each of the P processes: each process
// passes the systems its devices' blocks cover (its process block, SPEC 13) and checks its
// block of x the same way.
//
//   pmap_batched_solve [--size B] [--n N] [--devices D] [--threads T]
//
// Defaults: B = 1001 systems of N = 96 unknowns (float64), D = 8 devices on T = 2 threads
// (per process).
#define EIGEN_DONT_PARALLELIZE  // before any Eigen include: the devices are the parallelism

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <tuple>
#include <utility>

#include <Eigen/Core>
#include <Eigen/LU>

#include <pmap/distributed.hpp>
#include <pmap/pmap.hpp>

#include "common.hpp"

namespace {

using Eigen::Index;
using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Systems = Eigen::Tensor<double, 3, Eigen::RowMajor>;  // [B, n, n]
using Vectors = Eigen::Tensor<double, 2, Eigen::RowMajor>;  // [B, n]
using Counts = Eigen::Tensor<int, 1, Eigen::RowMajor>;      // [D]

/// Solves one system: a is n x n (RowMajor, as the [B, n, n] batch stores it), r and x hold
/// n values. The kernel and the serial reference both call it, on the same bytes.
void solve_system(Eigen::PartialPivLU<Matrix>& lu, const double* a, const double* r, double* x,
                  Index n) {
  lu.compute(Eigen::Map<const Matrix>(a, n, n));
  Eigen::Map<Eigen::VectorXd>(x, n) = lu.solve(Eigen::Map<const Eigen::VectorXd>(r, n));
}

/// Every device solves the systems of its block: a is [rows, n, n], r is [rows, n] (zero-copy
/// views of the caller's tensors; rows may be 0). Returns the [rows, n] block of x, and the
/// block's size as a [1] block of the per-device counts.
auto batched_solver(const pmap::Mesh& mesh) {
  return pmap::shard_map(
      [](auto a, auto r) {
        const Index rows = a.dimension(0), n = a.dimension(1);
        Vectors x(rows, n);
        // One factorisation workspace for the block: after the first, compute() allocates
        // nothing.
        Eigen::PartialPivLU<Matrix> lu(n);
        for (Index s = 0; s < rows; ++s)
          solve_system(lu, a.data() + s * n * n, r.data() + s * n, x.data() + s * n, n);
        Counts count(1);
        count(0) = static_cast<int>(rows);
        return std::make_tuple(std::move(x), std::move(count));
      },
      mesh, {pmap::P("batch")}, {pmap::P("batch"), pmap::P("batch")});
}

/// B well-conditioned systems that still need pivoting: each matrix is uniform in [-1, 1] with
/// n added to its diagonal (diagonally dominant, so its condition number is small), then its
/// rows are shuffled, so the dominant entry of a column is rarely on the diagonal and partial
/// pivoting has to find it. A fixed seed: the same systems every run.
std::pair<Systems, Vectors> make_systems(Index batch, Index n) {
  std::mt19937_64 gen(20240601);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  Systems a(batch, n, n);
  Vectors r(batch, n);
  Matrix m(n, n);
  for (Index s = 0; s < batch; ++s) {
    for (Index i = 0; i < n; ++i)
      for (Index j = 0; j < n; ++j)
        m(i, j) = uniform(gen) + (i == j ? static_cast<double>(n) : 0.0);
    for (Index i = n - 1; i > 0; --i)  // Fisher-Yates over the rows
      m.row(i).swap(m.row(std::uniform_int_distribution<Index>(0, i)(gen)));
    Eigen::Map<Matrix>(a.data() + s * n * n, n, n) = m;
    for (Index i = 0; i < n; ++i) r(s, i) = uniform(gen);
  }
  return {std::move(a), std::move(r)};
}

/// The normwise backward error of system s, ||A x - b|| / (||A|| ||x|| + ||b||) (infinity
/// norms): the relative size of the smallest change to A and b that makes x exact. LU with
/// partial pivoting solves (A + dA) x = b with |dA| <= gamma_3n |L||U| (Higham, "Accuracy and
/// Stability of Numerical Algorithms", 9.3), gamma_3n ~ 3 n u, u = eps / 2; pivoting puts each
/// shuffled row back where it dominates, the factors do not grow, and || |L||U| || stays a
/// small multiple of ||A||. kBackwardLimit allows 8 n eps = 16 n u; the worst error seen is
/// hundreds of times below it, while a wrong solution is off by O(1).
double backward_error(const Systems& a, const Vectors& r, const Vectors& x, Index s) {
  const Index n = a.dimension(1);
  const Eigen::Map<const Matrix> as(a.data() + s * n * n, n, n);
  const Eigen::Map<const Eigen::VectorXd> rs(r.data() + s * n, n), xs(x.data() + s * n, n);
  const double scale = as.cwiseAbs().rowwise().sum().maxCoeff() * xs.lpNorm<Eigen::Infinity>() +
                       rs.lpNorm<Eigen::Infinity>();
  return (as * xs - rs).lpNorm<Eigen::Infinity>() / scale;
}

constexpr double kBackwardLimit = 8.0 * std::numeric_limits<double>::epsilon();  // times n

struct Args {
  long size = 1001;
  long n = 96;
  int devices = 8;
  int threads = 2;
};

Args parse(int argc, char** argv) {
  examples::Flags flags(argc, argv, "[--size B] [--n N] [--devices D] [--threads T]");
  Args a;
  a.size = static_cast<long>(flags.integer("--size", a.size));
  a.n = static_cast<long>(flags.integer("--n", a.n));
  a.devices = static_cast<int>(flags.integer("--devices", a.devices));
  a.threads = static_cast<int>(flags.integer("--threads", a.threads));
  flags.done();
  flags.require(a.size >= 0 && a.n >= 1 && a.devices >= 1 && a.threads >= 1,
                "need --size >= 0 systems, --n >= 1 unknowns, and positive counts");
  return a;
}

/// Whether this process's devices (mesh positions first, first + 1, ...) solved the block
/// sizes SPEC 9 gives them; else says which differs.
bool counts_as_specified(const Counts& counts, long batch, int devices, int first) {
  for (int l = 0; l < counts.dimension(0); ++l) {
    const int d = first + l;
    const long want = batch / devices + (d < batch % devices ? 1 : 0);
    if (counts(l) != want) {
      std::fprintf(stderr, "batched_solve: device %d solved %d systems, its block has %ld\n", d,
                   counts(l), want);
      return false;
    }
  }
  return true;
}

/// Compares x with the serial solve, bit for bit, and bounds every backward error; returns
/// the worst backward error, or a negative value (after saying why) on a mismatch.
double check(const Systems& a, const Vectors& r, const Vectors& x) {
  const Index batch = a.dimension(0), n = a.dimension(1);
  Vectors want(batch, n);
  Eigen::PartialPivLU<Matrix> lu(n);
  for (Index s = 0; s < batch; ++s)
    solve_system(lu, a.data() + s * n * n, r.data() + s * n, want.data() + s * n, n);
  double worst = 0;
  for (Index s = 0; s < batch; ++s) {
    for (Index i = 0; i < n; ++i)
      if (x(s, i) != want(s, i)) {
        std::fprintf(stderr, "batched_solve: x[%ld][%ld] is %.17g, the serial solve gives %.17g\n",
                     static_cast<long>(s), static_cast<long>(i), x(s, i), want(s, i));
        return -1;
      }
    const double eta = backward_error(a, r, x, s);
    worst = std::max(worst, eta);
    if (!(eta <= kBackwardLimit * static_cast<double>(n))) {
      std::fprintf(stderr, "batched_solve: system %ld has backward error %.3g, above %.3g\n",
                   static_cast<long>(s), eta, kBackwardLimit * static_cast<double>(n));
      return -1;
    }
  }
  return worst;
}

/// The program proper, between initialize() and finalize(). Under mpirun the mesh spans
/// every process's devices (--devices each): every process makes the same systems, passes
/// the block of them its devices hold, and checks its block of x.
bool run(const Args& args) {
  pmap::Runtime rt({.num_devices = args.devices, .num_threads = args.threads});
  const int devices = rt.device_count(), local = rt.local_device_count();
  const pmap::Mesh mesh({{"batch", devices}}, &rt);
  auto solve = batched_solver(mesh);

  const auto [all_a, all_r] = make_systems(args.size, args.n);
  const Systems a = pmap::process_block(all_a, mesh, pmap::P("batch"));
  const Vectors r = pmap::process_block(all_r, mesh, pmap::P("batch"));
  Vectors x(a.dimension(0), args.n);
  Counts counts(local);
  solve.into(std::tie(x, counts), a, r);

  if (!counts_as_specified(counts, args.size, devices, rt.process_index() * local)) return false;
  const double worst = check(a, r, x);
  if (worst < 0) return false;
  if (rt.process_index() == 0)
    std::printf(
        "batched_solve: %ld systems of %ld unknowns (float64) on %d %s x %d devices / %d "
        "threads, blocks of %d to %d: bit-identical to the serial solve, worst backward error "
        "%.2g%s\n",
        args.size, args.n, rt.process_count(), rt.process_count() == 1 ? "process" : "processes", local, args.threads, counts(local - 1), counts(0),
        worst, rt.process_count() > 1 ? " (process 0's systems)" : "");
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
