// The floor under a halo exchange: what one, and two, point-to-point arrivals cost between two
// cores, with no library around them. Two threads (pinned to cores 0 and 1 where there are
// two) each publish `arrivals` small values per step into a slot laid out as pmap's
// (detail/slot.hpp: a phase word in one cache line, the small staged copies in the next),
// then wait for the other's and read them. `together`: both values published by one store
// of the phase (what one start of two ppermutes would do); otherwise one store per arrival,
// as two ppermute_starts do. pmap-bench's halo_overlap row (two started ppermutes against
// one ppermute) cannot go below arrivals=2 over arrivals=1 here.

#include <benchmark/benchmark.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "pmap/detail/cpu_relax.hpp"

namespace {

struct alignas(128) Slot {
  std::atomic<long> phase{0};
  alignas(64) unsigned char small[4][16] = {};
};

void pin_to(int core) {
  if (std::thread::hardware_concurrency() < 2) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

/// One thread's side of `steps` steps; returns the sum of what it read (kept alive).
float exchange(Slot* slots, int me, int steps, int arrivals, bool together) {
  Slot& mine = slots[me];
  const Slot& peer = slots[1 - me];
  long phase = 0;
  float sum = 0;
  for (int s = 0; s < steps; ++s) {
    for (int k = 0; k < arrivals; ++k) {
      const float v = static_cast<float>(s + k);
      ++phase;
      std::memcpy(mine.small[phase & 3], &v, sizeof v);
      if (!together || k + 1 == arrivals) mine.phase.store(phase, std::memory_order_release);
    }
    for (int k = 0; k < arrivals; ++k) {
      const long want = phase - arrivals + k + 1;
      while (peer.phase.load(std::memory_order_acquire) < want) pmap::detail::cpu_relax();
      float v;
      std::memcpy(&v, peer.small[want & 3], sizeof v);
      sum += v;
    }
  }
  return sum;
}

void handoff(benchmark::State& state) {
  const int arrivals = static_cast<int>(state.range(0));
  const bool together = state.range(1) != 0;
  constexpr int kSteps = 20000;
  double seconds = 0;
  for (auto _ : state) {
    Slot slots[2];
    float other = 0;
    std::atomic<bool> ready{false};
    std::thread partner([&] {
      pin_to(1);
      ready.store(true);
      other = exchange(slots, 1, kSteps, arrivals, together);
    });
    pin_to(0);
    while (!ready.load()) pmap::detail::cpu_relax();
    const auto begin = std::chrono::steady_clock::now();
    const float mine = exchange(slots, 0, kSteps, arrivals, together);
    const auto end = std::chrono::steady_clock::now();
    partner.join();
    benchmark::DoNotOptimize(mine + other);
    const double round = std::chrono::duration<double>(end - begin).count();
    state.SetIterationTime(round);
    seconds += round;
  }
  state.counters["ns_per_step"] =
      seconds * 1e9 / (static_cast<double>(state.iterations()) * kSteps);
  state.SetLabel(together ? "published together" : "one store per arrival");
}

BENCHMARK(handoff)
    ->ArgNames({"arrivals", "together"})
    ->Args({1, 0})
    ->Args({2, 0})
    ->Args({2, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
