// The queue of started collectives of one device (SPEC 11, pmap/pending.hpp).
#include <algorithm>
#include <exception>

#include "pmap/context.hpp"
#include "pmap/detail/errors.hpp"
#include "pmap/detail/trace_events.hpp"

namespace pmap {
namespace detail {
namespace {

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

void Access::abandon(Context& c, Started* op, bool unwinding) noexcept {
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
  c.started_.erase(std::remove(c.started_.begin(), c.started_.end(), op), c.started_.end());
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
