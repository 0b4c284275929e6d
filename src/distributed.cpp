// The MPI transport of multi-process pmap. Only this file sees MPI.
#include "pmap/detail/distributed.hpp"
#include "pmap/detail/hash.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "pmap/detail/dispatch.hpp"
#include "pmap/detail/errors.hpp"
#include "pmap/detail/team.hpp"
#include "pmap/detail/trace_events.hpp"
#include "pmap/distributed.hpp"
#include "pmap/errors.hpp"
#include "pmap/runtime.hpp"

#if PMAP_WITH_MPI
#include <mpi.h>
#endif

namespace pmap {
namespace detail::mpi {
namespace {

struct State {
  bool initialized = false;  // distributed::initialize() was called
  bool owns_mpi = false;     // ... and it initialised MPI
  bool thread_multiple = false;  // MPI may be called from any thread at once
  int size = 1;
  int rank = 0;
#if PMAP_WITH_MPI
  MPI_Comm comm = MPI_COMM_NULL;
#endif
};

State& state() {
  static State s;
  return s;
}

/// PMAP_PROCESS_TIMEOUT: seconds a process waits in MPI for the others before it ends the
/// job (unset: 600, as torch.distributed's default; 0: forever).
int process_timeout_from_env() {
  const char* value = std::getenv("PMAP_PROCESS_TIMEOUT");
  if (!value || !*value) return 600;
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  if (*end != '\0' || parsed < 0 || parsed > 1000000)
    raise_value_error(fmt::format(
        "PMAP_PROCESS_TIMEOUT must be a number of seconds (0 waits forever), got '{}'", value));
  return static_cast<int>(parsed);
}

/// Ends the job when this process has waited in one MPI exchange for longer than the
/// timeout. A process that never arrives (it threw before its call, returned early, or its
/// kernel does not return) would otherwise leave every other process blocked in MPI for
/// good: MPI cannot cancel a blocking collective, so the only way out is MPI_Abort, which
/// mpirun turns into the end of every process with an error. The exchanges themselves stay
/// blocking MPI calls (OpenMPI's tuned collectives, not the slower nonblocking schedules);
/// entering and leaving one costs two relaxed atomic increments, and a thread samples them
/// every 100 ms.
class StallWatch {
 public:
  /// Counts one exchange as in progress for its lifetime.
  class Scope {
   public:
    Scope(StallWatch& watch, const char* what) : watch_(watch) {
      watch_.what_.store(what, std::memory_order_relaxed);
      watch_.waiting_.fetch_add(1, std::memory_order_relaxed);
      watch_.epoch_.fetch_add(1, std::memory_order_relaxed);
    }
    ~Scope() {
      watch_.waiting_.fetch_sub(1, std::memory_order_relaxed);
      watch_.epoch_.fetch_add(1, std::memory_order_relaxed);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StallWatch& watch_;
  };

  void start(int seconds) {
    if (seconds == 0 || thread_.joinable()) return;
    stop_ = false;
    timeout_ = std::chrono::seconds(seconds);
    thread_ = std::thread([this] { watch(); });
  }
  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  ~StallWatch() { stop(); }

 private:
  void watch() {
    using clock = std::chrono::steady_clock;
    std::uint64_t last_epoch = epoch_.load(std::memory_order_relaxed);
    clock::time_point since = clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop_; })) {
      const std::uint64_t epoch = epoch_.load(std::memory_order_relaxed);
      const clock::time_point now = clock::now();
      if (epoch != last_epoch || waiting_.load(std::memory_order_relaxed) == 0) {
        last_epoch = epoch;
        since = now;
        continue;
      }
      if (now - since >= timeout_) abort_job();
    }
  }

  [[noreturn]] void abort_job() {
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout_).count();
    std::fprintf(stderr,
                 "pmap: process %d of %d has waited %lld s in %s for the other processes "
                 "(PMAP_PROCESS_TIMEOUT=%lld); a process that never arrives (it failed before "
                 "the call, returned early, or its kernel does not return) would leave the job "
                 "waiting forever: aborting the job\n",
                 state().rank, state().size, static_cast<long long>(seconds),
                 what_.load(std::memory_order_relaxed), static_cast<long long>(seconds));
    std::fflush(stderr);
#if PMAP_WITH_MPI
    // From another thread only when MPI allows it; otherwise the process dies and mpirun
    // ends the others. Open MPI's abort can itself hang in its runtime (PMIx_Abort,
    // open-mpi/ompi#3225; seen here under load with the other process in MPI_Finalize), so a
    // second thread ends this process if the job is not gone a few seconds later: mpirun
    // then ends the others because a process died without finalizing.
    if (state().thread_multiple) {
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::seconds(3));
        std::fputs("pmap: MPI_Abort did not end the job in 3 s: ending this process\n", stderr);
        std::_Exit(EXIT_FAILURE);
      }).detach();
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
#endif
    std::abort();
  }

  std::atomic<int> waiting_{0};
  std::atomic<std::uint64_t> epoch_{0};
  std::atomic<const char*> what_{"MPI"};
  std::chrono::steady_clock::duration timeout_{};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

StallWatch& stall_watch() {
  static StallWatch watch;
  return watch;
}

#if PMAP_WITH_MPI
void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw std::runtime_error(fmt::format("pmap: {} failed: {}", what, std::string(text, len)));
  }
}
#endif

}  // namespace

int size() { return state().size; }
int rank() { return state().rank; }

void Frames::resize(std::size_t bytes) {
  bytes_ = bytes;
  stride_ = (sizeof(Header) + bytes + 63) / 64 * 64;
  const std::size_t needed = stride_ * static_cast<std::size_t>(size());
  if (frames_.size() < needed) frames_.resize(needed);
  headers_.resize(static_cast<std::size_t>(size()));
}

void Frames::exchange(const Header& header, [[maybe_unused]] const char* waiting_in) {
  const int me = rank();
  headers_[static_cast<std::size_t>(me)] = header;
  std::memcpy(payload(me) - sizeof(Header), &header, sizeof(Header));
#if PMAP_WITH_MPI
  if (size() == 1) return;
  constexpr int kFrameTag = 0x706d;
  const int frame = static_cast<int>(sizeof(Header) + bytes_);
  const StallWatch::Scope waiting(stall_watch(), waiting_in);
  thread_local std::vector<MPI_Request> sends;  // grows once: no allocation per round
  sends.assign(static_cast<std::size_t>(size() - 1), MPI_REQUEST_NULL);
  for (int k = 1; k < size(); ++k)
    check(MPI_Isend(payload(me) - sizeof(Header), frame, MPI_BYTE, (me + k) % size(), kFrameTag,
                    state().comm, &sends[static_cast<std::size_t>(k - 1)]),
          "MPI_Isend");
  bool short_frame = false;
  for (int k = 1; k < size(); ++k) {
    const int p = (me + size() - k) % size();
    MPI_Message message;
    MPI_Status status;
    check(MPI_Mprobe(p, kFrameTag, state().comm, &message, &status), "MPI_Mprobe");
    int count = 0;
    check(MPI_Get_count(&status, MPI_BYTE, &count), "MPI_Get_count");
    // A frame of another size is another exchange's (a process that finished its call, or
    // is in another collective): only its header is read.
    unsigned char* into = payload(p) - sizeof(Header);
    if (count != frame) {
      other_.resize(std::max<std::size_t>(static_cast<std::size_t>(count), sizeof(Header)));
      into = other_.data();
    }
    check(MPI_Mrecv(into, count, MPI_BYTE, &message, MPI_STATUS_IGNORE), "MPI_Mrecv");
    short_frame = short_frame || static_cast<std::size_t>(count) < sizeof(Header);
    std::memcpy(&headers_[static_cast<std::size_t>(p)], into, sizeof(Header));
  }
  check(MPI_Waitall(static_cast<int>(sends.size()), sends.data(), MPI_STATUSES_IGNORE),
        "MPI_Waitall");
  if (short_frame) throw std::runtime_error("pmap: a message from another process is not a frame");
#endif
}

const std::vector<Header>& exchange_headers(const Header& mine, const char* waiting_in) {
  thread_local Frames frames;
  frames.resize(0);
  frames.exchange(mine, waiting_in);
  return frames.headers();
}

std::vector<std::string> exchange_messages(const std::vector<Header>& headers,
                                           const std::string& mine) {
  std::vector<std::string> out(headers.size());
#if PMAP_WITH_MPI
  if (size() > 1) {
    std::vector<int> counts, displs;
    int total = 0;
    for (const Header& h : headers) {
      counts.push_back(static_cast<int>(h.message_bytes));
      displs.push_back(total);
      total += static_cast<int>(h.message_bytes);
    }
    std::vector<char> buffer(static_cast<std::size_t>(total) + 1);
    const StallWatch::Scope waiting(stall_watch(), "an exchange of failure messages");
    check(MPI_Allgatherv(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, buffer.data(),
                         counts.data(), displs.data(), MPI_CHAR, state().comm),
          "MPI_Allgatherv");
    for (std::size_t p = 0; p < headers.size(); ++p)
      out[p].assign(buffer.data() + displs[p], static_cast<std::size_t>(counts[p]));
    return out;
  }
#endif
  out[0] = mine;
  return out;
}

void allgather_in_place([[maybe_unused]] void* data, [[maybe_unused]] std::size_t bytes) {
#if PMAP_WITH_MPI
  if (size() > 1) {
    // Counts are ints in MPI: move big payloads as larger elements.
    MPI_Datatype type = MPI_BYTE;
    std::size_t count = bytes;
    if (bytes % 8 == 0 && bytes / 8 <= static_cast<std::size_t>(INT32_MAX)) {
      type = MPI_UINT64_T;
      count = bytes / 8;
    }
    if (count > static_cast<std::size_t>(INT32_MAX))
      throw std::length_error("pmap: collective payload too large for MPI_Allgather");
    const StallWatch::Scope waiting(stall_watch(), "a collective across processes");
    check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, static_cast<int>(count), type,
                        state().comm),
          "MPI_Allgather");
  }
#endif
}

std::size_t element_bytes(DType dtype) {
  switch (dtype) {
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f64:
    case DType::i64:
    case DType::c64:
      return 8;
    case DType::c128:
      return 16;
    case DType::none:
      break;
  }
  return 0;
}

bool allreduce(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) {
#if PMAP_WITH_MPI
  MPI_Datatype type = MPI_DATATYPE_NULL;
  switch (dtype) {
    case DType::f32: type = MPI_FLOAT; break;
    case DType::f64: type = MPI_DOUBLE; break;
    case DType::i32: type = MPI_INT32_T; break;
    case DType::i64: type = MPI_INT64_T; break;
    case DType::c64: type = MPI_C_FLOAT_COMPLEX; break;
    case DType::c128: type = MPI_C_DOUBLE_COMPLEX; break;
    case DType::none: return false;
  }
  if ((dtype == DType::c64 || dtype == DType::c128) && op != ReduceOp::sum) return false;
  if (count > static_cast<std::size_t>(INT32_MAX)) return false;
  if (size() > 1) {
    const MPI_Op mpi_op = op == ReduceOp::sum ? MPI_SUM : op == ReduceOp::max ? MPI_MAX : MPI_MIN;
    const StallWatch::Scope waiting(stall_watch(), "a reduction across processes");
    check(MPI_Allreduce(in == out ? MPI_IN_PLACE : in, out, static_cast<int>(count), type, mpi_op,
                        state().comm),
          "MPI_Allreduce");
    return true;
  }
#endif
  (void)op;
  if (dtype == DType::none || size() > 1) return false;
  if (in != out) std::memcpy(out, in, count * element_bytes(dtype));
  return true;
}

Failure finish_call(Status status, int device, const std::string& message) {
  Failure result;
  if (size() == 1) return result;
  const bool failed = status != Status::done;
  Header mine;
  mine.status = status;
  mine.device = device;
  mine.message_bytes = failed ? message.size() : 0;
  // Processes still inside a collective meet this header there, fail, and come here too.
  std::vector<Header> all;
  for (;;) {
    all = exchange_headers(mine, "the end of a call");
    bool everyone_done = true;
    for (const Header& h : all)
      everyone_done = everyone_done && (h.status == Status::done || h.status == Status::done_failed ||
                                        h.status == Status::done_aborted);
    if (everyone_done) break;
  }
  bool any_failed = false;
  for (const Header& h : all) any_failed = any_failed || h.status != Status::done;
  if (!any_failed) return result;
  const std::vector<std::string> messages = exchange_messages(all, failed ? message : std::string());
  // The failure that started it; else (a process skipped a collective) one it caused.
  for (Status wanted : {Status::done_failed, Status::done_aborted})
    for (std::size_t p = 0; p < all.size() && !result.failed; ++p)
      if (all[p].status == wanted && static_cast<int>(p) != rank())
        result = Failure{true, static_cast<int>(p), all[p].device, messages[p]};
  return result;
}

}  // namespace detail::mpi

namespace detail {

void agree_on_call(Verdict verdict, const std::string& error, std::int64_t n,
                   const std::vector<LeafInfo>& leaves) {
  std::string description;
  if (verdict == Verdict::valid) {
    std::vector<std::string> shapes;
    for (const LeafInfo& leaf : leaves)
      shapes.push_back(fmt::format("{} of {}", leaf.path, format_typed_shape(leaf.dtype, leaf.shape)));
    description = fmt::format("axis size {} with {}", n, fmt::join(shapes, ", "));
  }
  mpi::Header mine;
  mine.status = verdict == Verdict::valid ? mpi::Status::ok : mpi::Status::failed;
  mine.device = static_cast<std::int32_t>(verdict);
  const std::string& text = verdict == Verdict::valid ? description : error;
  mine.signature = hash_bytes(kHashSeed, text.data(), text.size());  // the same on every build
  mine.message_bytes = text.size();
  const std::vector<mpi::Header>& all = mpi::exchange_headers(mine, "the start of a call");
  bool any_failed = false, differ = false;
  for (const mpi::Header& h : all) {
    any_failed = any_failed || h.status != mpi::Status::ok;
    differ = differ || h.signature != all[0].signature;
  }
  if (!any_failed && !differ) return;
  const std::vector<std::string> texts = mpi::exchange_messages(all, text);
  for (std::size_t p = 0; p < all.size(); ++p)
    if (all[p].status != mpi::Status::ok) {
      if (all[p].device == static_cast<std::int32_t>(Verdict::type_error)) throw TypeError(texts[p]);
      throw ValueError(texts[p]);
    }
  std::vector<std::string> lines;
  for (std::size_t p = 0; p < all.size(); ++p)
    lines.push_back(fmt::format("process {} passed {}", p, texts[p]));
  throw ValueError(fmt::format(
      "pmap got different arguments on different processes; every process must pass the same "
      "local axis size and shapes: {}",
      fmt::join(lines, "; ")));
}

void finish_distributed_call(const Team& team) {
  const std::exception_ptr error = team.error();
  std::string message;
  bool remote_cause = false;
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const RemoteFailure& e) {
      remote_cause = true;
      message = e.what();
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
      message = "an exception that is not a std::exception";
    }
  }
  const mpi::Status status = !error         ? mpi::Status::done
                             : remote_cause ? mpi::Status::done_aborted
                                            : mpi::Status::done_failed;
  const mpi::Failure failure = mpi::finish_call(status, team.error_device(), message);
  if (failure.failed && (!error || remote_cause))
    throw DeviceError(failure.device,
                      fmt::format("pmap: device {} on process {} failed: {}", failure.device,
                                  failure.process, failure.message));
  if (error) std::rethrow_exception(error);
}

}  // namespace detail

namespace distributed {

void initialize() {
  auto& s = detail::mpi::state();
  if (s.initialized) return;
  const int timeout = detail::mpi::process_timeout_from_env();  // a bad value fails before MPI starts
#if PMAP_WITH_MPI
  int already = 0;
  detail::mpi::check(MPI_Initialized(&already), "MPI_Initialized");
  if (!already) {
    int provided = 0;
    detail::mpi::check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided),
                       "MPI_Init_thread");
    s.owns_mpi = true;
  }
  int level = 0;
  detail::mpi::check(MPI_Query_thread(&level), "MPI_Query_thread");
  s.thread_multiple = level == MPI_THREAD_MULTIPLE;
  detail::mpi::check(MPI_Comm_dup(MPI_COMM_WORLD, &s.comm), "MPI_Comm_dup");
  detail::mpi::check(MPI_Comm_size(s.comm, &s.size), "MPI_Comm_size");
  detail::mpi::check(MPI_Comm_rank(s.comm, &s.rank), "MPI_Comm_rank");
#endif
  if (s.size > 1) detail::mpi::stall_watch().start(timeout);
  s.initialized = true;
  detail::tracing::set_process(s.rank, s.size);
  Runtime::global().span_processes();
}

void finalize() {
  auto& s = detail::mpi::state();
  if (!s.initialized) return;
  detail::mpi::stall_watch().stop();
#if PMAP_WITH_MPI
  MPI_Comm_free(&s.comm);
  if (s.owns_mpi) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
#endif
  s = detail::mpi::State{};
}

bool is_initialized() { return detail::mpi::state().initialized; }

}  // namespace distributed
}  // namespace pmap
