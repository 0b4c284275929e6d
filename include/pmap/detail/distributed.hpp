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

/// All processes' headers, in rank order (valid until the calling thread's next exchange).
/// `waiting_in` names the exchange in the message of a process that waits for the others
/// past PMAP_PROCESS_TIMEOUT.
const std::vector<Header>& exchange_headers(
    const Header& mine, const char* waiting_in = "a collective across processes");

/// One round of frames: a header followed by `bytes` of payload, from every process to every
/// other in one point-to-point message each. A round meets any other round (a frame's size
/// is probed, not assumed), so a process in a collective learns from the header of a process
/// that finished its call or disagrees, without a second MPI call for the payload.
class Frames {
 public:
  /// Room for every process's frame of `bytes` payload.
  void resize(std::size_t bytes);
  /// This process's payload, to be written before exchange().
  unsigned char* mine() { return payload(rank()); }
  /// Sends this process's frame (`header`, mine()) and receives the others'. Another
  /// process's payload is in place when its frame had the same size, which every process of
  /// the same collective (the same signature) sends.
  void exchange(const Header& header, const char* waiting_in);
  const std::vector<Header>& headers() const { return headers_; }
  unsigned char* payload(int process) {
    return frames_.data() + static_cast<std::size_t>(process) * stride_ + sizeof(Header);
  }
  const unsigned char* payload(int process) const {
    return frames_.data() + static_cast<std::size_t>(process) * stride_ + sizeof(Header);
  }

 private:
  std::size_t bytes_ = 0, stride_ = sizeof(Header);
  std::vector<unsigned char> frames_, other_;  // other_: a frame of an unexpected size
  std::vector<Header> headers_;
};

/// Payloads up to this size travel in the frame of the collective's header round; larger
/// ones in an MPI_Allgather or MPI_Allreduce after it.
inline constexpr std::size_t kFramePayloadBytes = 64 * 1024;
/// Gathers every process's failure message (after a header round that announced them).
std::vector<std::string> exchange_messages(const std::vector<Header>& headers,
                                           const std::string& mine);
/// MPI_Allgather, in place: process p's `bytes` are at data + p * bytes (this process's
/// written before the call).
void allgather_in_place(void* data, std::size_t bytes);

enum class DType { f32, f64, i32, i64, c64, c128, none };
enum class ReduceOp { sum, max, min };
/// Bytes of one element of `dtype`.
std::size_t element_bytes(DType dtype);
/// MPI_Allreduce of `in` into `out` (in place when they are the same); returns false
/// (nothing done) for a dtype MPI cannot reduce.
bool allreduce(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op);

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
