/// @file cpu_relax.hpp
/// @brief The pause of a spin-wait loop: x86's PAUSE, Arm's YIELD hint (GCC 12's arm_acle.h
/// has no __yield), nothing elsewhere.
#pragma once

namespace pmap::detail {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace pmap::detail
