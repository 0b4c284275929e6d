/// @file distributed.hpp
/// @brief Multi-process pmap over MPI (SPEC 7).
///
/// Launch the program with `mpirun -np P`; call initialize() first. Every process then owns
/// `local_device_count()` devices, global ids run process after process, each process passes
/// its local slice of the mapped axis, and collectives span all processes.
///
/// Example:
/// @code
///   #include <pmap/pmap.hpp>
///
///   int main() {
///     pmap::distributed::initialize();
///     auto f = pmap::pmap([](pmap::Context& ctx, auto x) { return pmap::eval(x + ctx.psum(x)); });
///     // Each process passes its [local_device_count(), ...] slice.
///     Eigen::Tensor<float, 2, Eigen::RowMajor> xs(pmap::local_device_count(), 16);
///     xs.setRandom();
///     Eigen::Tensor<float, 2, Eigen::RowMajor> ys = f(xs);
///     pmap::distributed::finalize();
///   }
/// @endcode
///
/// Thread safety: under MPI, run one mapped call at a time per process.
///
/// Faults: a kernel that throws on one process reaches every process (the exception where it
/// was thrown, a DeviceError naming it elsewhere). A process that waits in one exchange for
/// longer than `PMAP_PROCESS_TIMEOUT` seconds (default 600, 0 = forever) because another
/// process never arrives ends the job with MPI_Abort and a message on stderr.
#pragma once

namespace pmap::distributed {

/// @brief Initialises MPI (unless the program already did) and makes Runtime::global() and
/// every Runtime created afterwards span all processes. Without MPI support (PMAP_WITH_MPI
/// off) it leaves a single process. Calling it twice is harmless.
void initialize();

/// @brief Finalises MPI if initialize() initialised it; otherwise only detaches pmap.
void finalize();

/// @brief Whether initialize() was called (and finalize() not yet).
bool is_initialized();

}  // namespace pmap::distributed
