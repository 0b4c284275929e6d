// pmap::trace: per-thread event buffers while recording (src/trace_buffer.hpp); stop() has
// them written as Chrome trace JSON (src/trace_writer.cpp).
#include "pmap/trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "pmap/context.hpp"
#include "pmap/detail/hash.hpp"
#include "pmap/detail/outputs.hpp"
#include "pmap/detail/team.hpp"
#include "pmap/detail/trace_events.hpp"
#include "trace_buffer.hpp"

namespace pmap {
namespace detail::tracing {
namespace {

void copy_text(char (&out)[72], std::string_view s) {
  const std::size_t len = std::min(s.size(), sizeof(out) - 1);
  std::memcpy(out, s.data(), len);
  out[len] = '\0';
}

/// A device's track: one per device and nesting level (an outer device and the inner device
/// with its id run at the same time).
constexpr int kNestingTracks = 10000;
int device_track(const Team& team, int member) {
  return 1 + team.device_id(member) + kNestingTracks * team.nesting();
}

struct Session {
  std::mutex mutex;  // guards buffers, path
  std::vector<std::shared_ptr<Buffer>> buffers;
  std::string path;
  std::chrono::steady_clock::time_point start;
  std::atomic<int> generation{0};  // tells a thread that its buffer is of an older trace
  std::atomic<int> busy{0};        // threads running a device
  std::atomic<int> suspended{0};   // devices suspended
  /// The devices of each suspended fiber, by the device that suspended it (guarded by mutex).
  std::map<std::pair<const Team*, int>, std::vector<Running>> parked;
  int process = 0;
  int processes = 1;
};

Session& session() {
  static Session s;
  return s;
}

struct ThreadBuffer {
  std::shared_ptr<Buffer> buffer;
  int generation = -1;
};

/// This thread's buffer in the current trace. Not inlined: a device fiber may continue on
/// another thread after a suspension, and must not keep the old thread's address.
[[gnu::noinline]] Buffer& buffer() {
  static thread_local ThreadBuffer mine;
  Session& s = session();
  const int generation = s.generation.load(std::memory_order_acquire);
  if (mine.generation != generation || !mine.buffer) {
    mine.buffer = std::make_shared<Buffer>();
    mine.generation = generation;
    std::lock_guard<std::mutex> lock(s.mutex);
    mine.buffer->index = static_cast<int>(s.buffers.size());
    s.buffers.push_back(mine.buffer);
  }
  return *mine.buffer;
}

Event& record(Kind kind, int tid, std::int64_t ts, const char* name) {
  Event& e = buffer().events.append();
  e.kind = kind;
  e.tid = tid;
  e.ts = ts;
  e.name = name;
  return e;
}

/// "i=3" or "x=1,y=0": member m's coordinates in its team, formatted once per team (by the
/// device itself, when its first traced kernel starts) and kept in its slot.
const char* coordinates(Team& team, int m) {
  char(&c)[sizeof(Slot::trace_coordinates)] = team.slot(m).trace_coordinates;
  if (c[0] == '\0') {
    std::string s;
    for (int a = 0; a < team.num_axes(); ++a)
      s += fmt::format("{}{}={}", a ? "," : "", team.axis(a).name, team.index_on(m, a));
    const std::size_t len = std::min(s.size(), sizeof(c) - 1);
    std::memcpy(c, s.data(), len);
    c[len] = '\0';
  }
  return c;
}

void count(std::atomic<int>& counter, int delta, const char* name, std::int64_t ts) {
  const int value = counter.fetch_add(delta, std::memory_order_relaxed) + delta;
  Event& e = record(Kind::counter, 0, ts, name);
  e.a0 = value;
}

/// A stretch of thread `b`'s track: device r ran on it from r.since to `end`.
void stretch(Buffer& b, const Running& r, std::int64_t end) {
  if (end <= r.since) return;
  Event& e = record(Kind::running, kThreadTrack + b.index, r.since, "device");
  e.dur = end - r.since;
  e.a0 = r.team->device_id(r.member);
  copy_text(e.text, coordinates(*r.team, r.member));
}

/// Devices start running on this thread at ts, over the one that ran on it (if any).
void push_running(Buffer& b, std::vector<Running> devices, std::int64_t ts) {
  b.ran = true;
  if (b.running.empty()) {
    count(session().busy, 1, "threads busy", ts);
  } else {
    stretch(b, b.running.back(), ts);
  }
  for (Running& r : devices) b.running.push_back(r);
  b.running.back().since = ts;
  b.fresh_fiber = false;
}

/// The top devices leave this thread at ts; the one below them continues.
void pop_running(Buffer& b, std::size_t keep, std::int64_t ts) {
  b.running.resize(keep);
  if (b.running.empty()) {
    count(session().busy, -1, "threads busy", ts);
  } else {
    b.running.back().since = ts;
  }
}

/// The device's kernel starts on this thread.
void run_here(Team& team, int member, std::int64_t ts) {
  Buffer& b = buffer();
  push_running(b, {Running{&team, member, ts, b.fresh_fiber}}, ts);
}

/// The device's kernel ended on this thread.
void end_here(Team& team, int member, std::int64_t ts) {
  Buffer& b = buffer();
  if (b.running.empty() || b.running.back().team != &team || b.running.back().member != member)
    return;  // started before the trace did
  stretch(b, b.running.back(), ts);
  if (b.running.back().bottom) b.fresh_fiber = true;  // its fiber goes back to dispatching
  pop_running(b, b.running.size() - 1, ts);
}

/// The device suspends: its fiber leaves this thread with every device on it.
void park(Team& team, int member, std::int64_t ts) {
  Buffer& b = buffer();
  if (b.running.empty()) return;
  stretch(b, b.running.back(), ts);
  std::size_t first = b.running.size() - 1;
  while (first > 0 && !b.running[first].bottom) --first;
  std::vector<Running> fiber(b.running.begin() + static_cast<std::ptrdiff_t>(first), b.running.end());
  fiber.front().bottom = true;
  {
    Session& s = session();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.parked[{&team, member}] = std::move(fiber);
  }
  pop_running(b, first, ts);
  b.fresh_fiber = true;
}

/// The device was resumed: its fiber continues on this thread with every device on it.
void unpark(Team& team, int member, std::int64_t ts) {
  std::vector<Running> fiber;
  {
    Session& s = session();
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = s.parked.find({&team, member});
    if (it == s.parked.end()) {
      fiber.push_back(Running{&team, member, ts, true});  // suspended before the trace started
    } else {
      fiber = std::move(it->second);
      s.parked.erase(it);
    }
  }
  push_running(buffer(), std::move(fiber), ts);
}


bool summary_from_environment() {
  const char* v = std::getenv("PMAP_TRACE_SUMMARY");
  return v && std::strcmp(v, "1") == 0;
}

void stop_at_exit() {
  try {
    trace::stop();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
}

}  // namespace

std::int64_t now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              session().start)
      .count();
}

CallStart call_start() {
  Buffer& b = buffer();
  b.called = true;
  // Nested: inside the calling device's track.
  const Context* outer = this_thread().device;
  const int tid = outer ? device_track(*Access::member(*outer).team, Access::member(*outer).index)
                        : kThreadTrack + b.index;
  return {now(), tid};
}

void call(const CallInfo& info, const Team& team, CallStart start, const std::string& arguments) {
  const std::int64_t end = now();
  Event& e = record(Kind::call, start.track, start.ts, info.shard ? "shard_map" : "pmap");
  e.dur = end - start.ts;
  e.a0 = info.n;
  // Formatted per call: the inner calls of a nested pmap share their team, so a team cannot
  // keep the text without a lock.
  std::string axes;
  for (int a = 0; a < team.num_axes(); ++a)
    axes += fmt::format("{}{}={}", a ? "," : "", team.axis(a).name, team.axis(a).size);
  copy_text(e.text, axes);
  Buffer& b = buffer();
  e.a1 = static_cast<std::int64_t>(b.arguments.size());
  e.a2 = b.index;
  b.arguments.push_back(arguments);
}

void kernel_begin(Team& team, int member) {
  coordinates(team, member);
  run_here(team, member, now());
}

void kernel_end(Team& team, int member, std::int64_t begin, bool failed) {
  const std::int64_t end = now();
  Event& e = record(Kind::kernel, device_track(team, member), begin, "kernel");
  e.dur = end - begin;
  e.failed = failed;
  e.a0 = team.device_id(member);
  copy_text(e.text, coordinates(team, member));
  end_here(team, member, end);
}

void collective(Team& team, int member, const CollectiveEvent& c, std::int64_t begin) {
  const std::int64_t end = now();
  Event& e = record(Kind::collective, device_track(team, member), begin, c.name);
  e.dur = end - begin;
  e.a0 = static_cast<std::int64_t>(c.bytes);
  e.a1 = c.group_size;
  e.a2 = c.position;
  e.a3 = c.path;
  e.flow = hash_mix(hash_mix(hash_mix(kHashSeed, team.serial()), c.phase),
                    static_cast<std::uint64_t>(team.device_id(c.leader)));
  copy_text(e.text, c.axes);
}

void wait(Team& team, int member, std::int64_t begin) {
  const std::int64_t end = now();
  Event& e = record(Kind::wait, device_track(team, member), begin, "wait");
  e.dur = end - begin;
  copy_text(e.text, team.slot(member).desc.name);
}

void started(Team& team, int member, std::int64_t begin, const char* name) {
  const std::int64_t end = now();
  Event& e = record(Kind::started, device_track(team, member), begin, name);
  e.dur = end - begin;
}

void pending_wait(Team& team, int member, std::int64_t begin, const char* name) {
  const std::int64_t end = now();
  Event& e = record(Kind::pending_wait, device_track(team, member), begin, "wait()");
  e.dur = end - begin;
  copy_text(e.text, name);
}

void suspend(Team& team, int member) {
  const std::int64_t ts = now();
  Buffer& b = buffer();
  Event& e = record(Kind::suspend, device_track(team, member), ts, "suspend");
  e.a0 = kThreadTrack + b.index;
  park(team, member, ts);
  count(session().suspended, 1, "devices suspended", ts);
}

void resume(Team& team, int member) {
  const std::int64_t ts = now();
  Buffer& b = buffer();
  Event& e = record(Kind::resume, device_track(team, member), ts, "resume");
  e.a0 = kThreadTrack + b.index;
  count(session().suspended, -1, "devices suspended", ts);
  unpark(team, member, ts);
}

void start_from_environment() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* path = std::getenv("PMAP_TRACE");
    if (!path || !*path || trace::active()) return;
    trace::start(path);
    std::atexit(stop_at_exit);
  });
}

void set_process(int index, int count_) {
  Session& s = session();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.process = index;
  s.processes = count_;
}

}  // namespace detail::tracing

namespace trace {

void start(const std::string& path) {
  using namespace detail::tracing;
  if (active()) stop();
  Session& s = session();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.buffers.clear();
    s.path = path;
    s.start = std::chrono::steady_clock::now();
    s.busy.store(0, std::memory_order_relaxed);
    s.suspended.store(0, std::memory_order_relaxed);
    s.parked.clear();
  }
  s.generation.fetch_add(1, std::memory_order_acq_rel);
  recording_flag.store(true, std::memory_order_release);
}

void stop() {
  using namespace detail::tracing;
  if (!recording_flag.exchange(false, std::memory_order_acq_rel)) return;
  Session& s = session();
  std::vector<std::shared_ptr<Buffer>> buffers;
  std::string path;
  int process = 0;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    buffers.swap(s.buffers);
    path = s.path;
    process = s.process;
  }
  s.generation.fetch_add(1, std::memory_order_acq_rel);  // threads drop their buffers
  write(path, buffers, process, summary_from_environment());
}

bool active() { return detail::tracing::recording(); }

}  // namespace trace
}  // namespace pmap
