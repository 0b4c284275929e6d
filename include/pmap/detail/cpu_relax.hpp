/// @file cpu_relax.hpp
/// @brief The pause of a spin-wait loop: x86's PAUSE, Arm's YIELD hint (ACLE), nothing
/// elsewhere.
#pragma once

#if defined(__aarch64__) || defined(__arm__)
#include <arm_acle.h>
#endif

namespace pmap::detail {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  __yield();
#endif
}

}  // namespace pmap::detail
