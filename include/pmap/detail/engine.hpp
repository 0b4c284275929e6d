/// @file engine.hpp
/// @brief The mapping engine both front-ends run on (pmap: mapped.hpp, shard_map:
/// shard_map.hpp): once a call is validated, its outputs are bound, its team is leased, every
/// device cuts its views and runs the kernel, the first failure is rethrown, and the outputs
/// are assembled (SPEC 2.2, 9).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <type_traits>
#include <utility>

#include "pmap/context.hpp"
#include "pmap/detail/blocks.hpp"
#include "pmap/detail/dispatch.hpp"
#include "pmap/detail/kernel.hpp"
#include "pmap/detail/outputs.hpp"
#include "pmap/runtime.hpp"

namespace pmap::detail {

/// One validated call over `call`'s devices.
/// @param lease makes the call's TeamLease (after the outputs are bound: a nested call that
///   joined the nesting rendezvous must start its inner devices, which its peers' inner
///   devices may wait for).
/// @param views views(i, staging): the tuple of arguments device i's kernel receives.
/// @param arguments arguments(): the arguments' shapes, asked for only while a trace records.
/// @return the results (OutputSet::take), or nothing for a void kernel.
template <class R, class Out, class Target, class Kernel, class Lease, class Views, class Arguments>
auto execute(const Kernel& kernel, const Out& out, Target* target, const CallInfo& call,
             Runtime& runtime, int processes, bool check_replicated, Lease&& lease,
             Views&& views, Arguments&& arguments) {
  const tracing::CallStart traced = tracing::recording() ? tracing::call_start() : tracing::CallStart{};
  OutputSet<R, Out> outputs(call, out);
  if constexpr (!std::is_same_v<Target, std::nullptr_t>) outputs.bind(*target);
  const TeamLease team = lease();
  // The call's slice, however it ends (after the outputs are finished, or by an exception).
  struct TraceCall {
    const tracing::CallStart start;
    const CallInfo& call;
    const TeamLease& team;
    Arguments& arguments;
    ~TraceCall() {
      if (start.ts >= 0) tracing::call(call, team.team(), start, arguments());
    }
  } trace_call{traced, call, team, arguments};
  Context* const caller = this_thread().device;
  runtime.pool().run(
      call.n,
      [&](int i) {
        run_device(team.team(), team.base() + i, &call.devices[i], &runtime, [&](Context& ctx) {
          Staging staging;
          if constexpr (std::is_void_v<R>)
            invoke_kernel(kernel, ctx, views(i, staging));
          else
            outputs.write(i, invoke_kernel(kernel, ctx, views(i, staging)));
        });
      },
      [&](std::exception_ptr failure) { team.team().fail(failure); });
  this_thread().device = caller;
  rethrow_failure(team.team(), processes);
  std::exception_ptr error;  // across processes, raised on all of them once they agree
  try {
    check_same_collectives(team.team(), team.base(), call.n);
  } catch (...) {
    if (!call.span) throw;
    error = std::current_exception();
  }
  finish_outputs(outputs, call, runtime.pool(), check_replicated, error);
  return outputs.take();
}

}  // namespace pmap::detail
