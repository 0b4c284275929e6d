/// @file process_exchange.hpp
/// @brief The MPI side of a collective whose team spans processes: the local leader's one
/// exchange per collective (a round of frames whose headers check that every process calls
/// the same collective and whose payloads carry the data up to mpi::kFramePayloadBytes; above
/// that, one MPI_Allgather or MPI_Allreduce after it), and what the other local devices learn
/// of it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "pmap/detail/distributed.hpp"
#include "pmap/detail/slot.hpp"

namespace pmap::detail {

class ProcessExchange {
 public:
  /// Leader only: the inputs of the local slots [local, local + count) (`bytes` each) of
  /// every process, `count` per process, afterwards read by gathered().
  void gather(const Slot& mine, const Slot* local, int count, std::size_t bytes);
  /// Leader only: the reduction over processes of `in` (`count` elements each). Up to
  /// mpi::kFramePayloadBytes the contributions travel in the frames and the caller combines
  /// them with its own kernel, in process order (the same bits on every process): returns
  /// true, and contribution(p) is process p's. Above, MPI_Allreduce writes `out` (`in` may be
  /// `out`): returns false, as after a failure.
  bool reduce(const Slot& mine, const void* in, void* out, std::size_t count, mpi::DType dtype,
              mpi::ReduceOp op);
  const unsigned char* contribution(int process) const { return frames_.payload(process); }
  /// After the exchange, on every local device: whether it went wrong (another process
  /// disagreed, or the leader left it by an exception), and what to say, from `mine`.
  bool failed() const { return !complete_ || !error_.empty(); }
  std::string error(const Slot& mine) const;
  /// After gather(): member `member`'s input (members in process order, `count` each).
  const unsigned char* gathered(int member, std::size_t bytes) const;
  void reset() {
    error_.clear();
    complete_ = true;
  }

 private:
  /// The header round of a collective of `bytes` (per process), with frames_'s payloads.
  void exchange_frames(const Slot& mine, std::uint64_t bytes);

  mpi::Frames frames_;                   // written by the leader only
  std::vector<unsigned char> gathered_;  // a gather too large for a frame, in process order
  int count_ = 1;                        // members per process of the last gather
  bool inline_ = true;                   // the last gather's inputs are in frames_
  std::string error_;     ///< the header round's verdict, empty if every process agreed
  bool complete_ = true;  ///< false while the leader is inside an exchange
};

}  // namespace pmap::detail
