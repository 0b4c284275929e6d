// A process killed (SIGKILL) in the middle of a collective (issue: no hang under any fault).
// Run by ctest under `mpirun -np 3`: every process runs psum over the axis that spans all of
// them, in a loop; on the 20th call one device of process 1 kills its process while its
// peers wait for it in the collective. The other processes must not wait forever: the job
// must end, with an error, well inside the test's timeout (mpirun notices the dead process
// and ends the others). The test passes when the job ends in time after the kill.
#include <pmap/distributed.hpp>
#include <pmap/pmap.hpp>

#include <csignal>
#include <cstdio>

int main() {
  pmap::distributed::initialize();
  pmap::Runtime rt({.num_devices = 4, .num_threads = 2});
  int call = 0;
  auto f = pmap::pmap(
      [&call](pmap::Context& ctx, auto v) {
        if (call == 20 && ctx.device().process_index == 1 && ctx.axis_index("i") == 5) {
          std::fprintf(stderr, "mpi_killed_process: killing process 1 inside a collective\n");
          std::raise(SIGKILL);
        }
        return ctx.psum(v, "i");
      },
      {.axis_name = "i", .runtime = &rt});
  Eigen::Tensor<float, 1, Eigen::RowMajor> x(4);
  x.setConstant(1.f);
  for (call = 0; call < 1000; ++call) {
    const auto r = f(x);
    if (r(0) != static_cast<float>(4 * rt.process_count())) return 2;
  }
  pmap::distributed::finalize();
  return 0;  // not reached when process 1 is killed: the test fails if the job succeeds
}
