/// @file memory.hpp
/// @brief Large result buffers: transparent huge pages before the first write.
#pragma once

#include <cstddef>

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

}  // namespace pmap::detail
