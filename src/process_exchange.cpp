#include "pmap/detail/process_exchange.hpp"

#include <fmt/format.h>

#include <cstring>

namespace pmap::detail {
namespace {

/// The verdict of a header round: every process must be in the same collective.
std::string check_headers(const Slot& mine, const std::vector<mpi::Header>& all) {
  const std::uint64_t signature = mine.signature.load(std::memory_order_relaxed);
  for (std::size_t p = 0; p < all.size(); ++p) {
    if (all[p].status != mpi::Status::ok)
      return fmt::format("{} over axis {}: process {} waits in it, but process {} {}",
                         mine.desc.name, mine.axes, mpi::rank(), p,
                         all[p].status == mpi::Status::done ? "returned from its kernels without calling it"
                                                            : "failed or aborted");
    if (all[p].signature != signature)
      return fmt::format("{}: process {} called {} over axis {} on {}, but process {} called a "
                         "different collective or shape; every process must call the same "
                         "collectives in the same order with the same shapes",
                         mine.desc.name, mpi::rank(), mine.desc.name, mine.axes,
                         format_typed_shape(mine.desc.dtype, mine.desc.shape), p);
  }
  return {};
}

}  // namespace

void ProcessExchange::exchange_frames(const Slot& mine, std::uint64_t bytes) {
  mpi::Header header;
  header.signature = mine.signature.load(std::memory_order_relaxed);
  header.bytes = bytes;
  frames_.exchange(header, "a collective across processes");
  error_ = check_headers(mine, frames_.headers());
}

void ProcessExchange::gather(const Slot& mine, const Slot* local, int count, std::size_t bytes) {
  complete_ = false;
  count_ = count;
  const std::size_t payload = static_cast<std::size_t>(count) * bytes;
  inline_ = payload <= mpi::kFramePayloadBytes;
  frames_.resize(inline_ ? payload : 0);
  if (!inline_) gathered_.resize(static_cast<std::size_t>(mpi::size()) * payload);
  unsigned char* const here =
      inline_ ? frames_.mine() : gathered_.data() + static_cast<std::size_t>(mpi::rank()) * payload;
  for (int k = 0; k < count && bytes > 0; ++k)
    std::memcpy(here + static_cast<std::size_t>(k) * bytes, local[k].published_in(), bytes);
  exchange_frames(mine, bytes);
  if (error_.empty() && !inline_) mpi::allgather_in_place(gathered_.data(), payload);
  complete_ = true;
}

const unsigned char* ProcessExchange::gathered(int member, std::size_t bytes) const {
  const int process = member / count_;
  const std::size_t local = static_cast<std::size_t>(member % count_) * bytes;
  if (inline_) return frames_.payload(process) + local;
  return gathered_.data() + static_cast<std::size_t>(process * count_) * bytes + local;
}

bool ProcessExchange::reduce(const Slot& mine, const void* in, void* out, std::size_t count,
                             mpi::DType dtype, mpi::ReduceOp op) {
  complete_ = false;
  const std::size_t bytes = count * mpi::element_bytes(dtype);
  const bool in_frame = bytes <= mpi::kFramePayloadBytes;
  frames_.resize(in_frame ? bytes : 0);
  if (in_frame && bytes > 0) std::memcpy(frames_.mine(), in, bytes);
  exchange_frames(mine, count);
  if (error_.empty() && !in_frame) mpi::allreduce(in, out, count, dtype, op);
  complete_ = true;
  return error_.empty() && in_frame;
}

std::string ProcessExchange::error(const Slot& mine) const {
  if (!complete_)
    return fmt::format("{} over axis {}: the exchange with the other processes did not complete",
                       mine.desc.name, mine.axes);
  return error_;
}

}  // namespace pmap::detail
