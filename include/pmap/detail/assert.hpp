/// @file assert.hpp
/// @brief PMAP_ASSERT: internal invariants, checked in debug builds, compiled out in release
/// (NDEBUG). Never for user input: that is validated, with SPEC's error texts.
#pragma once

#include <cstdio>
#include <cstdlib>

#if defined(NDEBUG)
#define PMAP_ASSERT(condition) static_cast<void>(0)
#else
#define PMAP_ASSERT(condition)                                                             \
  ((condition) ? static_cast<void>(0)                                                      \
               : ::pmap::detail::assertion_failed(#condition, __FILE__, __LINE__))
#endif

namespace pmap::detail {

[[noreturn]] inline void assertion_failed(const char* condition, const char* file, int line) {
  std::fprintf(stderr, "pmap: internal invariant violated: %s (%s:%d)\n", condition, file, line);
  std::abort();
}

}  // namespace pmap::detail
