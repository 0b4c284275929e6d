/// @file dispatch.hpp
/// @brief The steps of one call of a mapped function that are not about its types: the team
/// it runs on (leased from the function's cache, shared with the other outer devices when
/// nested, spanning the processes under MPI), one device's run, the agreement of processes,
/// and the dispatch log line.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pmap/context.hpp"
#include "pmap/detail/errors.hpp"
#include "pmap/detail/outputs.hpp"
#include "pmap/detail/team.hpp"
#include "pmap/detail/thread_state.hpp"
#include "pmap/logging.hpp"
#include "pmap/runtime.hpp"

namespace pmap::detail {

/// Owns the team of the last top-level call of a Mapped, reused by the next one.
class TeamCache {
 public:
  TeamCache() = default;
  TeamCache(const TeamCache&) {}
  TeamCache& operator=(const TeamCache&) { return *this; }
  ~TeamCache();  // out of line (src/dispatch.cpp), as give(): a Team's destructor is long
  Team* take() { return team_.exchange(nullptr, std::memory_order_acquire); }
  void give(Team* team);

 private:
  std::atomic<Team*> team_{nullptr};
};

/// An atomic flag that a copy of its owner starts afresh (a Mapped is copyable).
class CopyableFlag {
 public:
  CopyableFlag() = default;
  CopyableFlag(const CopyableFlag&) {}
  CopyableFlag& operator=(const CopyableFlag&) { return *this; }
  bool load(std::memory_order order) const { return flag_.load(order); }
  bool exchange(bool value) { return flag_.exchange(value, std::memory_order_relaxed); }

 private:
  std::atomic<bool> flag_{false};
};

/// The team of one call, and where this process's devices start in it.
class TeamLease {
 public:
  /// A top-level call's team: the cached one when it fits, else a new one; back to the
  /// cache at the end of the call.
  TeamLease(TeamCache& cache, const Runtime& runtime, const std::string& axis_name, int n,
            int processes, const CallInfo& call);
  /// A shard_map call's team over a mesh (spanning the processes with call.span): the cached
  /// one when it fits.
  TeamLease(TeamCache& cache, const Runtime& runtime, std::span<const AxisBinding> axes,
            const CallInfo& call);
  /// A nested call's team: the child of the nesting rendezvous (join_nested) over the inner
  /// axes (a nested pmap's one, a nested shard_map's mesh); `what` names the call.
  TeamLease(Context& outer, std::span<const AxisBinding> inner, const char* what,
            const Runtime& runtime);
  ~TeamLease();
  TeamLease(const TeamLease&) = delete;
  TeamLease& operator=(const TeamLease&) = delete;

  Team& team() const { return *team_; }
  /// Team index of this process's (or this outer device's) first device.
  int base() const { return base_; }

 private:
  TeamCache* cache_ = nullptr;
  Team* team_ = nullptr;
  std::shared_ptr<Team> child_;
  int base_ = 0;
};

/// The device whose kernel makes this call (nesting, SPEC 3.5 and 13), if it runs on
/// `runtime`; a call from elsewhere is a top-level one.
inline Context* enclosing_device(const Runtime& runtime) {
  Context* outer = this_thread().device;
  return outer && Access::runtime(*outer) == &runtime ? outer : nullptr;
}

/// The first device of this process's devices of a call over n devices per process (or of
/// the outer device's inner devices, nested).
int first_device(const Runtime& runtime, const Context* outer, int n);

/// Runs device `index` of `team`: binds its Context to the thread for the kernel's duration,
/// runs body(ctx), and tells the team how it ended (a failure cancels the others).
template <class Body>
void run_device(Team& team, int index, const Device* device, Runtime* runtime, Body&& body) {
  Context ctx = Access::make(&team, index, device, runtime);
  DeviceScope scope(&ctx);
  team.start(index);
  const std::int64_t traced = tracing::recording() ? tracing::now() : -1;
  if (traced >= 0) tracing::kernel_begin(team, index);
  bool failed = false;
  try {
    if (team.cancelled()) throw Cancelled{};
    body(ctx);
    Access::finish_started(ctx);  // what the kernel started and kept beyond its return
    team.slot(index).final_phase = Access::member(ctx).phase;
  } catch (const Cancelled&) {
    failed = true;
  } catch (...) {
    failed = true;
    team.fail(std::current_exception(), index);
  }
  if (traced >= 0) tracing::kernel_end(team, index, traced, failed);
  team.finish(index);
}

/// Times a dispatch for its debug log line, only when that line is logged.
class DispatchTimer {
 public:
  DispatchTimer()
      : on_(log_enabled(spdlog::level::debug)),
        start_(on_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{}) {}
  bool on() const { return on_; }
  double microseconds() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_)
        .count();
  }

 private:
  bool on_;
  std::chrono::steady_clock::time_point start_;
};

/// After the devices: the first failure, rethrown as is; under MPI, every process's outcome
/// first (a failure elsewhere is a DeviceError naming the device).
void rethrow_failure(const Team& team, int processes);

/// After devices [first, first + n) of a call that did not fail returned: all of them called
/// the same collectives in the same order (E14 otherwise, naming the first collective in
/// which they differ and the devices on each side). A point-to-point collective (a ppermute)
/// waits only for its source, and one over a part of the team compares only that part, so
/// a device that skipped one or called another that nobody read is found here (Team::record).
/// The last inner call of a nested pmap compares every device of the shared team.
void check_same_collectives(Team& team, int first, int n);

/// Joins the nesting rendezvous of the enclosing call: every outer device calls the inner
/// pmap (or shard_map), the first creates the shared team of the outer devices times the
/// inner axes' devices, whose axes are the outer team's followed by `inner`.
std::shared_ptr<Team> join_nested(Context& outer, std::span<const AxisBinding> inner,
                                  const char* what, const Runtime& runtime);

/// What validation said about a call on this process, sent to the others (SPEC 7).
enum class Verdict : std::int32_t { valid = -1, value_error = 0, type_error = 1 };

/// Multi-process: every process reports whether its arguments passed validation and what it
/// passed; raises the same ValueError / TypeError on every process unless all agree.
void agree_on_call(Verdict verdict, const std::string& error, std::int64_t n,
                   const std::vector<LeafInfo>& leaves);

/// Multi-process: after the local devices finished, learns every process's outcome and
/// raises the local failure, or a DeviceError naming another process's failing device.
void finish_distributed_call(const Team& team);

/// Logs at info level, for each mapped leaf whose slices are strided (copied per device on
/// every call), what it is and what layout would avoid the copies. Once per mapped function.
void hint_strided_slices(const std::string& name, const std::vector<LeafInfo>& leaves);

/// Logs one dispatch at debug level.
void log_dispatch(const std::string& name, int n, const Device* devices,
                  const std::vector<LeafInfo>& leaves, double microseconds);

/// Checks the devices option of pmap(): non-empty (E1), distinct, all from the runtime.
void check_devices_option(const std::optional<std::vector<Device>>& devices,
                          const Runtime& runtime);

}  // namespace pmap::detail
