/// @file trace.hpp
/// @brief A per-device timeline of mapped calls, written as Chrome trace JSON (the
/// `traceEvents` format that https://ui.perfetto.dev and chrome://tracing open).
///
/// While a trace runs, every call, kernel run and collective of every device is recorded:
/// one track per logical device, named by its coordinates (`i=3`, `x=1,y=0`), one per thread
/// (which device ran on it when), complete slices for calls, kernels and collectives (op,
/// axes, group size, bytes, path), the time a device waited for its peers as a `wait` slice
/// inside its collective, suspend and resume instants (with the thread that resumed the
/// device), flow arrows linking the members of each collective, and counters of busy threads
/// and suspended devices. Events go to per-thread buffers without locks and are written when
/// the trace stops; `bench/plot_trace.py trace.json out.png` draws the Gantt chart.
///
/// From the environment: `PMAP_TRACE=path.json` starts a trace when the first Runtime is
/// created and writes it at normal exit; `PMAP_TRACE_SUMMARY=1` also prints a table of the
/// collectives (count, time, share spent waiting) on stderr when the trace stops. `{process}`
/// in the path is replaced by the process index (one file per MPI process).
///
/// Example:
/// @code
///   #include <pmap/pmap.hpp>
///
///   int main() {
///     pmap::trace::start("step.json");
///     auto f = pmap::pmap([](pmap::Context& ctx, auto x) { return ctx.psum(x, "i"); });
///     Eigen::Tensor<float, 2, Eigen::RowMajor> xs(pmap::local_device_count(), 1024);
///     xs.setRandom();
///     Eigen::Tensor<float, 2, Eigen::RowMajor> ys = f(xs);
///     pmap::trace::stop();  // step.json is complete now
///   }
/// @endcode
///
/// Thread safety: start() and stop() must not run while a mapped call is in flight.
#pragma once

#include <string>

namespace pmap::trace {

/// @brief Starts recording into `path` (`{process}` is replaced by the process index when the
/// trace is written). A trace that is already running is stopped and written first.
void start(const std::string& path);

/// @brief Stops recording and writes the trace file (and the summary when
/// `PMAP_TRACE_SUMMARY=1`). Does nothing when no trace runs. Throws std::runtime_error when
/// the file cannot be written.
void stop();

/// @brief Whether a trace is recording.
bool active();

}  // namespace pmap::trace
