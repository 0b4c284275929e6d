/// @file watchdog.hpp
/// @brief Aborts the test binary with a description of what was running when one step of a
/// test runs past its limit: a hang is reported with the program or call that caused it,
/// not as a bare ctest timeout.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace pmap_test {

class Watchdog {
 public:
  /// @param binary names the test in the message; @param limit how long one step may run.
  Watchdog(const char* binary, std::chrono::seconds limit)
      : binary_(binary), limit_(limit), thread_([this] { watch(); }) {}
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  /// Starts timing a step described by `what`.
  void arm(std::string what) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      what_ = std::move(what);
      deadline_ = std::chrono::steady_clock::now() + limit_;
      armed_ = true;
    }
    cv_.notify_all();
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = false;
  }

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      if (!armed_) {
        cv_.wait(lock);
      } else if (cv_.wait_until(lock, deadline_) == std::cv_status::timeout && armed_ &&
                 std::chrono::steady_clock::now() >= deadline_) {
        std::fprintf(stderr, "\n%s: a step ran for more than %d s (hung?): %s\n", binary_,
                     static_cast<int>(limit_.count()), what_.c_str());
        std::fflush(stderr);
        std::abort();
      }
    }
  }

  const char* binary_;
  std::chrono::seconds limit_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool armed_ = false;
  bool stop_ = false;
  std::chrono::steady_clock::time_point deadline_;
  std::string what_;
  std::thread thread_;  // last: starts after the members it reads
};

}  // namespace pmap_test
