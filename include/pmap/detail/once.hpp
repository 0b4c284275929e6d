/// @file once.hpp
/// @brief A one-time initialisation shared by the devices of a call (sinks.hpp, outputs.hpp).
#pragma once

#include <atomic>
#include <thread>

#include "pmap/detail/errors.hpp"

namespace pmap::detail {

/// A one-time initialisation shared by the devices of a call (an output's allocation): the
/// first device to claim it does the work, the others wait (briefly: the owner is running,
/// it does not wait for anyone meanwhile). The owner holds an Owner; unless it publishes,
/// its destructor marks the work failed (an allocation that threw), and every waiter then
/// throws Cancelled, leaving the owner's own exception to be the call's error. Without that,
/// they would wait forever for work that will never be published.
class Once {
  enum State : int { idle, running, done, failed };

 public:
  class Owner {
   public:
    explicit Owner(Once* once) : once_(once) {}
    Owner(const Owner&) = delete;
    Owner& operator=(const Owner&) = delete;
    ~Owner() {
      if (once_) once_->state_.store(failed, std::memory_order_release);
    }
    /// True for the one caller that must do the work and then publish().
    explicit operator bool() const { return once_ != nullptr; }
    void publish() {
      once_->state_.store(done, std::memory_order_release);
      once_ = nullptr;
    }

   private:
    Once* once_;
  };

  Once() = default;
  Once(const Once& other) : state_(other.state_.load(std::memory_order_relaxed)) {}

  /// An engaged Owner for the first caller; for the others, returns once the work is
  /// published, or throws Cancelled if it failed.
  Owner claim() {
    int seen = state_.load(std::memory_order_acquire);
    if (seen == idle && state_.compare_exchange_strong(seen, running, std::memory_order_acq_rel))
      return Owner(this);
    while ((seen = state_.load(std::memory_order_acquire)) == running) std::this_thread::yield();
    if (seen == failed) throw Cancelled{};
    return Owner(nullptr);
  }

 private:
  std::atomic<int> state_{idle};
};

}  // namespace pmap::detail
