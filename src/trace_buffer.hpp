// The events pmap::trace records (src/trace.cpp) and writes as Chrome trace JSON
// (src/trace_writer.cpp). Private to the library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pmap::detail {
class Team;
}

namespace pmap::detail::tracing {

/// What an event is; decides how it is written.
/// started: a started collective (SPEC 11), from its start to its completion (an async slice:
/// several may be in flight on one track); pending_wait: a Pending's wait() (a0: whether the
/// device suspended in it, filled in by the writer).
enum class Kind : std::uint8_t { call, kernel, collective, wait, running, suspend, resume, counter, started, pending_wait };

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

/// Writes the trace of `buffers` (recording has stopped) to `path` as process `pid` (its
/// "{process}" replaced by pid), and
/// the collectives' table to stderr if `print_summary`.
void write(const std::string& path, const std::vector<std::shared_ptr<Buffer>>& buffers, int pid,
           bool print_summary);

}  // namespace pmap::detail::tracing
