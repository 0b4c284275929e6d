/// @file harness.hpp
/// @brief How pmap-bench measures: every implementation of one case (pmap and its
/// baselines) runs interleaved in the same process, round after round, and the report keeps
/// the median of the per-round ratios with their min and max.
///
/// A round runs each implementation once for a calibrated number of repetitions (about
/// `Settings::sample_seconds`), in an order rotated from round to round, after waiting for
/// the process's own threads to go quiet (OpenMP workers spin for milliseconds after a
/// region; on a 2-core machine a spinner steals the next implementation's core) and one
/// untimed repetition that wakes the implementation's threads again.
///
/// Thread safety: none; the harness runs on the main thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <sys/resource.h>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

namespace pmap::report {

using Clock = std::chrono::steady_clock;

/// @brief Wall seconds elapsed since `start`.
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// @brief CPU seconds (user + system) consumed so far by every thread of this process.
inline double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

/// @brief How busy the rest of the machine is: CPU time used by other processes (and stolen
/// by the hypervisor) between construction and `others()`, in cores. On a shared 2-core
/// machine a figure above ~0.2 means the ratios of that stretch are noisy.
class Interference {
 public:
  Interference()
      : busy_(machine_busy_seconds()), own_(process_cpu_seconds()), wall_(Clock::now()) {}

  /// @brief Cores' worth of CPU used by others since construction (0 = quiet, 1 = one core).
  double others() const {
    const double wall = seconds_since(wall_);
    const double busy = machine_busy_seconds() - busy_ - (process_cpu_seconds() - own_);
    return wall > 0 ? std::max(0.0, busy / wall) : 0.0;
  }

  /// @brief Non-idle CPU seconds of the whole machine (steal included), from /proc/stat.
  static double machine_busy_seconds() {
    std::ifstream stat("/proc/stat");
    std::string cpu;
    double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
    return (user + nice + system + irq + softirq + steal) /
           static_cast<double>(sysconf(_SC_CLK_TCK));
  }

 private:
  double busy_;
  double own_;
  Clock::time_point wall_;
};

/// @brief Waits until this process's threads stop burning CPU (under 10% of a core over
/// half a millisecond), at most `limit_seconds`.
inline void settle(double limit_seconds = 0.05) {
  const auto start = Clock::now();
  for (;;) {
    const double cpu = process_cpu_seconds();
    const auto wall = Clock::now();
    std::this_thread::sleep_for(std::chrono::microseconds(500));
    const double busy = (process_cpu_seconds() - cpu) / seconds_since(wall);
    if (busy < 0.1 || seconds_since(start) > limit_seconds) return;
  }
}

/// @brief How long and how often to measure.
struct Settings {
  int rounds = 15;                ///< measured rounds (after calibration and one warm-up round)
  double sample_seconds = 10e-3;  ///< target duration of one implementation's sample
};

/// @brief Median, min and max of a set of values.
struct Stat {
  double median = 0;
  double min = 0;
  double max = 0;
};

/// @brief Median (mean of the middle two for an even count), min and max of `values`.
inline Stat stat(std::vector<double> values) {
  if (values.empty()) return {};
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  const double median = n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
  return {median, values.front(), values.back()};
}

/// @brief One case of a workload: pmap and its baselines on the same data, measured together.
///
/// Example:
/// @code
///   Case c("triad 1 GiB");
///   c.add("pmap", [&](std::int64_t reps) { for (...) f.into(out, a, b); }, 1, bytes);
///   c.add("omp", [&](std::int64_t reps) { ... }, 1, bytes);
///   c.measure(settings);
///   double ratio = stat(c.ratios("omp", "pmap", Case::kRate)).median;
/// @endcode
class Case {
 public:
  /// @brief Whether a smaller time or a larger rate is the figure of merit.
  enum Metric { kTime, kRate };

  explicit Case(std::string label) : label_(std::move(label)) {}

  /// @brief Adds an implementation: `run(reps)` runs `reps` repetitions, each of `ops`
  /// operations (collectives per dispatch, ...) of `work` units each (bytes, flops).
  void add(std::string name, std::function<void(std::int64_t)> run, double ops = 1,
           double work = 0) {
    impls_.push_back(Impl{std::move(name), std::move(run), ops, work, {}, 1, {}});
  }

  /// @brief Like add(), with `scope()` alive around every sample but outside its timing
  /// (an object whose constructor and destructor set up and undo what `run` needs).
  template <class Scope>
  void add_scoped(std::string name, std::function<void(std::int64_t)> run, double ops, double work,
                  Scope scope) {
    add(std::move(name), std::move(run), ops, work);
    impls_.back().around = [scope](const std::function<void()>& timed) {
      const auto guard = scope();
      timed();
    };
  }

  /// @brief Calibrates, warms up, then runs `settings.rounds` interleaved rounds.
  void measure(const Settings& settings) {
    const auto start = Clock::now();
    const Interference interference;
    std::fprintf(stderr, "  %-44s", label_.c_str());
    std::fflush(stderr);
    for (Impl& impl : impls_) calibrate(impl, settings.sample_seconds);
    for (Impl& impl : impls_) sample(impl);  // warm-up round
    const std::size_t n = impls_.size();
    for (int round = 0; round < settings.rounds; ++round) {
      for (std::size_t j = 0; j < n; ++j) {
        Impl& impl = impls_[(static_cast<std::size_t>(round) + j) % n];
        impl.seconds.push_back(sample(impl) / impl.ops);
      }
    }
    others_ = interference.others();
    std::fprintf(stderr, " %6.1f s, others used %.2f cores\n", seconds_since(start), others_);
  }

  /// @brief Cores' worth of CPU other processes used while this case was measured.
  double others() const { return others_; }

  /// @brief Per-round seconds per operation of implementation `name`.
  const std::vector<double>& seconds(const std::string& name) const { return find(name).seconds; }
  /// @brief Work units per operation of implementation `name`.
  double work(const std::string& name) const { return find(name).work; }
  /// @brief Median seconds per operation of `name`.
  double median_seconds(const std::string& name) const { return stat(seconds(name)).median; }
  /// @brief Median rate (work units per second) of `name`.
  double median_rate(const std::string& name) const {
    std::vector<double> rates;
    for (double s : seconds(name)) rates.push_back(work(name) / s);
    return stat(rates).median;
  }

  /// @brief Per-round ratio of `candidate` to `baseline`: time over time for kTime (< 1: the
  /// candidate is faster), rate over rate for kRate (> 1: the candidate is faster).
  std::vector<double> ratios(const std::string& candidate, const std::string& baseline,
                             Metric metric) const {
    const Impl& c = find(candidate);
    const Impl& b = find(baseline);
    std::vector<double> out;
    for (std::size_t r = 0; r < c.seconds.size() && r < b.seconds.size(); ++r)
      out.push_back(metric == kTime ? c.seconds[r] / b.seconds[r]
                                    : (c.work / c.seconds[r]) / (b.work / b.seconds[r]));
    return out;
  }

  const std::string& label() const { return label_; }

 private:
  struct Impl {
    std::string name;
    std::function<void(std::int64_t)> run;
    double ops;
    double work;
    std::function<void(const std::function<void()>&)> around;  // empty: none
    std::int64_t reps;
    std::vector<double> seconds;  // per operation, one per round
  };

  const Impl& find(const std::string& name) const {
    for (const Impl& impl : impls_)
      if (impl.name == name) return impl;
    throw std::logic_error("pmap-bench: no implementation '" + name + "' in " + label_);
  }

  /// Seconds of one sample of `impl.reps` repetitions, per repetition.
  static double sample(Impl& impl) {
    settle();
    double seconds = 0;
    const std::function<void()> timed = [&] {
      // One untimed repetition wakes the threads that settle() let fall asleep: a sample
      // measures the steady state (the idle workload measures waking up).
      if (impl.reps > 1) impl.run(1);
      const auto start = Clock::now();
      impl.run(impl.reps);
      seconds = seconds_since(start);
    };
    if (impl.around)
      impl.around(timed);
    else
      timed();
    return seconds / static_cast<double>(impl.reps);
  }

  /// Picks the repetitions that make a sample last about `target` seconds; the first,
  /// cold runs warm the caches, the allocator and the thread pools.
  static void calibrate(Impl& impl, double target) {
    impl.reps = 1;
    double per_rep = sample(impl);
    for (int pass = 0; pass < 3 && per_rep * static_cast<double>(impl.reps) < 0.5 * target;
         ++pass) {
      impl.reps = std::clamp<std::int64_t>(
          static_cast<std::int64_t>(std::ceil(target / std::max(per_rep, 1e-9))), 1,
          std::int64_t{1} << 30);
      per_rep = sample(impl);
    }
  }

  std::string label_;
  std::vector<Impl> impls_;
  double others_ = 0;
};

}  // namespace pmap::report
