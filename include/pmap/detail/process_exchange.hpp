/// @file process_exchange.hpp
/// @brief The MPI side of a collective whose team spans processes: the local leader's one
/// exchange per collective (a header round that checks every process calls the same
/// collective, then one allgather or allreduce), and what the other local devices learn of it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "pmap/detail/distributed.hpp"
#include "pmap/detail/slot.hpp"

namespace pmap::detail {

class ProcessExchange {
 public:
  /// Leader only: the header round, then the inputs of the local slots [local, local +
  /// count) (`bytes` each) of every process into gathered(), `size` inputs in all.
  void gather(const Slot& mine, const Slot* local, int count, int size, std::size_t bytes);
  /// Leader only: the header round, then an in-place allreduce of `data`.
  void reduce(const Slot& mine, void* data, std::size_t count, mpi::DType dtype,
              mpi::ReduceOp op);
  /// After the exchange, on every local device: whether it went wrong (another process
  /// disagreed, or the leader left it by an exception), and what to say, from `mine`.
  bool failed() const { return !complete_ || !error_.empty(); }
  std::string error(const Slot& mine) const;
  const unsigned char* gathered() const { return gathered_.data(); }
  void reset() {
    error_.clear();
    complete_ = true;
  }

 private:
  std::vector<unsigned char> send_, gathered_;  // written by the leader only
  std::string error_;      ///< the header round's verdict, empty if every process agreed
  bool complete_ = true;   ///< false while the leader is inside an exchange
};

}  // namespace pmap::detail
