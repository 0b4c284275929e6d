/// @file mpi.hpp
/// @brief pmap-bench under mpirun: a cross-process psum against raw MPI_Allreduce of the
/// same bytes, and the cost of a multi-process dispatch against an MPI_Barrier.
///
/// The harness of harness.hpp calibrates repetitions per process, which MPI cannot allow
/// (every process must run the same collectives), so these cases run a fixed number of
/// iterations per round, interleaved with their baseline, synchronised by a barrier;
/// process 0's clock is reported. Built only with PMAP_WITH_MPI.
///
/// Thread safety: none; call from the main thread of every process.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <pmap/distributed.hpp>
#include <pmap/pmap.hpp>

#include "table.hpp"

namespace pmap::report {

/// @brief Rounds of (pmap, baseline) pairs: per-operation seconds of each, in the same run.
/// `barrier` synchronises the processes around each timed run (MPI_Barrier unless given).
inline void mpi_barrier() { MPI_Barrier(MPI_COMM_WORLD); }
template <class Pmap, class Baseline>
Row mpi_compare(const std::string& workload, const std::string& size, const std::string& base,
                int rounds, int iterations, int ops, Pmap pmap_run, Baseline baseline_run,
                Target target, void (*barrier)() = mpi_barrier) {
  std::vector<double> pmap_times, base_times, ratios;
  auto timed = [&](auto&& body) {
    barrier();
    const double start = MPI_Wtime();
    for (int k = 0; k < iterations; ++k) body();
    barrier();
    return (MPI_Wtime() - start) / (static_cast<double>(iterations) * ops);
  };
  timed(pmap_run);  // warm-up
  timed(baseline_run);
  for (int r = 0; r < rounds; ++r) {
    const bool pmap_first = r % 2 == 0;
    const double a = pmap_first ? timed(pmap_run) : 0;
    const double b = timed(baseline_run);
    const double p = pmap_first ? a : timed(pmap_run);
    pmap_times.push_back(p);
    base_times.push_back(b);
    ratios.push_back(p / b);
  }
  Row row;
  row.workload = workload;
  row.size = size;
  row.pmap = "pmap";
  row.baseline = base;
  row.unit = "s";
  row.ratio_meaning = "time pmap / time baseline";
  row.pmap_value = stat(pmap_times).median;
  row.baseline_value = stat(base_times).median;
  row.pmap_figure = format_time(row.pmap_value);
  row.baseline_figure = format_time(row.baseline_value);
  row.rounds = ratios;
  row.ratio = stat(ratios);
  row.target = target;
  return row;
}

/// @brief The MPI rows: psum at 8 KiB and 64 MiB per device (`local_devices` per process)
/// against MPI_Allreduce of the same bytes, and an empty multi-process dispatch against
/// MPI_Barrier. Every process must call it; every process gets the rows.
inline std::vector<Row> mpi_workloads(int local_devices, int threads, bool quick, int rounds) {
  using Tensor1 = Eigen::Tensor<float, 1, Eigen::RowMajor>;
  using Tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
  pmap::Runtime rt({.num_devices = local_devices, .num_threads = threads});
  const int procs = rt.process_count();
  std::vector<Row> rows;
  const std::string who =
      format("%d processes x %d devices, %d threads", procs, local_devices, threads);

  for (const std::int64_t bytes : {std::int64_t{8} << 10, std::int64_t{64} << 20}) {
    const bool big = bytes > (1 << 20);
    if (quick && big) continue;
    const std::int64_t floats = bytes / 4;
    const int ops = big ? 1 : 100;
    const int iterations = big ? (quick ? 2 : 4) : (quick ? 10 : 50);
    // The last result is donated: its buffer serves the next call's first psum, as
    // MPI_Allreduce's output buffer serves every call of the baseline (a fresh 64 MiB result
    // per call would be 16384 page faults the baseline does not take).
    auto chain = pmap::pmap(
        [ops](pmap::Context& ctx, auto row) {
          Tensor1 v = ctx.psum(row, "i");
          for (int k = 1; k < ops; ++k) v = ctx.psum(v, "i");
          const float first = v(0);
          ctx.donate(std::move(v));
          return first;
        },
        {.axis_name = "i", .runtime = &rt});
    Tensor2 x(local_devices, floats);
    x.setConstant(1.f);
    Tensor1 in(floats), out(floats);
    in.setConstant(1.f);
    rows.push_back(mpi_compare(
        "mpi_psum", format_bytes(static_cast<double>(bytes)) + ", " + who, "MPI_Allreduce",
        rounds, iterations, ops, [&] { chain(x); },
        [&] {
          for (int k = 0; k < ops; ++k)
            MPI_Allreduce(in.data(), out.data(), static_cast<int>(floats), MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
        },
        // MPI_Allreduce moves the same bytes once per process; pmap adds the local
        // reduction and the copy back to every device.
        Target::at_most(1.0 / 0.9)));
  }

  auto empty = pmap::pmap([](auto) {}, {.runtime = &rt});
  Tensor2 x(local_devices, 1);
  x.setZero();
  rows.push_back(mpi_compare("mpi_dispatch", "empty kernel, " + who, "MPI_Barrier", rounds,
                             quick ? 100 : 1000, 1, [&] { empty(x); },
                             [] { MPI_Barrier(MPI_COMM_WORLD); }, Target{}));
  return rows;
}

}  // namespace pmap::report
