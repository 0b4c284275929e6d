// The MPI transport of multi-process pmap. Only this file sees MPI.
#include "pmap/detail/distributed.hpp"

#include <fmt/format.h>

#include <cstring>
#include <functional>
#include <stdexcept>

#include "pmap/detail/dispatch.hpp"
#include "pmap/detail/errors.hpp"
#include "pmap/detail/team.hpp"
#include "pmap/errors.hpp"
#include "pmap/distributed.hpp"
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

std::vector<Header> exchange_headers(const Header& mine) {
  std::vector<Header> all(static_cast<std::size_t>(size()));
#if PMAP_WITH_MPI
  if (size() > 1) {
    check(MPI_Allgather(&mine, sizeof(Header), MPI_BYTE, all.data(), sizeof(Header), MPI_BYTE,
                        state().comm),
          "MPI_Allgather");
    return all;
  }
#endif
  all[0] = mine;
  return all;
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

void allgather(const void* in, std::size_t bytes, void* out) {
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
    check(MPI_Allgather(in, static_cast<int>(count), type, out, static_cast<int>(count), type,
                        state().comm),
          "MPI_Allgather");
    return;
  }
#endif
  std::memcpy(out, in, bytes);
}

bool allreduce(void* data, std::size_t count, DType dtype, ReduceOp op) {
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
    check(MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), type, mpi_op, state().comm),
          "MPI_Allreduce");
  }
  return true;
#else
  (void)data, (void)count, (void)dtype, (void)op;
  return size() == 1;
#endif
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
    all = exchange_headers(mine);
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
  mine.signature = std::hash<std::string>{}(text);
  mine.message_bytes = text.size();
  const std::vector<mpi::Header> all = mpi::exchange_headers(mine);
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
#if PMAP_WITH_MPI
  int already = 0;
  detail::mpi::check(MPI_Initialized(&already), "MPI_Initialized");
  if (!already) {
    int provided = 0;
    detail::mpi::check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided),
                       "MPI_Init_thread");
    s.owns_mpi = true;
  }
  detail::mpi::check(MPI_Comm_dup(MPI_COMM_WORLD, &s.comm), "MPI_Comm_dup");
  detail::mpi::check(MPI_Comm_size(s.comm, &s.size), "MPI_Comm_size");
  detail::mpi::check(MPI_Comm_rank(s.comm, &s.rank), "MPI_Comm_rank");
#endif
  s.initialized = true;
  Runtime::global().span_processes();
}

void finalize() {
  auto& s = detail::mpi::state();
  if (!s.initialized) return;
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
