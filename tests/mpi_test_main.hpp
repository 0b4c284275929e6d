// The main() of the multi-process suites (test_mpi, test_mpi_shard_map), run under mpirun by
// ctest: a single-process runtime created before MPI (every process's reference), then
// distributed::initialize() and a runtime of `local` devices on each process. Every process
// runs every test; process 0 prints the report, the others only their failures, tagged with
// their process.
#pragma once

#include <gtest/gtest.h>

#include <pmap/distributed.hpp>
#include <pmap/pmap.hpp>

#include <cstdio>

namespace pmap_test {

/// The other processes report only their failures, tagged with the process.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}

 private:
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed())
      std::fprintf(stderr, "[process %d] %s:%d: %s\n", rank_, result.file_name(),
                   result.line_number(), result.summary());
  }
  int rank_;
};

/// Runs the suite: `single` gets `single_devices` devices of one process, `multi` `local`
/// devices on each process (both 2 threads); returns RUN_ALL_TESTS()'s result.
inline int run_mpi_suite(int argc, char** argv, int single_devices, int local,
                         pmap::Runtime*& single, pmap::Runtime*& multi) {
  ::testing::InitGoogleTest(&argc, argv);
  single = new pmap::Runtime({.num_devices = single_devices, .num_threads = 2});
  pmap::distributed::initialize();
  multi = new pmap::Runtime({.num_devices = local, .num_threads = 2});
  if (multi->process_index() != 0) {  // one report, from process 0
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(multi->process_index()));
  }
  const int failed = RUN_ALL_TESTS();
  delete multi;
  delete single;
  pmap::distributed::finalize();
  return failed;
}

}  // namespace pmap_test
