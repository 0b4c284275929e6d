/// @file trace_events.hpp
/// @brief The engine's side of pmap::trace (trace.hpp): where calls, kernels, collectives,
/// waits and suspensions are recorded. Every hook sits behind one predictable branch on
/// recording(); when it is taken, the event goes to the current thread's buffer (no lock)
/// and src/trace_writer.cpp writes the buffers out when the trace stops.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pmap::detail {

class Team;
struct CallInfo;

namespace tracing {

inline std::atomic<bool> recording_flag{false};

/// Whether a trace records (the one branch on the dispatch path when it does not).
inline bool recording() { return recording_flag.load(std::memory_order_relaxed); }

/// Nanoseconds on the trace's clock.
std::int64_t now();

/// Where and when a call began: on the calling thread's track, or inside the calling
/// device's track when it is nested.
struct CallStart {
  std::int64_t ts = -1;
  int track = 0;
};
CallStart call_start();
/// The call over `team` that began at `start` ends; `arguments` describes the argument shapes.
void call(const CallInfo& call, const Team& team, CallStart start, const std::string& arguments);
/// Device `member` of `team` starts its kernel on this thread; its kernel ended.
void kernel_begin(Team& team, int member);
void kernel_end(Team& team, int member, std::int64_t begin, bool failed);
/// One collective of `member`: its slice [begin, now), and its link to the other members of
/// `group_size` (this one at `position`, the first being `leader`).
struct CollectiveEvent {
  const char* name = "";
  std::string_view axes;
  int group_size = 1;
  int position = 0;
  int leader = 0;
  std::size_t bytes = 0;
  int path = 0;                ///< rendezvous.hpp's Path
  std::uint64_t phase = 0;     ///< the member's phase when it began
};
void collective(Team& team, int member, const CollectiveEvent& e, std::int64_t begin);
/// `member` waited for its peers from `begin` to now in its current collective.
void wait(Team& team, int member, std::int64_t begin);
/// Collective `name` that `member` started at `begin` (SPEC 11) completed now.
void started(Team& team, int member, std::int64_t begin, const char* name);
/// `member` waited for started collective `name` (Pending::wait) from `begin` to now.
void pending_wait(Team& team, int member, std::int64_t begin, const char* name);
/// `member` suspends (leaves this thread); it was resumed and runs on this thread again.
void suspend(Team& team, int member);
void resume(Team& team, int member);

/// Starts a trace from PMAP_TRACE, once per process (the first Runtime calls it).
void start_from_environment();
/// The process index and count, for `{process}` in trace paths (distributed::initialize).
void set_process(int index, int count);

}  // namespace tracing
}  // namespace pmap::detail
