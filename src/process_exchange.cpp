#include "pmap/detail/process_exchange.hpp"

#include <fmt/format.h>

#include <cstring>

namespace pmap::detail {
namespace {

/// The header round of a collective: every process must be in the same collective.
std::string check_headers(const Slot& mine, std::uint64_t bytes) {
  mpi::Header header;
  header.signature = mine.signature.load(std::memory_order_relaxed);
  header.bytes = bytes;
  const std::vector<mpi::Header> all = mpi::exchange_headers(header);
  for (std::size_t p = 0; p < all.size(); ++p) {
    if (all[p].status != mpi::Status::ok)
      return fmt::format("{} over axis {}: process {} waits in it, but process {} {}",
                         mine.desc.name, mine.axes, mpi::rank(), p,
                         all[p].status == mpi::Status::done ? "returned from its kernels without calling it"
                                                            : "failed or aborted");
    if (all[p].signature != header.signature)
      return fmt::format("{}: process {} called {} over axis {} on {}, but process {} called a "
                         "different collective or shape; every process must call the same "
                         "collectives in the same order with the same shapes",
                         mine.desc.name, mpi::rank(), mine.desc.name, mine.axes,
                         format_typed_shape(mine.desc.dtype, mine.desc.shape), p);
  }
  return {};
}

}  // namespace

void ProcessExchange::gather(const Slot& mine, const Slot* local, int count, int size,
                             std::size_t bytes) {
  complete_ = false;
  error_ = check_headers(mine, bytes);
  if (error_.empty()) {
    send_.resize(static_cast<std::size_t>(count) * bytes);
    for (int k = 0; k < count && bytes > 0; ++k)
      std::memcpy(send_.data() + static_cast<std::size_t>(k) * bytes, local[k].published_in(),
                  bytes);
    gathered_.resize(static_cast<std::size_t>(size) * bytes);
    mpi::allgather(send_.data(), send_.size(), gathered_.data());
  }
  complete_ = true;
}

void ProcessExchange::reduce(const Slot& mine, void* data, std::size_t count, mpi::DType dtype,
                             mpi::ReduceOp op) {
  complete_ = false;
  error_ = check_headers(mine, count);
  if (error_.empty()) mpi::allreduce(data, count, dtype, op);
  complete_ = true;
}

std::string ProcessExchange::error(const Slot& mine) const {
  if (!complete_)
    return fmt::format("{} over axis {}: the exchange with the other processes did not complete",
                       mine.desc.name, mine.axes);
  return error_;
}

}  // namespace pmap::detail
