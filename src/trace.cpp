// pmap::trace: per-thread event buffers while recording, Chrome trace JSON when stopped.
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

namespace pmap {
namespace detail::tracing {
namespace {

/// What an event is; decides how it is written.
enum class Kind : std::uint8_t { call, kernel, collective, wait, running, suspend, resume, counter };

/// One recorded event. Strings that outlive the trace (collective names) are kept as
/// pointers; everything else is copied into `text`, so that recording never allocates
/// beyond the buffer's own growth.
struct Event {
  Kind kind;
  bool failed = false;    ///< kernel: it ended by an exception
  int tid = 0;            ///< the track
  std::int64_t ts = 0;    ///< ns since the trace started
  std::int64_t dur = 0;
  const char* name = "";
  std::uint64_t flow = 0;  ///< collective: the key its members share
  std::int64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  char text[72] = {};
};

/// A buffer's events in chunks that never move: appending is a store and, once per
/// kChunk events, one allocation.
class EventLog {
 public:
  static constexpr std::size_t kChunk = 4096;
  Event& append() {
    if (used_ == kChunk || chunks_.empty()) {
      chunks_.push_back(std::make_unique<Event[]>(kChunk));
      used_ = 0;
    }
    return chunks_.back()[used_++];
  }
  template <class Fn>
  void for_each(Fn&& fn) {
    for (std::size_t c = 0; c < chunks_.size(); ++c)
      for (std::size_t k = 0, n = c + 1 == chunks_.size() ? used_ : kChunk; k < n; ++k) fn(chunks_[c][k]);
  }

 private:
  std::vector<std::unique_ptr<Event[]>> chunks_;
  std::size_t used_ = 0;
};

void copy_text(char (&out)[72], std::string_view s) {
  const std::size_t len = std::min(s.size(), sizeof(out) - 1);
  std::memcpy(out, s.data(), len);
  out[len] = '\0';
}

/// A device on a thread's stack, since when it runs there. `bottom`: the first device of
/// its fiber (a suspension takes the fiber's devices with it, down to this one).
struct Running {
  Team* team;
  int member;
  std::int64_t since;
  bool bottom;
};

/// The events one OS thread recorded in one trace. Only its thread appends; stop() reads it
/// after recording ended.
struct Buffer {
  EventLog events;
  std::vector<std::string> arguments;  ///< of the calls (Event::a1 indexes it)
  int index = 0;         ///< registration order: the thread's track is kThreadTrack + index
  bool called = false;   ///< it made a call
  bool ran = false;      ///< it ran devices
  /// The devices on this thread's stack, the running one last: oneTBB runs a task inside
  /// another's wait (a nested call, a device started by a waiting one), and that device then
  /// runs instead of the one below it until it leaves.
  std::vector<Running> running;
  bool fresh_fiber = true;  ///< the next device pushed starts a fiber's stack
};

constexpr int kThreadTrack = 100000;

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

// ---- writing --------------------------------------------------------------------------------

void escape_into(std::string& out, std::string_view s) {
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
}

std::string quoted(std::string_view s) {
  std::string out = "\"";
  escape_into(out, s);
  out += '"';
  return out;
}

/// Microseconds, as the format wants them, to the nanosecond.
std::string us(std::int64_t ns) { return fmt::format("{}.{:03}", ns / 1000, ns % 1000); }

const char* path_name(std::int64_t path) {
  switch (path) {
    case 0: return "staged";
    case 1: return "in place";
    case 2: return "gathered";
  }
  return "?";
}

/// A flow key as a JSON number that a double holds exactly.
std::uint64_t flow_id(std::uint64_t key) { return key & ((std::uint64_t{1} << 48) - 1); }

struct Row {
  std::int64_t count = 0, total = 0, wait = 0;
};

/// The collectives' table: count, total time, share spent waiting, from the recorded events.
std::string summary(const std::vector<Event*>& events) {
  std::map<std::string, Row> rows;
  Row kernels;
  std::int64_t suspends = 0;
  for (const Event* e : events) {
    if (e->kind == Kind::collective) {
      Row& r = rows[e->name];
      ++r.count;
      r.total += e->dur;
    } else if (e->kind == Kind::wait) {
      rows[e->text].wait += e->dur;
    } else if (e->kind == Kind::kernel) {
      ++kernels.count;
      kernels.total += e->dur;
    } else if (e->kind == Kind::suspend) {
      ++suspends;
    }
  }
  std::string out = fmt::format("pmap trace summary: {} kernel runs, {:.3f} ms in kernels, {} suspensions\n",
                                kernels.count, static_cast<double>(kernels.total) / 1e6, suspends);
  out += fmt::format("{:<20} {:>10} {:>14} {:>14} {:>8}\n", "collective", "count", "total ms", "waiting ms",
                     "waiting");
  for (const auto& [name, r] : rows) {
    if (r.count == 0) continue;
    out += fmt::format("{:<20} {:>10} {:>14.3f} {:>14.3f} {:>7.1f}%\n", name, r.count,
                       static_cast<double>(r.total) / 1e6, static_cast<double>(r.wait) / 1e6,
                       r.total > 0 ? 100.0 * static_cast<double>(r.wait) / static_cast<double>(r.total) : 0.0);
  }
  return out;
}

std::string resolve_path(std::string path, int process) {
  const std::string key = "{process}";
  for (std::size_t at = path.find(key); at != std::string::npos; at = path.find(key, at))
    path.replace(at, key.size(), std::to_string(process));
  return path;
}

/// The traceEvents array of one process, event by event.
class JsonWriter {
 public:
  explicit JsonWriter(int pid) : pid_(pid) {}

  /// An event's common fields; the caller appends the rest and its closing brace.
  void begin_event(const char* ph, const char* name, int tid, std::int64_t ts) {
    separate();
    out_ += fmt::format("{{\"ph\":\"{}\",\"pid\":{},\"tid\":{},\"ts\":{},\"name\":", ph, pid_, tid, us(ts));
    out_ += quoted(name);
  }
  /// A metadata event: args {key: value}, value already JSON.
  void meta(const char* what, int tid, const std::string& value, const char* key = "name") {
    separate();
    out_ += fmt::format("{{\"ph\":\"M\",\"pid\":{},\"tid\":{},\"name\":\"{}\",\"args\":{{\"{}\":", pid_, tid,
                        what, key);
    out_ += value + "}}";
  }
  std::string& out() { return out_; }
  int pid() const { return pid_; }
  std::string finish() { return out_ + "\n]}\n"; }

 private:
  void separate() {
    out_ += first_ ? "" : ",\n";
    first_ = false;
  }
  int pid_;
  bool first_ = true;
  std::string out_ = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
};

/// Every buffer's events in time order, a slice before the slices it contains; a thread's
/// stretch ends where its next one starts (should a fiber have moved in a way the
/// bookkeeping did not follow: a thread runs one device at a time).
std::vector<Event*> sorted_events(const std::vector<std::shared_ptr<Buffer>>& buffers) {
  std::vector<Event*> events;
  for (const auto& b : buffers)
    b->events.for_each([&](Event& e) { events.push_back(&e); });
  std::stable_sort(events.begin(), events.end(), [](const Event* a, const Event* b) {
    return a->ts != b->ts ? a->ts < b->ts : a->dur > b->dur;
  });
  std::map<int, Event*> last_stretch;
  for (Event* e : events) {
    if (e->kind != Kind::running) continue;
    Event*& last = last_stretch[e->tid];
    if (last && last->ts + last->dur > e->ts) last->dur = e->ts - last->ts;
    last = e;
  }
  return events;
}

/// The process, thread and device tracks' names and order. A device's track is named by
/// its coordinates in every team it ran in, in order: "i=1" for an outer device, "i=1 |
/// i=0,j=1" when it was an inner device of a nested call too.
void write_names(JsonWriter& w, const std::vector<std::shared_ptr<Buffer>>& buffers,
                 const std::vector<Event*>& events) {
  w.meta("process_name", 0, quoted(fmt::format("pmap process {}", w.pid())));
  w.meta("process_sort_index", 0, std::to_string(w.pid()), "sort_index");
  for (const auto& b : buffers) {
    const char* role = b->called && b->ran ? "calling and running devices"
                       : b->called         ? "calling"
                                           : "running devices";
    w.meta("thread_name", kThreadTrack + b->index, quoted(fmt::format("thread {} ({})", b->index, role)));
    w.meta("thread_sort_index", kThreadTrack + b->index, std::to_string(kThreadTrack + b->index), "sort_index");
  }
  std::map<int, std::pair<std::vector<std::string>, std::int64_t>> device_names;
  for (const Event* e : events)
    if (e->kind == Kind::kernel) {
      auto& [places, id] = device_names[e->tid];
      id = e->a0;
      if (std::find(places.begin(), places.end(), e->text) == places.end()) places.emplace_back(e->text);
    }
  for (const auto& [tid, name] : device_names) {
    w.meta("thread_name", tid, quoted(fmt::format("{} (cpu:{})", fmt::join(name.first, " | "), name.second)));
    w.meta("thread_sort_index", tid, std::to_string(tid), "sort_index");
  }
}

/// One recorded event; `arguments` is a call's description.
void write_event(JsonWriter& w, const Event& e, const std::string& arguments) {
  std::string& out = w.out();
  switch (e.kind) {
    case Kind::call:
      w.begin_event("X", e.name, e.tid, e.ts);
      out += fmt::format(",\"cat\":\"call\",\"dur\":{},\"args\":{{\"devices\":{},\"axes\":{},\"arguments\":{}}}}}",
                         us(e.dur), e.a0, quoted(e.text), quoted(arguments));
      break;
    case Kind::kernel:
      w.begin_event("X", "kernel", e.tid, e.ts);
      out += fmt::format(",\"cat\":\"kernel\",\"dur\":{},\"args\":{{\"device\":{},\"coordinates\":{},\"failed\":{}}}}}",
                         us(e.dur), e.a0, quoted(e.text), e.failed ? "true" : "false");
      break;
    case Kind::collective:
      w.begin_event("X", e.name, e.tid, e.ts);
      out += fmt::format(",\"cat\":\"collective\",\"dur\":{},\"args\":{{\"axes\":{},\"group_size\":{},"
                         "\"position\":{},\"bytes\":{},\"path\":\"{}\",\"flow\":{}}}}}",
                         us(e.dur), quoted(e.text), e.a1, e.a2, e.a0, path_name(e.a3), flow_id(e.flow));
      break;
    case Kind::wait:
      w.begin_event("X", "wait", e.tid, e.ts);
      out += fmt::format(",\"cat\":\"wait\",\"dur\":{},\"args\":{{\"collective\":{}}}}}", us(e.dur), quoted(e.text));
      break;
    case Kind::running:
      w.begin_event("X", e.text, e.tid, e.ts);
      out += fmt::format(",\"cat\":\"running\",\"dur\":{},\"args\":{{\"device\":{}}}}}", us(e.dur), e.a0);
      break;
    case Kind::suspend:
    case Kind::resume:
      w.begin_event("i", e.name, e.tid, e.ts);
      out += fmt::format(",\"cat\":\"scheduling\",\"s\":\"t\",\"args\":{{\"thread\":{}}}}}", e.a0);
      break;
    case Kind::counter:
      w.begin_event("C", e.name, 0, e.ts);
      out += fmt::format(",\"args\":{{\"{}\":{}}}}}", std::strcmp(e.name, "threads busy") == 0 ? "threads" : "devices",
                         e.a0);
      break;
  }
}

/// Flows: the members of each collective of 2+ members, chained in the order they began.
void write_flows(JsonWriter& w, const std::vector<Event*>& events) {
  std::unordered_map<std::uint64_t, std::vector<const Event*>> flows;
  for (const Event* e : events)
    if (e->kind == Kind::collective && e->a1 >= 2) flows[e->flow].push_back(e);
  for (auto& [key, members] : flows) {
    std::sort(members.begin(), members.end(), [](const Event* a, const Event* b) { return a->ts < b->ts; });
    for (std::size_t k = 0; k < members.size(); ++k) {
      const char* ph = k == 0 ? "s" : k + 1 == members.size() ? "f" : "t";
      w.begin_event(ph, members[k]->name, members[k]->tid, members[k]->ts);
      w.out() += fmt::format(",\"cat\":\"collective\",\"id\":{},\"bp\":\"e\"}}", flow_id(key));
    }
  }
}

void save(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error(fmt::format("pmap::trace: cannot write '{}'", path));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) throw std::runtime_error(fmt::format("pmap::trace: writing '{}' failed", path));
}

/// Writes the trace of `buffers` (recording has stopped).
void write(const std::string& path, const std::vector<std::shared_ptr<Buffer>>& buffers, int pid,
           bool print_summary) {
  const std::vector<Event*> events = sorted_events(buffers);
  JsonWriter w(pid);
  write_names(w, buffers, events);
  for (const Event* e : events) {
    static const std::string none;
    const std::string& arguments =
        e->kind == Kind::call ? buffers[static_cast<std::size_t>(e->a2)]->arguments[static_cast<std::size_t>(e->a1)]
                              : none;
    write_event(w, *e, arguments);
  }
  write_flows(w, events);
  save(path, w.finish());
  if (print_summary) std::fputs(summary(events).c_str(), stderr);
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
  write(resolve_path(path, process), buffers, process, summary_from_environment());
}

bool active() { return detail::tracing::recording(); }

}  // namespace trace
}  // namespace pmap
