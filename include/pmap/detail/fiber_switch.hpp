/// @file fiber_switch.hpp
/// @brief oneTBB's fiber switches without a system call each (src/fiber_switch.cpp).
#pragma once

namespace pmap::detail {

/// Once per process, before the first device suspends: oneTBB's calls of swapcontext() go to
/// pmap's switch, which leaves the signal mask alone (PMAP_FAST_SWITCH=0: not done). Returns
/// whether oneTBB now switches with it.
bool install_fiber_switch();

/// Whether this thread runs with a user-space shadow stack (Linux 6.6+, ARCH_SHSTK_STATUS):
/// a switch of stacks that does not switch it too would fault at the next return.
bool shadow_stack_enabled();

}  // namespace pmap::detail
