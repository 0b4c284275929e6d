/// @file hash.hpp
/// @brief The one hash of the library: collective signatures that devices (and processes)
/// compare to agree on what they are calling.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pmap::detail {

/// FNV-1a's offset basis: where every signature starts.
inline constexpr std::uint64_t kHashSeed = 0xcbf29ce484222325ULL;

/// Folds `v` into `h` (FNV-1a's prime, then the golden ratio, so that zeros still move it).
constexpr std::uint64_t hash_mix(std::uint64_t h, std::uint64_t v) {
  return (h ^ v) * 0x100000001b3ULL + 0x9e3779b97f4a7c15ULL;
}

/// Folds `size` bytes at `data` into `h`.
std::uint64_t hash_bytes(std::uint64_t h, const void* data, std::size_t size);

}  // namespace pmap::detail
