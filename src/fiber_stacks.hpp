// Fiber stacks (fibers.cpp): mmap'd, a guard page below, kept between calls by each thread
// (a few) and by the process (up to 256), so that a call makes no system call for them once
// the first calls have run and their pages stay touched. Private to the library.
#pragma once

#include <cstddef>

namespace pmap::detail::fibers {

/// The system's page size.
std::size_t page_bytes();

/// A stack mapping's size: oneTBB's worker stack size (at least 256 KiB), and the guard page.
std::size_t stack_bytes();

/// A mapping of stack_bytes() whose lowest page is the guard; throws std::bad_alloc. Only a
/// Scheduler's loop takes and gives stacks, never a fiber, so that the thread is the loop's
/// own.
void* take_stack();

/// Gives a mapping of take_stack() back, to this thread's few or the process's cache.
void give_stack(void* mapping);

}  // namespace pmap::detail::fibers
