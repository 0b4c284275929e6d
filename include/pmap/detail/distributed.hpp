/// @file distributed.hpp
/// @brief The MPI transport below multi-process teams (no MPI types in this header).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pmap::detail::mpi {

/// Process count and index of the pmap communicator (1 and 0 without MPI).
int size();
int rank();

/// What a process brings to an exchange: every exchange starts with one round of headers,
/// so a process that failed (or finished its call) meets the others instead of hanging them.
enum class Status : std::int32_t {
  ok = 0,          ///< in a collective / agreeing on a call
  failed = 1,      ///< validation failed on this process
  done = 2,        ///< the call finished here
  done_failed = 3, ///< ... with a failure that started here
  done_aborted = 4 ///< ... aborted because of another process
};
struct Header {
  Status status = Status::ok;
  std::int32_t device = -1;          ///< failing device (done_failed, failed)
  std::uint64_t signature = 0;       ///< collective signature / call hash
  std::uint64_t bytes = 0;           ///< payload bytes per process
  std::uint64_t message_bytes = 0;   ///< failure message length
};

/// All processes' headers, in rank order. `waiting_in` names the exchange in the message of
/// a process that waits for the others past PMAP_PROCESS_TIMEOUT.
std::vector<Header> exchange_headers(const Header& mine,
                                     const char* waiting_in = "a collective across processes");
/// Gathers every process's failure message (after a header round that announced them).
std::vector<std::string> exchange_messages(const std::vector<Header>& headers,
                                           const std::string& mine);
/// MPI_Allgather of `bytes` per process into `out` (size() * bytes).
void allgather(const void* in, std::size_t bytes, void* out);

enum class DType { f32, f64, i32, i64, c64, c128, none };
enum class ReduceOp { sum, max, min };
/// In-place MPI_Allreduce; returns false (nothing done) for a dtype MPI cannot reduce.
bool allreduce(void* data, std::size_t count, DType dtype, ReduceOp op);

/// The end of a multi-process call: rounds of headers until every process is done; returns
/// the first failure of another process (process, device, message), if any.
struct Failure {
  bool failed = false;
  int process = -1;
  int device = -1;
  std::string message;
};
Failure finish_call(Status status, int device, const std::string& message);

}  // namespace pmap::detail::mpi
