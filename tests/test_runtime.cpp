/// @file test_runtime.cpp
/// @brief Runtime, RuntimeConfig, Device and the global shorthands (SPEC 2, 4).

#include <algorithm>
#include <atomic>
#include <cfenv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <pthread.h>
#include <sched.h>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <oneapi/tbb/task_arena.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "pmap/detail/fibers.hpp"
#include "pmap/detail/pool.hpp"
#include "test_util.hpp"

namespace {

using namespace pmap_test;

int hardware_threads() {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

/// Sets (or unsets, for nullopt) an environment variable for the lifetime of the guard.
class EnvGuard {
 public:
  EnvGuard(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~EnvGuard() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

void expect_devices(const pmap::Runtime& rt, int count) {
  ASSERT_EQ(rt.device_count(), count);
  ASSERT_EQ(rt.local_device_count(), count);
  ASSERT_EQ(static_cast<int>(rt.devices().size()), count);
  ASSERT_EQ(static_cast<int>(rt.local_devices().size()), count);
  for (int i = 0; i < count; ++i) {
    const pmap::Device& d = rt.devices()[static_cast<std::size_t>(i)];
    EXPECT_EQ(d.id, i);
    EXPECT_EQ(d.process_index, 0);
    EXPECT_EQ(d.to_string(), "cpu:" + std::to_string(i));
    EXPECT_EQ(rt.local_devices()[static_cast<std::size_t>(i)], d);
  }
}

// ---- Device and RuntimeConfig ------------------------------------------------------------

TEST(Device, ToStringIsCpuColonId) {
  EXPECT_EQ((pmap::Device{3, 0}.to_string()), "cpu:3");
  EXPECT_EQ((pmap::Device{0, 0}.to_string()), "cpu:0");
  EXPECT_EQ((pmap::Device{12, 1}.to_string()), "cpu:12");
}

TEST(Device, EqualityComparesIdAndProcess) {
  EXPECT_EQ((pmap::Device{2, 0}), (pmap::Device{2, 0}));
  EXPECT_NE((pmap::Device{2, 0}), (pmap::Device{3, 0}));
  EXPECT_NE((pmap::Device{2, 0}), (pmap::Device{2, 1}));
}

TEST(RuntimeConfig, DefaultsAreZero) {
  pmap::RuntimeConfig c;
  EXPECT_EQ(c.num_devices, 0);
  EXPECT_EQ(c.num_threads, 0);
  EXPECT_FALSE(c.bind_threads);
}

// ---- explicit configurations -------------------------------------------------------------

TEST(Runtime, ExplicitDevicesAndThreads) {
  pmap::Runtime rt({.num_devices = 3, .num_threads = 2});
  expect_devices(rt, 3);
  EXPECT_EQ(rt.num_threads(), 2);
  EXPECT_EQ(rt.process_index(), 0);
  EXPECT_EQ(rt.process_count(), 1);
}

TEST(Runtime, MoreDevicesThanThreads) {
  pmap::Runtime rt({.num_devices = 16, .num_threads = 1});
  expect_devices(rt, 16);
  EXPECT_EQ(rt.num_threads(), 1);
}

TEST(Runtime, DeviceToStringMatchesId) {
  pmap::Runtime rt({.num_devices = 8, .num_threads = 1});
  EXPECT_EQ(rt.devices()[3].to_string(), "cpu:3");
  EXPECT_EQ(rt.devices()[7].to_string(), "cpu:7");
}

TEST(Runtime, ZeroDevicesReadsEnvironment) {
  EnvGuard devices("PMAP_NUM_DEVICES", "6");
  EnvGuard threads("PMAP_NUM_THREADS", "3");
  pmap::Runtime rt(pmap::RuntimeConfig{});
  expect_devices(rt, 6);
  EXPECT_EQ(rt.num_threads(), 3);
}

TEST(Runtime, ZeroDevicesWithoutEnvironmentIsHardwareConcurrency) {
  EnvGuard devices("PMAP_NUM_DEVICES", std::nullopt);
  EnvGuard threads("PMAP_NUM_THREADS", std::nullopt);
  pmap::Runtime rt(pmap::RuntimeConfig{});
  expect_devices(rt, hardware_threads());
  EXPECT_EQ(rt.num_threads(), hardware_threads());
}

TEST(Runtime, DefaultConstructedReadsEnvironment) {
  EnvGuard devices("PMAP_NUM_DEVICES", "5");
  EnvGuard threads("PMAP_NUM_THREADS", "1");
  pmap::Runtime rt;
  expect_devices(rt, 5);
  EXPECT_EQ(rt.num_threads(), 1);
}

TEST(Runtime, ZeroThreadsReadsEnvironment) {
  EnvGuard threads("PMAP_NUM_THREADS", "3");
  pmap::Runtime rt({.num_devices = 5, .num_threads = 0});
  expect_devices(rt, 5);
  EXPECT_EQ(rt.num_threads(), 3);
}

TEST(Runtime, ZeroThreadsWithoutEnvironmentIsMinOfDevicesAndHardware) {
  EnvGuard threads("PMAP_NUM_THREADS", std::nullopt);
  {
    pmap::Runtime rt({.num_devices = 1, .num_threads = 0});
    EXPECT_EQ(rt.num_threads(), 1);
  }
  {
    pmap::Runtime rt({.num_devices = 64, .num_threads = 0});
    EXPECT_EQ(rt.num_threads(), std::min(64, hardware_threads()));
  }
}

TEST(Runtime, ExplicitConfigIgnoresEnvironment) {
  EnvGuard devices("PMAP_NUM_DEVICES", "6");
  EnvGuard threads("PMAP_NUM_THREADS", "3");
  pmap::Runtime rt({.num_devices = 2, .num_threads = 1});
  expect_devices(rt, 2);
  EXPECT_EQ(rt.num_threads(), 1);
}

TEST(Runtime, ManyRuntimesCreatedAndDestroyed) {
  for (int k = 1; k <= 20; ++k) {
    pmap::Runtime rt({.num_devices = 1 + k % 5, .num_threads = 1 + k % 2});
    auto f = pmap::pmap([](pmap::Context& ctx, auto x) { return x * 0.f + static_cast<float>(ctx.axis_index()); },
                        on(rt));
    Eigen::Tensor<float, 2, RowMajor> x(rt.device_count(), 2);
    x.setZero();
    auto r = f(x);
    for (Index i = 0; i < x.dimension(0); ++i) {
      EXPECT_EQ(r(i, 0), static_cast<float>(i));
      EXPECT_EQ(r(i, 1), static_cast<float>(i));
    }
  }
}

// ---- the global runtime ------------------------------------------------------------------

TEST(GlobalRuntime, IsOneObject) {
  EXPECT_EQ(&pmap::Runtime::global(), &pmap::Runtime::global());
}

TEST(GlobalRuntime, ShorthandsAgreeWithGlobal) {
  pmap::Runtime& g = pmap::Runtime::global();
  EXPECT_EQ(pmap::device_count(), g.device_count());
  EXPECT_EQ(pmap::local_device_count(), g.local_device_count());
  EXPECT_EQ(pmap::process_index(), g.process_index());
  EXPECT_EQ(pmap::process_count(), g.process_count());
  EXPECT_EQ(pmap::process_index(), 0);
  EXPECT_EQ(pmap::process_count(), 1);
  ASSERT_EQ(pmap::devices().size(), g.devices().size());
  ASSERT_EQ(pmap::local_devices().size(), g.local_devices().size());
  EXPECT_TRUE(std::equal(pmap::devices().begin(), pmap::devices().end(), g.devices().begin()));
  EXPECT_TRUE(std::equal(pmap::local_devices().begin(), pmap::local_devices().end(),
                         g.local_devices().begin()));
  expect_devices(g, g.device_count());
}

TEST(GlobalRuntime, ConsistentWithEnvironmentAtStartup) {
  // The global runtime is created once, on first use, from the environment of the process;
  // nothing in this file changes PMAP_NUM_* before that first use except under EnvGuard,
  // which never touches the global runtime.
  pmap::Runtime& g = pmap::Runtime::global();
  const char* devices = std::getenv("PMAP_NUM_DEVICES");
  const char* threads = std::getenv("PMAP_NUM_THREADS");
  const int expected_devices = devices ? std::atoi(devices) : hardware_threads();
  EXPECT_EQ(g.device_count(), expected_devices);
  const int expected_threads =
      threads ? std::atoi(threads) : std::min(expected_devices, hardware_threads());
  EXPECT_EQ(g.num_threads(), expected_threads);
}

TEST(GlobalRuntime, UsedWhenOptionsHaveNoRuntime) {
  const int count = std::min(2, pmap::device_count());
  std::vector<pmap::Device> seen(static_cast<std::size_t>(count), pmap::Device{-1, -1});
  auto f = pmap::pmap([&](pmap::Context& ctx, auto x) {
    seen[static_cast<std::size_t>(ctx.axis_index())] = ctx.device();
    return x * 3.f;
  });
  Eigen::Tensor<float, 1, RowMajor> x = make<Eigen::Tensor<float, 1, RowMajor>>(1, count);
  auto r = f(x);
  Eigen::Tensor<float, 1, RowMajor> expected = x * 3.f;
  EXPECT_TRUE(tensors_equal(r, expected));
  for (int i = 0; i < count; ++i) EXPECT_EQ(seen[static_cast<std::size_t>(i)], pmap::devices()[static_cast<std::size_t>(i)]);
}

// ---- several runtimes and reuse ----------------------------------------------------------

/// A mapped function that records which device ran each position and returns x * k.
struct Recorder {
  std::vector<int>* ids;
  float k;
  auto operator()(pmap::Context& ctx, View<float, 1, RowMajor> x) const {
    (*ids)[static_cast<std::size_t>(ctx.axis_index())] = ctx.device().id;
    return x * k;
  }
};

TEST(Runtime, SeveralRuntimesSideBySide) {
  pmap::Runtime a({.num_devices = 3, .num_threads = 1});
  pmap::Runtime b({.num_devices = 5, .num_threads = 2});
  std::vector<int> ids_a(3, -1);
  std::vector<int> ids_b(5, -1);
  auto fa = pmap::pmap(Recorder{&ids_a, 2.f}, on(a));
  auto fb = pmap::pmap(Recorder{&ids_b, 5.f}, on(b));
  auto xa = make<Eigen::Tensor<float, 2, RowMajor>>(1, 3, 4);
  auto xb = make<Eigen::Tensor<float, 2, RowMajor>>(2, 5, 4);
  for (int round = 0; round < 20; ++round) {
    Eigen::Tensor<float, 2, RowMajor> ea = xa * 2.f;
    Eigen::Tensor<float, 2, RowMajor> eb = xb * 5.f;
    EXPECT_TRUE(tensors_equal(fa(xa), ea));
    EXPECT_TRUE(tensors_equal(fb(xb), eb));
  }
  EXPECT_EQ(ids_a, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(ids_b, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(a.device_count(), 3);
  EXPECT_EQ(b.device_count(), 5);
}

TEST(Runtime, SeveralRuntimesFromConcurrentHostThreads) {
  pmap::Runtime a({.num_devices = 4, .num_threads = 1});
  pmap::Runtime b({.num_devices = 6, .num_threads = 2});
  std::atomic<int> failures{0};
  auto drive = [&failures](pmap::Runtime& rt, float k) {
    auto f = pmap::pmap([k](auto x) { return x * k; }, on(rt));
    auto x = make<Eigen::Tensor<float, 2, RowMajor>>(3, rt.device_count(), 5);
    Eigen::Tensor<float, 2, RowMajor> expected = x * k;
    for (int round = 0; round < 200; ++round) {
      Eigen::Tensor<float, 2, RowMajor> r = f(x);
      if (!tensors_equal(r, expected)) failures.fetch_add(1);
    }
  };
  std::thread ta([&] { drive(a, 2.f); });
  std::thread tb([&] { drive(b, -1.f); });
  ta.join();
  tb.join();
  EXPECT_EQ(failures.load(), 0);
}

// ---- binding threads to CPUs -------------------------------------------------------------

std::vector<int> affinity_of_this_thread() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  pthread_getaffinity_np(pthread_self(), sizeof mask, &mask);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mask)) cpus.push_back(c);
  return cpus;
}

/// The worker in arena slot k runs bound to the k-th CPU of the process's mask; the calling
/// thread (slot 0) keeps its own mask; results are unchanged. `rt`: 8 devices, 2 threads.
/// Device 0, which the calling thread runs first, holds it until a device has run on the
/// worker (the worker's block is devices 4-7), so that every call has one, however busy the
/// machine: with nothing to wait for, the caller could run every device itself.
void expect_bound_workers(pmap::Runtime& rt, const std::vector<int>& cpus) {
  constexpr int kDevices = 8;
  constexpr int kCalls = 5;
  struct Seen {
    int slot = -1;
    std::vector<int> mask;
  };
  std::vector<std::vector<Seen>> seen(kDevices);  // each device appends to its own
  std::atomic<bool> worker_ran{false};
  bool held_too_long = false;
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, auto x) {
        const auto i = static_cast<std::size_t>(ctx.axis_index());
        const int slot = tbb::this_task_arena::current_thread_index();
        seen[i].push_back({slot, affinity_of_this_thread()});
        if (slot > 0) worker_ran.store(true);
        if (i == 0) {
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
          while (!worker_ran.load() && !held_too_long) {
            held_too_long = std::chrono::steady_clock::now() > deadline;
            std::this_thread::yield();
          }
        }
        return pmap::eval(x * 2.f);
      },
      on(rt));
  Eigen::Tensor<float, 2, RowMajor> x(kDevices, 3);
  fill_values(x, 1);
  const Eigen::Tensor<float, 2, RowMajor> expected = x * 2.f;
  for (int call = 0; call < kCalls; ++call) {
    worker_ran.store(false);
    EXPECT_TRUE(tensors_equal(f(x), expected));
  }
  EXPECT_FALSE(held_too_long) << "no device ran on the worker within 20 s";
  int on_workers = 0;
  for (const auto& device : seen)
    for (const Seen& s : device) {
      if (s.slot <= 0) {
        EXPECT_EQ(s.mask, cpus) << "the calling thread's mask changed";
      } else {
        ++on_workers;
        EXPECT_EQ(s.mask, std::vector<int>{cpus[static_cast<std::size_t>(s.slot) % cpus.size()]})
            << "worker in slot " << s.slot;
      }
    }
  EXPECT_GE(on_workers, kCalls);
  EXPECT_EQ(affinity_of_this_thread(), cpus);
}

TEST(Runtime, BindThreadsBindsWorkerKToTheKthCpuAndLeavesTheCaller) {
  const std::vector<int> cpus = affinity_of_this_thread();
  if (cpus.size() < 2 || PMAP_DEVICE_THREADS) GTEST_SKIP() << "needs 2 CPUs and oneTBB workers";
  pmap::Runtime rt({.num_devices = 8, .num_threads = 2, .bind_threads = true});
  expect_bound_workers(rt, cpus);
}

TEST(Runtime, BindThreadsFromTheEnvironment) {
  {
    EnvGuard bad("PMAP_BIND_THREADS", "yes");
    EXPECT_THROW(pmap::Runtime({.num_devices = 2, .num_threads = 2}), pmap::ValueError);
  }
  const std::vector<int> cpus = affinity_of_this_thread();
  if (cpus.size() < 2 || PMAP_DEVICE_THREADS) GTEST_SKIP() << "needs 2 CPUs and oneTBB workers";
  EnvGuard bind("PMAP_BIND_THREADS", "1");
  pmap::Runtime rt({.num_devices = 8, .num_threads = 2});
  expect_bound_workers(rt, cpus);
}

TEST(Runtime, NegativeCountsAreValueErrors) {
  // Not in SPEC.md; runtime.hpp documents it.
  EXPECT_THROW(pmap::Runtime({.num_devices = -1, .num_threads = 1}), pmap::ValueError);
  EXPECT_THROW(pmap::Runtime({.num_devices = 2, .num_threads = -3}), pmap::ValueError);
}

TEST(Runtime, ConcurrentCallsOnOneRuntime) {
  // runtime.hpp / mapped.hpp: several threads may dispatch onto one Runtime, and call one
  // Mapped, at once.
  pmap::Runtime rt({.num_devices = 8, .num_threads = 2});
  auto shared = pmap::pmap([](pmap::Context& ctx, auto x) { return x + static_cast<float>(ctx.axis_index()); },
                           on(rt));
  std::atomic<int> failures{0};
  auto drive = [&](int seed, int count) {
    auto own = pmap::pmap([](auto x) { return x * 2.f; }, on(rt));
    auto x = make<Eigen::Tensor<float, 2, RowMajor>>(seed, count, 3);
    Eigen::Tensor<float, 2, RowMajor> e_shared(count, 3);
    for (Index i = 0; i < count; ++i)
      for (Index j = 0; j < 3; ++j) e_shared(i, j) = x(i, j) + static_cast<float>(i);
    Eigen::Tensor<float, 2, RowMajor> e_own = x * 2.f;
    for (int round = 0; round < 200; ++round) {
      if (!tensors_equal(shared(x), e_shared)) failures.fetch_add(1);
      if (!tensors_equal(own(x), e_own)) failures.fetch_add(1);
    }
  };
  std::thread a([&] { drive(1, 8); });
  std::thread b([&] { drive(2, 5); });
  std::thread c([&] { drive(3, 8); });
  a.join();
  b.join();
  c.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(Runtime, ConcurrentCollectiveCallsOnOneRuntime) {
  // The same with collectives: host threads whose calls' devices meet in barriers share the
  // two workers of one Runtime, with 8 devices; a shared Mapped, one of each thread's own,
  // and a shard_map over a mesh of the same devices.
  using F2 = Eigen::Tensor<float, 2, RowMajor>;
  pmap::Runtime rt({.num_devices = 8, .num_threads = 2});
  pmap::Options axis_i = on(rt);
  axis_i.axis_name = "i";
  auto shared = pmap::pmap(
      [](pmap::Context& ctx, auto x) {
        std::vector<std::pair<int, int>> ring;
        for (int d = 0; d < ctx.axis_size(); ++d) ring.emplace_back(d, (d + 1) % ctx.axis_size());
        return pmap::eval(ctx.psum(x) + ctx.ppermute(x, "i", ring));
      },
      axis_i);
  const pmap::Mesh mesh({{"x", 8}}, &rt);
  auto sharded = pmap::shard_map([](pmap::Context& ctx, auto block) { return ctx.psum(pmap::eval(block.sum()), "x"); },
                                 mesh, {pmap::P("x")}, {pmap::P()});
  std::atomic<int> failures{0};
  auto drive = [&](int seed) {
    auto own = pmap::pmap([](pmap::Context& ctx, auto x) { return ctx.all_gather(x); }, on(rt));
    auto x = make<F2>(seed, 8, 3);
    F2 e_shared(8, 3);
    for (Index i = 0; i < 8; ++i)
      for (Index j = 0; j < 3; ++j) {
        float s = 0.f;
        for (Index k = 0; k < 8; ++k) s += x(k, j);
        e_shared(i, j) = s + x((i + 7) % 8, j);
      }
    const Eigen::Tensor<float, 0, RowMajor> e_total = x.sum();
    for (int round = 0; round < (kSanitized ? 30 : 150); ++round) {
      if (!tensors_near(shared(x), e_shared)) failures.fetch_add(1);
      const Eigen::Tensor<float, 3, RowMajor> g = own(x);
      for (Index i = 0; i < 8; ++i)
        if (!tensors_equal(F2(g.chip(i, 0)), x)) failures.fetch_add(1);
      if (std::abs(sharded(x)() - e_total()) > 1e-3f * std::abs(e_total()) + 1e-3f) failures.fetch_add(1);
    }
  };
  std::thread a([&] { drive(1); });
  std::thread b([&] { drive(2); });
  std::thread c([&] { drive(3); });
  a.join();
  b.join();
  c.join();
  EXPECT_EQ(failures.load(), 0);
}

class RuntimeReuse : public RuntimeTest {};
PMAP_TEST_INSTANTIATE(RuntimeReuse);

TEST_P(RuntimeReuse, DevicesMatchConfig) {
  expect_devices(rt(), n());
  EXPECT_EQ(rt().num_threads(), GetParam().threads);
}

TEST_P(RuntimeReuse, ManySuccessiveCallsOfOneMapped) {
  auto f = pmap::pmap([](auto x, auto y) { return x * 2.f + y; }, opts());
  auto x = make<Eigen::Tensor<float, 2, RowMajor>>(1, n(), 3);
  auto y = make<Eigen::Tensor<float, 2, RowMajor>>(2, n(), 3);
  Eigen::Tensor<float, 2, RowMajor> expected = x * 2.f + y;
  for (int k = 0; k < 500; ++k) {
    auto r = f(x, y);
    ASSERT_TRUE(tensors_equal(r, expected)) << "call " << k;
  }
}

TEST_P(RuntimeReuse, ManyMappedFunctionsOnOneRuntime) {
  for (int k = 0; k < 200; ++k) {
    const float s = static_cast<float>(k);
    auto f = pmap::pmap([s](auto x) { return x + s; }, opts());
    auto x = make<Eigen::Tensor<float, 1, RowMajor>>(k, n());
    Eigen::Tensor<float, 1, RowMajor> expected = x + s;
    ASSERT_TRUE(tensors_equal(f(x), expected)) << "call " << k;
  }
}

TEST_P(RuntimeReuse, FewerPositionsThanDevicesUseTheFirstDevices) {
  for (int count = 1; count <= n(); ++count) {
    std::vector<int> ids(static_cast<std::size_t>(count), -1);
    auto f = pmap::pmap(Recorder{&ids, 1.f}, opts());
    auto x = make<Eigen::Tensor<float, 2, RowMajor>>(0, count, 2);
    Eigen::Tensor<float, 2, RowMajor> r = f(x);
    EXPECT_TRUE(tensors_equal(r, x));
    for (int i = 0; i < count; ++i) EXPECT_EQ(ids[static_cast<std::size_t>(i)], i);
  }
}

TEST_P(RuntimeReuse, EveryDeviceRunsExactlyOncePerCall) {
  std::vector<std::atomic<int>> runs(static_cast<std::size_t>(n()));
  for (auto& r : runs) r.store(0);
  auto f = pmap::pmap(
      [&runs](pmap::Context& ctx, auto x) {
        runs[static_cast<std::size_t>(ctx.axis_index())].fetch_add(1);
        return x;
      },
      opts());
  auto x = make<Eigen::Tensor<int32_t, 1, RowMajor>>(0, n());
  for (int k = 0; k < 50; ++k) (void)f(x);
  for (auto& r : runs) EXPECT_EQ(r.load(), 50);
}

// ---- fibers ----------------------------------------------------------------------------------

/// The rounding mode this thread computes with: x87 control word and MXCSR, or -1 when the
/// two disagree.
int rounding_mode() {
  const int x87 = std::fegetround();
#if defined(__x86_64__)
  // MXCSR's rounding control (bits 13-14) encodes the modes as the x87 word does (bits 10-11).
  const int sse = static_cast<int>((_mm_getcsr() >> 13) & 3u) << 10;
  if (sse != x87) return -1;
#endif
  return x87;
}

// A device's floating-point control state is its own: each of 8 devices on 2 threads rounds
// its own way, and after each of 40 collectives (each a suspension) it still does, in the x87
// and the SSE unit alike on x86-64, in FPCR on aarch64. A switch that did not keep the
// control state would hand each device the mode of the device that ran before it.
TEST(Fibers, EachDeviceKeepsItsRoundingModeAcrossSuspensions) {
  pmap::Runtime rt({.num_devices = 8, .num_threads = 2});
  const int modes[] = {FE_TONEAREST, FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO};
  std::atomic<int> wrong{0};
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, auto x) {
        const int mode = modes[ctx.axis_index("i") % 4];
        std::fesetround(mode);
        Eigen::Tensor<float, 1, RowMajor> v = x;
        for (int k = 0; k < 40; ++k) {
          v = ctx.ppermute(v, "i", {{0, 7}, {1, 0}, {2, 1}, {3, 2}, {4, 3}, {5, 4}, {6, 5}, {7, 6}});
          if (rounding_mode() != mode) wrong.fetch_add(1);
        }
        std::fesetround(FE_TONEAREST);
        return v;
      },
      {.axis_name = "i", .runtime = &rt});
  auto x = make<Eigen::Tensor<float, 2, RowMajor>>(1, 8, 4);
  const auto out = f(x);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(rounding_mode(), FE_TONEAREST);
  // 40 steps of the ring bring every row back to where it started (40 = 5 * 8).
  EXPECT_TRUE(tensors_equal(out, x));
}

// Devices run on fibers (src/fibers.cpp) unless the build chose a thread per device.
bool on_pmap_fibers() { return !PMAP_DEVICE_THREADS; }

// A device stays on the thread that started it: 8 devices on 2 threads, 30 collectives each,
// every one a suspension, and each device sees one thread throughout.
TEST(Fibers, DevicesStayOnTheThreadThatStartedThem) {
  if (!on_pmap_fibers()) GTEST_SKIP() << "devices are not on pmap's fibers here";
  pmap::Runtime rt({.num_devices = 8, .num_threads = 2});
  std::vector<std::vector<std::thread::id>> seen(8);
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, auto x) {
        auto& mine = seen[static_cast<std::size_t>(ctx.axis_index("i"))];
        Eigen::Tensor<float, 1, RowMajor> v = x;
        for (int k = 0; k < 30; ++k) {
          mine.push_back(std::this_thread::get_id());
          v = ctx.psum(v, "i");
        }
        mine.push_back(std::this_thread::get_id());
        return v;
      },
      {.axis_name = "i", .runtime = &rt});
  const auto x = make<Eigen::Tensor<float, 2, RowMajor>>(1, 8, 4);
  const auto out = f(x);
  for (const auto& device : seen) {
    ASSERT_EQ(device.size(), 31u);
    EXPECT_EQ(std::count(device.begin(), device.end(), device.front()), 31);
  }
  EXPECT_EQ(out.dimension(0), 8);
}

// Each device handles its own exception: 8 devices on 2 threads each catch an exception of
// their own and wait in 5 collectives inside the handler, while the other devices of their
// thread throw and catch theirs; back in the handler, each rethrows and finds its own (a
// switch that shared the thread's exception stack would hand device 0 the exception of the
// device that caught last on its thread), and nothing is in flight.
TEST(Fibers, EachDeviceKeepsItsExceptionAcrossSuspensions) {
  if (!on_pmap_fibers()) GTEST_SKIP() << "devices are not on pmap's fibers here";
  pmap::Runtime rt({.num_devices = 8, .num_threads = 2});
  std::atomic<int> wrong{0};
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, auto x) {
        const std::string mine = "device " + std::to_string(ctx.axis_index("i"));
        Eigen::Tensor<float, 1, RowMajor> v = x;
        try {
          throw std::runtime_error(mine);
        } catch (const std::runtime_error& caught) {
          for (int k = 0; k < 5; ++k) v = ctx.psum(v, "i");
          if (caught.what() != mine) wrong.fetch_add(1);
          if (std::uncaught_exceptions() != 0) wrong.fetch_add(1);
          try {
            throw;
          } catch (const std::runtime_error& again) {
            if (again.what() != mine) wrong.fetch_add(1);
          }
        }
        return v;
      },
      {.axis_name = "i", .runtime = &rt});
  const auto x = make<Eigen::Tensor<float, 2, RowMajor>>(1, 8, 4);
  f(x);
  EXPECT_EQ(wrong.load(), 0);
}

// With 8 devices on 2 threads, the first device of a thread to finish a reduction keeps
// its result for the others of its group on that thread (reduce_once_per_thread): each
// device still gets its own group's result of its own call and collective. Two groups of
// even and odd devices (each thread runs devices of both), a psum then a pmax over them,
// then a psum over all, in calls with other inputs each.
TEST(Fibers, ReductionResultsSharedOnAThreadAreOfTheirOwnCollective) {
  pmap::Runtime rt({.num_devices = 8, .num_threads = 2});
  const pmap::Groups halves = {{0, 2, 4, 6}, {1, 3, 5, 7}};
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, auto x) {
        Eigen::Tensor<float, 1, RowMajor> s = ctx.psum(x, "i", halves);
        Eigen::Tensor<float, 1, RowMajor> m = ctx.pmax(x, "i", halves);
        Eigen::Tensor<float, 1, RowMajor> all = ctx.psum(x, "i");
        Eigen::Tensor<float, 1, RowMajor> out(3 * x.size());
        for (Eigen::Index j = 0; j < x.size(); ++j) {
          out(j) = s(j);
          out(x.size() + j) = m(j);
          out(2 * x.size() + j) = all(j);
        }
        return out;
      },
      {.axis_name = "i", .runtime = &rt});
  for (int call = 0; call < 6; ++call) {
    Eigen::Tensor<float, 2, RowMajor> x(8, 5);
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 5; ++j) x(i, j) = static_cast<float>((i * 7 + j * 3 + call * 11) % 17);
    const auto out = f(x);
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 5; ++j) {
        float sum = 0, max = 0, all = 0;
        for (int k = 0; k < 8; ++k) {
          all += x(k, j);
          if (k % 2 != i % 2) continue;
          sum += x(k, j);
          max = std::max(max, x(k, j));
        }
        EXPECT_EQ(out(i, j), sum) << "call " << call << " device " << i;
        EXPECT_EQ(out(i, 5 + j), max) << "call " << call << " device " << i;
        EXPECT_EQ(out(i, 10 + j), all) << "call " << call << " device " << i;
      }
  }
}

// A device's fiber has a worker thread's stack (oneTBB's thread_stack_size, 4 MiB by
// default): 1 MiB of locals, live across collectives, on each of 4 devices of one thread.
TEST(Fibers, DevicesHaveAWorkerThreadsStack) {
  pmap::Runtime rt({.num_devices = 4, .num_threads = 1});
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto x) {
        volatile unsigned char big[1 << 20];
        const auto me = static_cast<unsigned char>(ctx.axis_index("i"));
        for (std::size_t k = 0; k < sizeof big; k += 4096) big[k] = me;
        Eigen::Tensor<float, 1, RowMajor> v = ctx.psum(x, "i");
        int mismatches = 0;
        for (std::size_t k = 0; k < sizeof big; k += 4096) mismatches += big[k] != me;
        v(0) += static_cast<float>(mismatches);
        return v;
      },
      {.axis_name = "i", .runtime = &rt});
  Eigen::Tensor<float, 2, RowMajor> x(4, 3);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) x(i, j) = static_cast<float>(10 * i + j);
  const auto out = f(x);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(out(i, j), static_cast<float>(60 + 4 * j));
}

}  // namespace
