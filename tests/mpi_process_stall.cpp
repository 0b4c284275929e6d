// A process that fails before a call (issue: no hang under any fault). Run by ctest under
// `mpirun -np 3` with PMAP_PROCESS_TIMEOUT=3: after two good calls, process 1's own code
// throws before its third call; the application catches the error, skips the call and goes
// on to finalize. Processes 0 and 2 are in that call's agreement, waiting for a process that
// will never come. They must not wait forever: after 3 s each process's watch ends the job
// with MPI_Abort and says why. The test passes when that message appears in time; the
// program cannot succeed (it returns 2 if the others ever get past the call).
#include <pmap/distributed.hpp>
#include <pmap/pmap.hpp>

#include <cstdio>
#include <stdexcept>

namespace {

/// The application's own work before a step; it fails on process 1 at step 2.
void prepare(int step, int process) {
  if (step == 2 && process == 1) throw std::runtime_error("process 1 could not read its input");
}

}  // namespace

int main() {
  pmap::distributed::initialize();
  pmap::Runtime rt({.num_devices = 2, .num_threads = 2});
  auto f = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); },
                      {.axis_name = "i", .runtime = &rt});
  Eigen::Tensor<float, 1, Eigen::RowMajor> x(2);
  x.setConstant(1.f);
  for (int step = 0; step < 4; ++step) {
    try {
      prepare(step, rt.process_index());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "mpi_process_stall: process %d skips step %d: %s\n",
                   rt.process_index(), step, e.what());
      break;  // the application gives up on the remaining steps, but not on MPI
    }
    const auto r = f(x);
    if (r(0) != static_cast<float>(2 * rt.process_count())) return 3;
    if (step >= 2) return 2;  // not reached: process 1 never joins step 2
  }
  pmap::distributed::finalize();
  return 0;
}
