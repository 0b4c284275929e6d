/// @file memory.hpp
/// @brief Large result buffers: transparent huge pages before the first write, and copies
/// that stream past the caches.
#pragma once

#include <cstddef>
#include <cstring>

namespace pmap::detail {

/// Results of several MiB are written once by the devices, right after allocation: asking
/// for transparent huge pages first turns ~250 page faults per MiB into ~1 (Linux
/// madvise(MADV_HUGEPAGE) on the 2 MiB-aligned interior; a no-op elsewhere).
void advise_huge_pages(void* data, std::size_t bytes);

inline constexpr std::size_t kHugePageThreshold = std::size_t{4} << 20;

/// Calls advise_huge_pages for buffers above kHugePageThreshold.
inline void prepare_result(void* data, std::size_t bytes) {
  if (bytes >= kHugePageThreshold) advise_huge_pages(data, bytes);
}

/// memcpy with streaming (non-temporal) stores: the destination lines go to memory without
/// first being read into the cache (a plain copy reads every destination line before it
/// writes it, one third more memory traffic), and without evicting the cache.
void stream_copy(void* dst, const void* src, std::size_t bytes);

/// A collective streams its copies when its result does not fit in a core's L2 anyway (the
/// caller would read it back from memory either way): one device copying 64 MiB, 6.7 GB/s
/// with memcpy, 9.3 GB/s streamed on the 2-vCPU VM; 4 MiB: 9.3 vs 13.8 GB/s.
inline constexpr std::size_t kStreamBytes = std::size_t{4} << 20;
/// Runs shorter than this are plain copies even in a streamed collective.
inline constexpr std::size_t kStreamRunBytes = 4096;

inline bool streams(std::size_t result_bytes) { return result_bytes >= kStreamBytes; }
/// streams() for a result tensor.
template <class Tensor>
bool streams_into(const Tensor& result) {
  return streams(static_cast<std::size_t>(result.size()) * sizeof(typename Tensor::Scalar));
}

/// One run of a collective's copy: streamed when `stream` (see streams()) and long enough.
/// Empty runs return at once: an empty tensor's data() is nullptr, which memcpy must not see.
inline void copy_run(void* dst, const void* src, std::size_t bytes, bool stream) {
  if (bytes == 0) return;
  if (stream && bytes >= kStreamRunBytes)
    stream_copy(dst, src, bytes);
  else
    std::memcpy(dst, src, bytes);
}

}  // namespace pmap::detail
