// pmap::trace's writer: the recorded events (src/trace_buffer.hpp) as Chrome trace JSON,
// and the collectives' table of PMAP_TRACE_SUMMARY=1.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "trace_buffer.hpp"

namespace pmap::detail::tracing {
namespace {

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
  std::int64_t suspends = 0, waits = 0, waits_suspended = 0;
  for (const Event* e : events) {
    if (e->kind == Kind::pending_wait) {
      ++waits;
      waits_suspended += e->a0;
    }
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
  if (waits > 0)
    out += fmt::format("started collectives: {} waits, {} of them without suspending\n", waits,
                       waits - waits_suspended);
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

/// A Pending's wait() suspended when its device's track has a suspension inside it (a0).
void mark_suspended_waits(const std::vector<Event*>& events) {
  std::map<int, std::vector<std::int64_t>> suspensions;  // per track, in time order
  for (const Event* e : events)
    if (e->kind == Kind::suspend) suspensions[e->tid].push_back(e->ts);
  for (Event* e : events) {
    if (e->kind != Kind::pending_wait) continue;
    const auto found = suspensions.find(e->tid);
    if (found == suspensions.end()) continue;
    const auto at = std::lower_bound(found->second.begin(), found->second.end(), e->ts);
    e->a0 = at != found->second.end() && *at <= e->ts + e->dur;
  }
}

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
  mark_suspended_waits(events);
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
    case Kind::started:  // an async slice: several may be in flight on one device
      w.begin_event("b", e.name, e.tid, e.ts);
      out += fmt::format(",\"cat\":\"started\",\"id\":\"{}.{}\"}}", e.tid, e.ts);
      w.begin_event("e", e.name, e.tid, e.ts + e.dur);
      out += fmt::format(",\"cat\":\"started\",\"id\":\"{}.{}\"}}", e.tid, e.ts);
      break;
    case Kind::pending_wait:
      w.begin_event("X", "wait()", e.tid, e.ts);
      out += fmt::format(",\"cat\":\"pending\",\"dur\":{},\"args\":{{\"collective\":{},\"suspended\":{}}}}}",
                         us(e.dur), quoted(e.text), e.a0 ? "true" : "false");
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

}  // namespace

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
  save(resolve_path(path, pid), w.finish());
  if (print_summary) std::fputs(summary(events).c_str(), stderr);
}

}  // namespace pmap::detail::tracing
