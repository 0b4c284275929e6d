/// @file mpi_apps.hpp
/// @brief pmap-bench under mpirun: shard_map across processes (SPEC 13) on two application
/// workloads, mlp_step and batched_solve, against the same work by one process whose
/// runtime has every device (P processes of L devices against 1 process of P * L devices).
///
/// Both sides run in the same job, interleaved (mpi_compare): the baseline runs on process 0
/// while the other processes wait in a barrier that sleeps between polls, so that they leave
/// process 0 the cores it needs. The ratio is the price of spanning processes: per call, one
/// exchange of the argument shapes before the kernels and one of the outcome (and of the
/// replicated outputs' hashes) after them, the hashes of the replicated arguments, and the
/// collectives' MPI messages (mlp_step's gradient pmean; batched_solve has none).
///
/// Thread safety: none; call from the main thread of every process.
#pragma once

#include <mpi.h>

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <pmap/pmap.hpp>

#include "app_kernels.hpp"
#include "mpi.hpp"
#include "table.hpp"

namespace pmap::report {

/// @brief A barrier that sleeps between polls (OpenMPI's MPI_Barrier spins a core): the
/// pauses double from 20 us to 1 ms, so that a process waiting out the baseline's whole run
/// wakes about a thousand times a second, and peers that arrive together still meet within
/// microseconds.
inline void quiet_barrier() {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  for (long pause_ns = 20000;; pause_ns = std::min(2 * pause_ns, 1000000L)) {
    int done = 0;
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    const timespec pause{0, pause_ns};
    nanosleep(&pause, nullptr);
  }
}

/// @brief Whether the rows can be honest here, agreed by every process: the baseline's one
/// process needs `alone_threads` cores of its own, so every process must be on one node and
/// allowed to run on that many cores (mpirun binds each process to one core by default for
/// up to 2 processes: run it with `--bind-to none`). Process 0 says why not.
inline bool mpi_apps_fit(int alone_threads, bool one_node) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const int cores = sched_getaffinity(0, sizeof allowed, &allowed) == 0 ? CPU_COUNT(&allowed) : 0;
  int fits = one_node && cores >= alone_threads ? 1 : 0, all = 0;
  MPI_Allreduce(&fits, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (all == 0 && rank == 0)
    std::fprintf(stderr,
                 "pmap-bench: mpi_mlp_step and mpi_batched_solve left out: they need every "
                 "process on one node, each allowed %d cores (this process: %d; run mpirun "
                 "--bind-to none)\n",
                 alone_threads, cores);
  return all == 1;
}

/// @brief The rows: `spanning` (P processes, every process calls this) against `alone` (a
/// process-local runtime of P * L devices, created before distributed::initialize()).
inline std::vector<Row> mpi_app_workloads(pmap::Runtime& spanning, pmap::Runtime& alone, bool quick,
                                          int rounds) {
  using Tensor1 = Eigen::Tensor<float, 1, Eigen::RowMajor>;
  using Tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
  std::vector<Row> rows;
  const bool leader = spanning.process_index() == 0;
  const std::string who = format("%d processes x %d devices vs 1 process x %d devices",
                                 spanning.process_count(), spanning.local_device_count(),
                                 alone.device_count());
  const pmap::Mesh across({{"x", spanning.device_count()}}, &spanning);
  const pmap::Mesh one({{"x", alone.device_count()}}, &alone);
  {
    constexpr Eigen::Index kBatch = 4096;
    Tensor1 theta(kMlpParams), next(kMlpParams), next_alone(kMlpParams);
    Tensor2 x(kBatch, kMlpIn), y(kBatch, 1);
    mlp_problem(theta.data(), x.data(), y.data(), kBatch);  // std::rand: the same on every process
    const Tensor2 xb = pmap::process_block(x, across, pmap::P("x"));
    const Tensor2 yb = pmap::process_block(y, across, pmap::P("x"));
    std::vector<MlpWork> work(static_cast<std::size_t>(spanning.device_count()));
    std::vector<MlpWork> work_alone(static_cast<std::size_t>(alone.device_count()));
    auto step = mlp_stepper(across, work, kBatch);
    auto step_alone = mlp_stepper(one, work_alone, kBatch);
    rows.push_back(mpi_compare(
        "mpi_mlp_step", format("batch %ld, ", static_cast<long>(kBatch)) + who, "1 process",
        rounds, quick ? 5 : 40, 1, [&] { step.into(next, theta, xb, yb); },
        [&] {
          if (leader) step_alone.into(next_alone, theta, x, y);
        },
        Target{}, quiet_barrier));
  }
  {
    constexpr Eigen::Index kSystems = 1001, kN = 32;
    Eigen::Tensor<double, 3, Eigen::RowMajor> a(kSystems, kN, kN);
    Eigen::Tensor<double, 2, Eigen::RowMajor> r(kSystems, kN), x_alone(kSystems, kN);
    solve_problem(a.data(), r.data(), kSystems, kN);
    const auto ab = pmap::process_block(a, across, pmap::P("x"));
    const auto rb = pmap::process_block(r, across, pmap::P("x"));
    Eigen::Tensor<double, 2, Eigen::RowMajor> xb(rb.dimension(0), kN);
    auto solve = batch_solver(across);
    auto solve_alone = batch_solver(one);
    rows.push_back(mpi_compare(
        "mpi_batched_solve",
        format("%ld x %ldx%ld, ", static_cast<long>(kSystems), static_cast<long>(kN),
               static_cast<long>(kN)) + who,
        "1 process", rounds, quick ? 3 : 20, 1, [&] { solve.into(xb, ab, rb); },
        [&] {
          if (leader) solve_alone.into(x_alone, a, r);
        },
        Target{}, quiet_barrier));
  }
  return rows;
}

}  // namespace pmap::report
