// Which device each thread of a fibers::run() call starts next (src/fibers.cpp): the claims
// of the call's indices, cut into one block per thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace pmap::detail::fibers {

/// Who started which of a call's n indices, and which threads came.
/// The indices are cut into one block per thread, as a static parallel_for would; a thread
/// starts the devices of its own block; once all it started have returned, the unstarted
/// ones of any block (it has nothing else to do for the rest of the call); while some of
/// its own wait, those of a block whose thread has not come only after idling a while
/// (StealDelay, in fibers.cpp): a device stays on the thread that started it, so one taken
/// early from a thread that was just waking up would leave that thread with less to do for
/// the whole call. Stealing is what makes progress certain all the same: oneTBB does not promise
/// that a task runs while another waits.
struct Claims {
  Claims(int count, int threads)
      : n(count),
        blocks(std::min(count, threads)),
        flags(n + blocks > kInline ? new std::atomic<bool>[static_cast<std::size_t>(n + blocks)]()
                                   : nullptr),
        started(flags ? flags.get() : inline_flags),
        arrived(started + n) {}
  int block_begin(int b) const { return static_cast<int>(std::int64_t{n} * b / blocks); }
  /// Every index was started: a thread that comes now has nothing to do.
  bool all_started() const {
    for (int i = 0; i < n; ++i)
      if (!started[i].load(std::memory_order_relaxed)) return false;
    return true;
  }
  bool claim(int i) {
    std::atomic<bool>& s = started[i];
    return !s.load(std::memory_order_relaxed) && !s.exchange(true, std::memory_order_relaxed);
  }
  /// An index nobody started in a block whose thread has not come, claimed if `take`.
  int unclaimed_elsewhere(int mine, bool take) {
    for (int b = 0; b < blocks; ++b) {
      if (b == mine || arrived[b].load(std::memory_order_acquire)) continue;
      for (int i = block_begin(b); i < block_begin(b + 1); ++i)
        if (take ? claim(i) : !started[i].load(std::memory_order_relaxed)) return i;
    }
    return -1;
  }
  /// Where a thread's search of the other blocks for unstarted indices goes on (every index
  /// it passed was started: one taken stays taken for the call).
  struct Cursor {
    int block = 0;
    int next = -1;  ///< the next index of `block` to try; -1 before its last
    int begin = 0;  ///< `block`'s first index
  };
  /// An index nobody started in another block, whether its thread came or not, claimed: the
  /// last of its block (its thread claims from the first up).
  int claim_any_elsewhere(int mine, Cursor& c) {
    for (; c.block < blocks; ++c.block, c.next = -1) {
      if (c.block == mine) continue;
      if (c.next < 0) {
        c.begin = block_begin(c.block);
        c.next = block_begin(c.block + 1) - 1;
      }
      for (; c.next >= c.begin; --c.next)
        if (claim(c.next)) return c.next--;
    }
    return -1;
  }

  static constexpr int kInline = 128;
  const int n;
  const int blocks;
  std::atomic<bool> inline_flags[kInline] = {};
  std::unique_ptr<std::atomic<bool>[]> flags;
  std::atomic<bool>* const started;  ///< per index: a thread took it
  std::atomic<bool>* const arrived;  ///< per block: its thread runs its loop
};

}  // namespace pmap::detail::fibers
