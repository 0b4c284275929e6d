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

/// Asks for the cache line at `p` in the state a store needs (x86's PREFETCHW, Arm's PRFM
/// PSTL1KEEP): a line that a peer polls is fetched back before the store that publishes to
/// it, so that the stores behind it do not wait in the store buffer meanwhile.
inline void prefetch_for_write(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  // GCC's intrinsic needs -mprfchw (and drops a target("prfchw") function inlined into
  // code without it); the encoding is a NOP on x86 CPUs that predate the instruction.
  asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 1, 3);
#endif
}

}  // namespace pmap::detail
