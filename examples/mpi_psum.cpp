// The README's multi-process program ("Several machines: MPI"), complete: one pmap whose
// axis "i" spans the devices of every process, each device adding the psum over the whole
// axis to its own row. Launched under mpirun, each process owns --devices devices, global
// device ids run process after process, each process passes only its local rows
// [local devices, size] and gets back its local rows of the result. Started without mpirun
// (or built without MPI), it runs as one process that owns every device of the axis.
//
// The check, on every process: the inputs are known functions of the global device id,
// x_g(k) = (g + 1) (1 + k % 8) / 4, so each process computes what every row of the result
// must be, sum over all devices included, without seeing the other processes' data. The
// values are multiples of 1/4 below 2^22 (up to 2,000 devices), so every partial sum is
// exact in float and the check is exact whatever order the local reductions and
// MPI_Allreduce add in. Each device also returns its position on the axis, which must be
// its global device id.
//
//   mpirun -np P pmap_mpi_psum [--size N] [--devices D] [--threads T]
//   pmap_mpi_psum [--size N] [--devices D] [--threads T]
//
// Defaults: rows of N = 1,048,576 floats; D devices and T threads per process as the global
// runtime's ($PMAP_NUM_DEVICES and $PMAP_NUM_THREADS, else the hardware threads). Process 0
// prints the summary once all agree (by one more psum); a process that finds a mismatch
// says what differs, and every process then exits with 1.
#include <cstdio>
#include <cstdlib>
#include <tuple>

#include <pmap/pmap.hpp>

#include "common.hpp"

namespace {

using Rows = Eigen::Tensor<float, 2, Eigen::RowMajor>;

/// The input of global device g at column k (see the header for why these values).
float input(int g, Eigen::Index k) { return 0.25f * static_cast<float>((g + 1) * (1 + k % 8)); }

struct Args {
  long size = 1L << 20;
  int devices = 0;  // 0: $PMAP_NUM_DEVICES, else the hardware threads, as Runtime::global()
  int threads = 0;
};

Args parse(int argc, char** argv) {
  examples::Flags flags(argc, argv, "[--size N] [--devices D] [--threads T]");
  Args a;
  a.size = static_cast<long>(flags.integer("--size", a.size));
  a.devices = static_cast<int>(flags.integer("--devices", a.devices));
  a.threads = static_cast<int>(flags.integer("--threads", a.threads));
  flags.done();
  flags.require(a.size >= 1 && a.devices >= 0 && a.threads >= 0,
                "need a positive --size, and --devices and --threads of 0 or more");
  return a;
}

/// This process's check of its rows ys and axis positions of the result: row l belongs to
/// the process's l-th device, of global id g, and must be x_g + the sum of x over all
/// devices. Says what differs on stderr, naming the process.
bool check(const pmap::Runtime& rt, const Rows& ys,
           const Eigen::Tensor<int, 1, Eigen::RowMajor>& index) {
  const int total = rt.device_count();
  for (int l = 0; l < rt.local_device_count(); ++l) {
    const int g = rt.local_devices()[static_cast<std::size_t>(l)].id;
    if (index(l) != g) {
      std::fprintf(stderr,
                   "mpi_psum: process %d's device %d (global id %d) sits at position %d of "
                   "the axis\n",
                   rt.process_index(), l, g, index(l));
      return false;
    }
    for (Eigen::Index k = 0; k < ys.dimension(1); ++k) {
      // sum over g' of (g' + 1) (1 + k % 8) / 4 = total (total + 1) / 2 (1 + k % 8) / 4
      const double want =
          input(g, k) + 0.125 * total * (total + 1) * static_cast<double>(1 + k % 8);
      if (ys(l, k) != want) {
        std::fprintf(stderr,
                     "mpi_psum: process %d, device %d, column %ld: %.9g, but x + psum(x) of "
                     "the %d devices' inputs is %.9g\n",
                     rt.process_index(), g, static_cast<long>(k), static_cast<double>(ys(l, k)),
                     total, want);
        return false;
      }
    }
  }
  return true;
}

/// The number of processes whose check failed, the same on every process: one more psum,
/// of each process's failure counted on its first device. Process 0 then speaks for all.
int failures_everywhere(pmap::Runtime& rt, bool ok) {
  Eigen::Tensor<int, 1, Eigen::RowMajor> failed(rt.local_device_count());
  failed.setZero();
  failed(0) = ok ? 0 : 1;
  auto count = pmap::pmap([](pmap::Context& ctx, auto mine) { return ctx.psum(mine, "i"); },
                          pmap::out_axes(pmap::none), {.axis_name = "i", .runtime = &rt});
  return count(failed)();
}

/// The program proper, between initialize() and finalize(): the runtime, created after
/// initialize() so that it spans every process, must be gone before finalize().
bool run(const Args& args) {
  pmap::Runtime rt({.num_devices = args.devices, .num_threads = args.threads});
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto x) {
        return std::make_tuple(pmap::eval(x + ctx.psum(x, "i")), ctx.axis_index("i"));
      },
      {.axis_name = "i", .runtime = &rt});

  // Each process passes its local slice: [local_device_count(), size]. The axis spans every
  // process: its size is local_device_count() * process_count().
  Rows xs(rt.local_device_count(), args.size);
  for (int l = 0; l < rt.local_device_count(); ++l)
    for (Eigen::Index k = 0; k < args.size; ++k)
      xs(l, k) = input(rt.local_devices()[static_cast<std::size_t>(l)].id, k);
  const auto [ys, index] = f(xs);  // this process's rows of the result, and their positions

  const int failures = failures_everywhere(rt, check(rt, ys, index));
  if (rt.process_index() == 0 && failures == 0)
    std::printf(
        "mpi_psum: %d processes x %d devices / %d threads, rows of %ld floats: x + psum(x) "
        "over all %d devices is exact on every process\n",
        rt.process_count(), rt.local_device_count(), rt.num_threads(), args.size,
        rt.device_count());
  return failures == 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  pmap::distributed::initialize();  // MPI_Init_thread unless already done
  const bool ok = run(args);
  pmap::distributed::finalize();  // on every process, even one whose check failed
  return ok ? 0 : 1;
}
