/// @file cpu_relax.hpp
/// @brief The pause of a spin-wait loop (x86's PAUSE; nothing elsewhere).
#pragma once

namespace pmap::detail {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace pmap::detail
