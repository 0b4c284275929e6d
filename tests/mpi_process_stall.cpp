// A process that fails before a call (issue: no hang under any fault). Run by ctest under
// `mpirun -np 3` with PMAP_PROCESS_TIMEOUT=3: after two good calls, process 1's own code
// throws before its third call; the application catches the error, skips the call and goes
// on with work of its own (here: it sleeps). Processes 0 and 2 are in that call's agreement,
// waiting for a process that will never come. They must not wait forever: after 3 s each
// process's watch ends the job with MPI_Abort and says why. The test passes when that message
// appears in time and the job ends; the program cannot succeed (it returns 2 if the others
// ever get past the call). With PMAP_STALL_SHARD_MAP set, the call is a shard_map across the
// processes (SPEC 13) instead of a pmap.
//
// Process 1 does not go on to MPI_Finalize here: with a process inside MPI_Finalize while
// the others end, Open MPI 4.1's mpirun itself may hang in its own teardown
// (PMIx_server_finalize) after every process of the job has ended. A 3-process program
// without pmap did so in 4 of 24 runs here after MPI_Abort, and an exit instead of the abort
// also hung or crashed mpirun. With no process in MPI_Finalize: 25 of 25 runs ended (README,
// "Across processes").
#include <pmap/distributed.hpp>
#include <pmap/pmap.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>

namespace {

/// The application's own work before a step; it fails on process 1 at step 2.
void prepare(int step, int process) {
  if (step == 2 && process == 1) throw std::runtime_error("process 1 could not read its input");
}

}  // namespace

int main() {
  pmap::distributed::initialize();
  pmap::Runtime rt({.num_devices = 2, .num_threads = 2});
  // The same program as a shard_map over every process's devices when PMAP_STALL_SHARD_MAP
  // is set (its agreement on global shapes is the exchange the others wait in).
  const bool shard = std::getenv("PMAP_STALL_SHARD_MAP") != nullptr;
  auto psum = [](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); };
  auto mapped = pmap::pmap(psum, {.axis_name = "i", .runtime = &rt});
  auto sharded = pmap::shard_map(psum, pmap::Mesh({{"i", rt.device_count()}}, &rt), {pmap::P()}, {pmap::P()});
  auto f = [&](const auto& v) -> Eigen::Tensor<float, 1, Eigen::RowMajor> {
    return shard ? sharded(v) : mapped(v);
  };
  Eigen::Tensor<float, 1, Eigen::RowMajor> x(2);
  x.setConstant(1.f);
  for (int step = 0; step < 4; ++step) {
    try {
      prepare(step, rt.process_index());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "mpi_process_stall: process %d skips step %d: %s\n",
                   rt.process_index(), step, e.what());
      std::this_thread::sleep_for(std::chrono::seconds(60));  // its own work, never a call
      return 4;  // not reached: the others end the job first
    }
    const auto r = f(x);
    if (r(0) != static_cast<float>(2 * rt.process_count())) return 3;
    if (step >= 2) return 2;  // not reached: process 1 never joins step 2
  }
  pmap::distributed::finalize();
  return 0;
}
