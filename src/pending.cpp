// The queue of started collectives of one device (SPEC 11, pmap/pending.hpp).
#include <algorithm>
#include <exception>

#include <new>

#include "pmap/context.hpp"
#include "pmap/detail/errors.hpp"
#include "pmap/detail/sanitizers.hpp"
#include "pmap/detail/trace_events.hpp"

namespace pmap {
namespace detail {
namespace {

/// Started collectives up to this size are allocated as blocks of it, of which a thread keeps
/// up to kKeptBlocks freed ones for the next (a started ppermute of a tensor is about 600
/// bytes). Under the sanitizers every one is allocated anew, so that they see each lifetime.
constexpr std::size_t kBlockBytes = 1024;
constexpr int kKeptBlocks = 8;

struct KeptBlocks {
  void* blocks[kKeptBlocks] = {};
  int count = 0;
  ~KeptBlocks();
};
/// Set once the thread's KeptBlocks are destroyed (trivially destructible, so it stays
/// readable): a collective freed after that, by another thread_local's destructor, is
/// freed at once.
thread_local bool blocks_gone = false;
thread_local KeptBlocks kept_blocks;

KeptBlocks::~KeptBlocks() {
  blocks_gone = true;
  for (int k = 0; k < count; ++k) ::operator delete(blocks[k]);
}

#if defined(PMAP_ASAN) || defined(PMAP_TSAN)
constexpr bool kKeepBlocks = false;
#else
constexpr bool kKeepBlocks = true;
#endif

/// Polls of Pending::ready() that find a posted collective not arrived before one waits.
constexpr int kPolls = 64;

bool is_cancellation(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Cancelled&) {
    return true;
  } catch (...) {
    return false;
  }
}

/// complete_through() runs the queue: not re-entered from the collectives it runs.
class Completing {
 public:
  explicit Completing(bool& flag) : flag_(flag) { flag_ = true; }
  ~Completing() { flag_ = false; }
  Completing(const Completing&) = delete;
  Completing& operator=(const Completing&) = delete;

 private:
  bool& flag_;
};

}  // namespace

void* Started::operator new(std::size_t size) {
  if (!kKeepBlocks || size > kBlockBytes) return ::operator new(size);
  if (!blocks_gone) {
    KeptBlocks& kept = kept_blocks;
    if (kept.count > 0) return kept.blocks[--kept.count];
  }
  return ::operator new(kBlockBytes);
}

void Started::operator delete(void* p, std::size_t size) noexcept {
  if (kKeepBlocks && size <= kBlockBytes && !blocks_gone) {
    KeptBlocks& kept = kept_blocks;
    if (kept.count < kKeptBlocks) {
      kept.blocks[kept.count++] = p;
      return;
    }
  }
  ::operator delete(p);
}

void Access::complete_through(Context& c, const Started* last) {
  if (c.completing_) return;
  Completing guard(c.completing_);
  // Indexes, not iterators: a collective that runs starts or forgets nothing, but the
  // vector is only read here.
  for (std::size_t i = 0; i < c.started_.size(); ++i) {
    Started* op = c.started_[i];
    if (!op->done) {
      try {
        op->run(c);
      } catch (...) {
        op->error = std::current_exception();
      }
      op->done = true;
      if (op->started_at >= 0 && tracing::recording())
        tracing::started(*c.member_.team, c.member_.index, op->started_at, op->name);
      if (op->error) std::rethrow_exception(op->error);
    }
    if (op == last) return;
  }
}

bool Access::make_progress(Context& c, Started* op) {
  if (c.completing_) return op->done;
  for (Started* older : c.started_) {
    if (older->done) continue;
    if (!older->posted) {
      complete_through(c, op);  // SPEC 11's order: this one runs now, and op after it
      return op->done;
    }
    if (!older->arrived(c)) {
      // A poll lets the thread's other devices run (its source may be one of them); after a
      // few, it waits as wait() does, which suspends the device properly: the thread may not
      // start a device that has not run yet while this one is ready (as Team::yield_until).
      if (++op->polls < kPolls) {
        c.member_.team->yield(c.member_.index);
        return false;
      }
      break;
    }
    if (older == op) break;
  }
  complete_through(c, op);
  return op->done;
}

void Access::make_room(Context& c) {
  const Started* last_unposted = nullptr;
  for (const Started* op : c.started_)
    if (!op->done && !op->posted) last_unposted = op;
  if (last_unposted != nullptr) complete_through(c, last_unposted);
  const Started* oldest = nullptr;
  int in_flight = 0;
  for (const Started* op : c.started_) {
    if (op->done) continue;
    if (in_flight++ == 0) oldest = op;
  }
  if (in_flight >= 2) complete_through(c, oldest);
}

void Access::abandon(Context& c, Started* op, bool unwinding) noexcept {
  auto forget = [&c, op] {
    c.started_.erase(std::remove(c.started_.begin(), c.started_.end(), op), c.started_.end());
  };
  if (op->waited) {  // the common case: it was waited for, and wait() rethrew what it met
    forget();
    return;
  }
  std::exception_ptr met;
  if (!op->done && !unwinding) {
    try {
      complete_through(c, op);
    } catch (...) {
      met = std::current_exception();
    }
  }
  if (!met && op->done && !op->waited) met = op->error;
  if (met && !c.started_error_) {
    c.started_error_ = met;
    // Nobody waits for it: the others learn now, as they would of a kernel's exception.
    if (!is_cancellation(met)) c.member_.team->fail(met, c.member_.index);
  }
  forget();
}

void Access::traced_wait(Context& c, Started* op) {
  const std::int64_t begin = tracing::now();
  std::exception_ptr failed;
  try {
    if (!op->done) complete_through(c, op);
  } catch (...) {
    failed = std::current_exception();
  }
  tracing::pending_wait(*c.member_.team, c.member_.index, begin, op->name);
  if (failed) std::rethrow_exception(failed);
}

void Access::finish_queue(Context& c) {
  complete_through(c, nullptr);
  if (c.started_error_) std::rethrow_exception(c.started_error_);
}

void Access::detach_started(Context& c) {
  for (Started* op : c.started_) op->context = nullptr;
}

}  // namespace detail

}  // namespace pmap
