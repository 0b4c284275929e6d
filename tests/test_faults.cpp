/// @file test_faults.cpp
/// @brief Fault injection: every allocation of a call fails in turn, and every collective of a
/// program throws in turn on every device. Each faulted call must end with the fault's own
/// exception within seconds (a watchdog aborts the binary, naming the fault, on a hang), write
/// nothing to an `into` target that no device reached, leak nothing (the ASan build checks),
/// and leave the same Mapped and Runtime serving a correct call.
///
/// Allocations are counted and failed by a global operator new / delete of this binary and by
/// a wrapper of malloc (linked with -Wl,--wrap=malloc: Eigen's tensors allocate through
/// std::malloc), armed only while the faulted call runs: allocation k of that call, on any
/// thread, fails, for k = 1, 2, ... until a call no longer reaches k allocations.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "collective_util.hpp"
#include "watchdog.hpp"

// ---- the allocation hooks -----------------------------------------------------------------

extern "C" void* __real_malloc(std::size_t);  // the real one (-Wl,--wrap=malloc)

namespace {

std::atomic<bool> g_armed{false};
std::atomic<long> g_count{0};    ///< allocations of the armed call so far
std::atomic<long> g_fail_at{0};  ///< the one that fails (1-based)

/// The failing allocation takes a while, as one that runs out of memory does, so that the
/// peers of the device that makes it reach whatever waits it would leave hanging.
bool fail_this_allocation() {
  if (!g_armed.load(std::memory_order_relaxed)) return false;
  if (g_count.fetch_add(1, std::memory_order_relaxed) + 1 != g_fail_at.load(std::memory_order_relaxed))
    return false;
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  return true;
}

void arm(long k) {
  g_count.store(0, std::memory_order_relaxed);
  g_fail_at.store(k, std::memory_order_relaxed);
  g_armed.store(true, std::memory_order_seq_cst);
}
/// Returns whether the armed call reached its k-th allocation (which then failed).
bool disarm() {
  g_armed.store(false, std::memory_order_seq_cst);
  return g_count.load(std::memory_order_relaxed) >= g_fail_at.load(std::memory_order_relaxed);
}

void* allocate(std::size_t n) {
  if (fail_this_allocation()) throw std::bad_alloc();
  if (void* p = __real_malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}

void* allocate_aligned(std::size_t n, std::align_val_t alignment) {
  if (fail_this_allocation()) throw std::bad_alloc();
  void* p = nullptr;
  const std::size_t a = std::max(static_cast<std::size_t>(alignment), sizeof(void*));
  if (posix_memalign(&p, a, n ? n : 1) != 0) throw std::bad_alloc();
  return p;
}

}  // namespace

extern "C" void* __wrap_malloc(std::size_t n) {
  return fail_this_allocation() ? nullptr : __real_malloc(n);
}

void* operator new(std::size_t n) { return allocate(n); }
void* operator new[](std::size_t n) { return allocate(n); }
void* operator new(std::size_t n, std::align_val_t a) { return allocate_aligned(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return allocate_aligned(n, a); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return allocate_aligned(n, a);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t& t) noexcept {
  return operator new(n, a, t);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace {

using namespace coll_test;
using pmap::Mesh;
using pmap::P;

using F1 = Tensor<float, 1>;
using F2 = Tensor<float, 2>;
using F3 = Tensor<float, 3>;

constexpr auto kFaultLimit = std::chrono::seconds(kSanitized ? 60 : 20);

/// How one faulted call ended.
struct Tally {
  long points = 0;      ///< allocations failed in turn
  long threw = 0;       ///< calls that ended with std::bad_alloc
  long tolerated = 0;   ///< calls whose failed allocation was absorbed: results still right
};

/// Fails allocation 1, 2, ... of call() in turn. call() runs the faulted call and returns
/// its results; check(results) asserts they are right; untouched() (optional) asserts, after
/// a failed call, that an into() target no device reached is as it was.
template <class Call, class Check>
Tally fail_each_allocation(const std::string& what, Call&& call, Check&& check,
                           const std::function<void()>& after_failure = {}) {
  Watchdog watchdog("test_faults", kFaultLimit);
  check(call());  // warm: the team, the pool and the caches exist before counting starts
  Tally tally;
  for (long k = 1;; ++k) {
    watchdog.arm(what + ": allocation " + std::to_string(k) + " fails");
    bool reached = false;
    arm(k);
    try {
      auto result = call();
      reached = disarm();
      watchdog.disarm();
      check(result);
      if (!reached) break;
      ++tally.tolerated;
    } catch (const std::bad_alloc&) {
      reached = disarm();
      watchdog.disarm();
      EXPECT_TRUE(reached) << what << ": bad_alloc without a failed allocation";
      ++tally.threw;
      if (after_failure) after_failure();
    } catch (const std::exception& e) {
      disarm();
      watchdog.disarm();
      ADD_FAILURE() << what << ": allocation " << k << " failed and the call threw "
                    << typeid(e).name() << ": " << e.what() << " instead of std::bad_alloc";
    }
    ++tally.points;
    watchdog.arm(what + ": the call after failing allocation " + std::to_string(k));
    check(call());  // the same Mapped and Runtime serve a correct call
    watchdog.disarm();
    if (testing::Test::HasFailure()) break;
  }
  EXPECT_GT(tally.points, 0) << what << " allocates nothing: nothing was injected";
  std::printf("[ faults ] %s: %ld allocation points failed, %ld threw bad_alloc, %ld absorbed\n",
              what.c_str(), tally.points, tally.threw, tally.tolerated);
  return tally;
}

F2 rows(Index n, Index len) {
  F2 x(n, len);
  for (Index i = 0; i < n; ++i)
    for (Index k = 0; k < len; ++k) x(i, k) = static_cast<float>((i * 7 + k) % 31);
  return x;
}
/// Column sums of x: what psum over the devices gives each device.
F1 column_sums(const F2& x) {
  F1 s(x.dimension(1));
  s.setZero();
  for (Index i = 0; i < x.dimension(0); ++i)
    for (Index k = 0; k < x.dimension(1); ++k) s(k) += x(i, k);
  return s;
}

class AllocationFaults : public RuntimeTest {};

TEST_P(AllocationFaults, PlainMapAndExpressionOutputs) {
  const F2 x = rows(ni(), 1000);
  auto map = pmap::pmap([](View<float, 1, RowMajor> v) { return pmap::eval(v * 2.f); }, opts());
  auto expr = pmap::pmap([](View<float, 1, RowMajor> v) { return v * 2.f + 1.f; }, opts());
  const F2 twice = x * 2.f;
  fail_each_allocation("plain map", [&] { return map(x); },
                       [&](const F2& r) { EXPECT_TRUE(tensors_equal(r, twice)); });
  const F2 affine = x * 2.f + 1.f;
  fail_each_allocation("expression output", [&] { return expr(x); },
                       [&](const F2& r) { EXPECT_TRUE(tensors_equal(r, affine)); });
}

TEST_P(AllocationFaults, TupleOutputsAndInto) {
  const F2 x = rows(ni(), 300);
  std::atomic<int> returned{0};
  auto f = pmap::pmap(
      [&returned](pmap::Context& ctx, View<float, 1, RowMajor> v) {
        auto out = std::make_tuple(pmap::eval(v + 1.f), ctx.psum(v, "i"), ctx.axis_index() * 3);
        returned.fetch_add(1);
        return out;
      },
      on_axis(rt()));
  const F2 plus = x + 1.f;
  const F1 sums = column_sums(x);
  auto check = [&](const auto& r) {
    EXPECT_TRUE(tensors_equal(std::get<0>(r), plus));
    for (int d = 0; d < n(); ++d) {
      const F1 row = std::get<1>(r).chip(d, 0);
      EXPECT_TRUE(tensors_equal(row, sums));
      EXPECT_EQ(std::get<2>(r)(d), 3 * d);
    }
  };
  fail_each_allocation("tuple outputs", [&] { return f(x); }, check);

  F2 a(ni(), 300), b(ni(), 300);
  Eigen::Tensor<int, 1, RowMajor> c(ni());
  auto poison = [&] {
    a.setConstant(-7.f);
    b.setConstant(-7.f);
    c.setConstant(-7);
    returned = 0;
  };
  fail_each_allocation(
      "into",
      [&] {
        poison();
        f.into(std::tie(a, b, c), x);
        return std::make_tuple(a, b, c);
      },
      check, [&] {
        if (returned.load() > 0) return;  // a device that returned may have written its place
        EXPECT_TRUE(std::all_of(a.data(), a.data() + a.size(), [](float v) { return v == -7.f; }));
        EXPECT_TRUE(std::all_of(c.data(), c.data() + c.size(), [](int v) { return v == -7; }));
      });
}

TEST_P(AllocationFaults, SmallAndLargePsum) {
  for (Index len : {Index{16}, Index{65536}}) {
    const F2 x = rows(ni(), len);
    auto f = pmap::pmap([](pmap::Context& ctx, View<float, 1, RowMajor> v) { return ctx.psum(v, "i"); },
                        on_axis(rt()));
    const F1 sums = column_sums(x);
    fail_each_allocation("psum of " + std::to_string(len) + " floats", [&] { return f(x); },
                         [&](const F2& r) {
                           for (int d = 0; d < n(); ++d) EXPECT_TRUE(tensors_equal(F1(r.chip(d, 0)), sums));
                         });
  }
}

TEST_P(AllocationFaults, AllGatherAndAllToAll) {
  const Index len = 4 * ni();
  const F2 x = rows(ni(), len);
  auto gather = pmap::pmap([](pmap::Context& ctx, View<float, 1, RowMajor> v) { return ctx.all_gather(v, "i"); },
                           on_axis(rt()));
  fail_each_allocation("all_gather", [&] { return gather(x); }, [&](const F3& r) {
    for (int d = 0; d < n(); ++d) EXPECT_TRUE(tensors_equal(F2(r.chip(d, 0)), x));
  });
  auto a2a = pmap::pmap(
      [](pmap::Context& ctx, View<float, 1, RowMajor> v) { return ctx.all_to_all(v, "i", 0, 0, pmap::tiled); },
      on_axis(rt()));
  fail_each_allocation("all_to_all", [&] { return a2a(x); }, [&](const F2& r) {
    for (int d = 0; d < n(); ++d)
      for (int s = 0; s < n(); ++s)
        for (Index k = 0; k < 4; ++k) EXPECT_EQ(r(d, s * 4 + k), x(s, d * 4 + k));
  });
}

TEST_P(AllocationFaults, StartedCollectivesInFlight) {
  // Three started collectives (SPEC 11), a staged and a large one among them, waited for in
  // the other order: any allocation of the starts, the runs or the waits may fail.
  const Index len = 4096;
  const F2 x = rows(ni(), len);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, View<float, 1, RowMajor> v) {
        const F1 head = pmap::eval(v.slice(Eigen::array<Index, 1>{0}, Eigen::array<Index, 1>{8}));
        auto sum = ctx.psum_start(v, "i");
        auto shifted = ctx.ppermute_start(head, "i", ring(ctx.axis_size(), 1));
        auto gathered = ctx.all_gather_start(head, "i");
        const Eigen::Tensor<float, 0, RowMajor> g = gathered.wait().sum();
        const F1 p = shifted.wait();
        F1 out = sum.wait();
        for (Index k = 0; k < 8; ++k) out(k) += p(k) + g();
        return out;
      },
      on_axis(rt()));
  const F1 sums = column_sums(x);
  float all_heads = 0.f;
  for (Index k = 0; k < 8; ++k) all_heads += sums(k);
  fail_each_allocation("started psum, ppermute and all_gather", [&] { return f(x); },
                       [&](const F2& r) {
                         for (int d = 0; d < n(); ++d)
                           for (Index k = 0; k < len; ++k) {
                             const float from = k < 8 ? x((d + n() - 1) % n(), k) + all_heads : 0.f;
                             EXPECT_EQ(r(d, k), sums(k) + from) << "device " << d << " element " << k;
                           }
                       });
}

TEST_P(AllocationFaults, StartedTreesInFlight) {
  // Two started trees (posted: packed into one staged copy each), one leaf donated, waited
  // for in the other order: any allocation of the starts, the nodes or the waits may fail.
  const Index len = 8;
  const F2 x = rows(ni(), len);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, View<float, 1, RowMajor> v) {
        const F1 head = pmap::eval(v);
        auto sums = ctx.psum_start(std::make_tuple(head, F1(pmap::eval(head * 2.f))), "i");
        auto gathered = ctx.all_gather_start(std::array<F1, 2>{head, head}, "i");
        const auto g = gathered.wait();
        const auto [sum, sum2] = sums.wait();
        F1 out = pmap::eval(sum + sum2 + g[0].chip(0, 0) + g[1].chip(1 % g[1].dimension(0), 0));
        return out;
      },
      on_axis(rt()));
  const F1 s = column_sums(x);
  fail_each_allocation("started trees", [&] { return f(x); }, [&](const F2& r) {
    for (int d = 0; d < n(); ++d)
      for (Index k = 0; k < len; ++k)
        EXPECT_EQ(r(d, k), 3.f * s(k) + x(0, k) + x(1 % n(), k)) << "device " << d << " " << k;
  });
}

TEST_P(AllocationFaults, StartedCorePpermutesInFlight) {
  // Two started ppermutes of Eigen Core operands (posted: their storage seen as a tensor),
  // a Matrix read where it is and a donated one, waited for in the other order: any
  // allocation of the starts, the leaves or the waits may fail.
  const Index len = 8;
  const F2 x = rows(ni(), len);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, View<float, 1, RowMajor> v) {
        const Eigen::RowVectorXf m = Eigen::Map<const Eigen::RowVectorXf>(v.data(), len);
        const int n = ctx.axis_size();
        auto right = ctx.ppermute_start(m, "i", ring(n, 1));
        auto left = ctx.ppermute_start(Eigen::RowVectorXf(m * 2.f), "i", ring(n, -1));
        const Eigen::RowVectorXf l = left.wait();
        const Eigen::RowVectorXf r = right.wait();
        F1 out(len);
        for (Index k = 0; k < len; ++k) out(k) = r(k) + l(k);
        return out;
      },
      on_axis(rt()));
  fail_each_allocation("started Core ppermutes", [&] { return f(x); }, [&](const F2& r) {
    const int d_n = n();
    for (int d = 0; d < d_n; ++d)
      for (Index k = 0; k < len; ++k)
        EXPECT_EQ(r(d, k), x((d + d_n - 1) % d_n, k) + 2.f * x((d + 1) % d_n, k))
            << "device " << d << " " << k;
  });
}

TEST_P(AllocationFaults, NestedPmap) {
  const Index outer_n = n() >= 2 ? 2 : 1;
  const Index inner_n = ni() / outer_n;
  F3 x(outer_n, inner_n, 64);
  for (Index i = 0; i < x.size(); ++i) x.data()[i] = static_cast<float>(i % 13);
  pmap::Runtime& runtime = rt();
  auto f = pmap::pmap(
      [&runtime](pmap::Context&, View<float, 2, RowMajor> xi) {
        auto inner = pmap::pmap(
            [](pmap::Context& ctx, View<float, 1, RowMajor> v) { return ctx.psum(v, {"i", "j"}); },
            on_axis(runtime, "j"));
        return inner(xi);
      },
      on_axis(rt(), "i"));
  F1 total(64);
  total.setZero();
  for (Index i = 0; i < outer_n; ++i)
    for (Index j = 0; j < inner_n; ++j)
      for (Index k = 0; k < 64; ++k) total(k) += x(i, j, k);
  fail_each_allocation("nested pmap", [&] { return f(x); }, [&](const F3& r) {
    for (Index i = 0; i < outer_n; ++i)
      for (Index j = 0; j < inner_n; ++j)
        for (Index k = 0; k < 64; ++k) EXPECT_EQ(r(i, j, k), total(k));
  });
}

TEST_P(AllocationFaults, ReplicatedOutputs) {
  const F2 x = rows(ni(), 512);
  auto f = pmap::pmap([](pmap::Context& ctx, View<float, 1, RowMajor> v) { return ctx.psum(v, "i"); },
                      pmap::out_axes(pmap::none), on_axis(rt()));
  const F1 sums = column_sums(x);
  fail_each_allocation("out_axes none", [&] { return f(x); },
                       [&](const F1& r) { EXPECT_TRUE(tensors_equal(r, sums)); });
}

TEST_P(AllocationFaults, ShardMapUnevenBlocksAndInto) {
  const Mesh mesh({{"x", n()}}, &rt());
  const Index rows_n = 3 * ni() + 1;
  const F2 x = rows(rows_n, 40);
  std::atomic<int> returned{0};
  auto f = pmap::shard_map(
      [&returned](pmap::Context& ctx, View<float, 2, RowMajor> b) {
        auto out = std::make_tuple(pmap::eval(b * 2.f), ctx.psum(b.sum(), "x"));
        returned.fetch_add(1);
        return out;
      },
      mesh, {P("x")}, {P("x"), P()});
  const F2 twice = x * 2.f;
  const Eigen::Tensor<float, 0, RowMajor> total = x.sum();
  auto check = [&](const auto& r) {
    EXPECT_TRUE(tensors_equal(std::get<0>(r), twice));
    EXPECT_FLOAT_EQ(std::get<1>(r)(), total());
  };
  fail_each_allocation("shard_map", [&] { return f(x); }, check);

  F2 y(rows_n, 40);
  Eigen::Tensor<float, 0, RowMajor> s;
  fail_each_allocation(
      "shard_map into",
      [&] {
        y.setConstant(-7.f);
        s() = -7.f;
        returned = 0;
        f.into(std::tie(y, s), x);
        return std::make_tuple(y, s);
      },
      check, [&] {
        // Blocks are placed only after every device returned.
        if (returned.load() == n()) return;
        EXPECT_TRUE(std::all_of(y.data(), y.data() + y.size(), [](float v) { return v == -7.f; }));
        EXPECT_EQ(s(), -7.f);
      });
}

/// The bug that motivated the hooks: the device that allocates a result fails, and every
/// other device waited for its allocation forever.
TEST_P(AllocationFaults, AHugeResultFailsEveryDevice) {
  if (kSanitized) GTEST_SKIP() << "the sanitizers' allocators abort on a 4 TiB request";
  const F2 x = rows(ni(), 4);
  auto f = pmap::pmap([](View<float, 1, RowMajor> v) {
    return pmap::eval(v.slice(Eigen::array<Index, 1>{0}, Eigen::array<Index, 1>{1}).broadcast(
        Eigen::array<Index, 1>{Index{1} << 40}));
  }, opts());
  Watchdog watchdog("test_faults", kFaultLimit);
  watchdog.arm("a 4 TiB result");
  EXPECT_THROW(f(x), std::bad_alloc);
  watchdog.disarm();
}

INSTANTIATE_TEST_SUITE_P(Runtimes, AllocationFaults,
                         testing::Values(RtConfig{1, 1}, RtConfig{2, 2}, RtConfig{8, 2}, RtConfig{8, 1}),
                         config_name);

// ---- kernel exceptions at every collective --------------------------------------------------

struct Injected : std::runtime_error {
  Injected(int d, int j) : std::runtime_error("injected"), device(d), step(j) {}
  int device, step;
};

class KernelFaults : public RuntimeTest {};

/// Pairs of neighbours when the axis divides into them, else the whole axis.
pmap::Groups pairs(int n) {
  if (n % 2 != 0) return {iota(n)};
  pmap::Groups g;
  for (int d = 0; d < n; d += 2) g.push_back({d, d + 1});
  return g;
}

/// What the fault programs return when nothing throws: the column sums of x, the maximum
/// over each device's pair and `extra(d, k)`.
template <class Extra>
F2 sums_and_pair_maxima(const F2& x, int n, Extra&& extra) {
  const F1 sums = column_sums(x);
  F2 expected(x.dimension(0), x.dimension(1));
  for (int d = 0; d < n; ++d) {
    const auto group = group_of(pairs(n), n, d).first;
    for (Index k = 0; k < x.dimension(1); ++k) {
      float m = x(group[0], k);
      for (int member : group) m = std::max(m, x(member, k));
      expected(d, k) = sums(k) + m + extra(d, k);
    }
  }
  return expected;
}

/// Device d throws just before point j of the program f, for every d < n and j < points
/// (fail_device and fail_point tell the kernel which): each call must end with that device's
/// exception within the watchdog's limit, and the next call must give `expected`. Returns
/// how many points were injected.
template <class F>
int throw_at_every_point(F& f, const F2& x, const F2& expected, int n, int points,
                         std::atomic<int>& fail_device, std::atomic<int>& fail_point,
                         const std::string& what) {
  Watchdog watchdog("test_faults", kFaultLimit);
  int injected = 0;
  for (int d = 0; d < n; ++d)
    for (int j = 0; j < points; ++j) {
      fail_device = d;
      fail_point = j;
      watchdog.arm("device " + std::to_string(d) + " throws before " + what + " " + std::to_string(j));
      try {
        f(x);
        ADD_FAILURE() << "device " << d << " point " << j << ": no exception";
      } catch (const Injected& e) {
        EXPECT_EQ(e.device, d);
        EXPECT_EQ(e.step, j);
      }
      fail_device = -1;
      EXPECT_TRUE(tensors_equal(f(x), expected)) << "after device " << d << " threw at " << j;
      watchdog.disarm();
      ++injected;
      if (testing::Test::HasFailure()) return injected;
    }
  return injected;
}

/// A program of six collectives of different kinds (staged, in place, grouped, data
/// movement); device d throws just before collective j, for every d and j.
TEST_P(KernelFaults, ThrowAtEveryCollectiveOnEveryDevice) {
  constexpr int kSteps = 6;
  constexpr Index kLen = 2048;
  const F2 x = rows(ni(), kLen);
  std::atomic<int> fail_device{-1};
  std::atomic<int> fail_step{-1};
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, View<float, 1, RowMajor> v) {
        const int me = ctx.axis_index();
        auto maybe_throw = [&](int j) {
          if (me == fail_device.load() && j == fail_step.load()) throw Injected(me, j);
        };
        maybe_throw(0);
        F1 a = ctx.psum(pmap::eval(v.slice(Eigen::array<Index, 1>{0}, Eigen::array<Index, 1>{8})), "i");
        maybe_throw(1);
        F1 b = ctx.psum(v, "i");
        maybe_throw(2);
        F1 c = ctx.pmax(v, "i", pairs(ctx.axis_size()));
        maybe_throw(3);
        auto g = ctx.all_gather(a, "i");
        maybe_throw(4);
        F1 p = ctx.ppermute(b, "i", ring(ctx.axis_size(), 1));
        maybe_throw(5);
        const Eigen::Tensor<float, 0, RowMajor> extra = a.sum() + g.sum();
        F1 out = pmap::eval(p + c + extra());
        return out;
      },
      on_axis(rt()));
  // The serial model: b is the same everywhere (so is p), c the maximum over the pair.
  const F1 sums = column_sums(x);
  float head = 0.f;
  for (Index k = 0; k < 8; ++k) head += sums(k);
  const F2 expected =
      sums_and_pair_maxima(x, n(), [&](int, Index) { return head * static_cast<float>(1 + n()); });
  EXPECT_TRUE(tensors_equal(f(x), expected));
  const int injected =
      throw_at_every_point(f, x, expected, n(), kSteps, fail_device, fail_step, "collective");
  if (testing::Test::HasFailure()) return;
  std::printf("[ faults ] %d kernel-exception points injected on %d devices, %d threads\n", injected,
              n(), GetParam().threads);
}

/// Started collectives (SPEC 11): device d throws just before start or wait j, for every d
/// and j, with up to three collectives in flight; the Pendings it drops while unwinding are
/// never waited, and no peer may be left waiting for them or read what they held.
TEST_P(KernelFaults, ThrowAtEveryStartAndWaitOnEveryDevice) {
  constexpr int kPoints = 7;
  constexpr Index kLen = 2048;
  const F2 x = rows(ni(), kLen);
  std::atomic<int> fail_device{-1};
  std::atomic<int> fail_point{-1};
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, View<float, 1, RowMajor> v) {
        const int me = ctx.axis_index();
        auto maybe_throw = [&](int j) {
          if (me == fail_device.load() && j == fail_point.load()) throw Injected(me, j);
        };
        const F1 head = pmap::eval(v.slice(Eigen::array<Index, 1>{0}, Eigen::array<Index, 1>{8}));
        maybe_throw(0);
        auto sum = ctx.psum_start(v, "i");  // 8 KiB over the whole axis: staged
        maybe_throw(1);
        auto shifted = ctx.ppermute_start(head, "i", ring(ctx.axis_size(), 1));
        maybe_throw(2);
        auto top = ctx.pmax_start(v, "i", pairs(ctx.axis_size()));
        maybe_throw(3);
        const F1 p = shifted.wait();
        maybe_throw(4);
        F1 out = sum.wait();
        maybe_throw(5);
        const F1 c = top.wait();
        maybe_throw(6);
        for (Index k = 0; k < kLen; ++k) out(k) += c(k) + (k < 8 ? p(k) : 0.f);
        return out;
      },
      on_axis(rt()));
  const int d_n = n();
  const F2 expected = sums_and_pair_maxima(
      x, d_n, [&](int d, Index k) { return k < 8 ? x((d + d_n - 1) % d_n, k) : 0.f; });
  EXPECT_TRUE(tensors_equal(f(x), expected));
  throw_at_every_point(f, x, expected, n(), kPoints, fail_device, fail_point, "start or wait");
}

/// The same with trees in flight (posted: their leaves pack into one staged copy): a psum of
/// a tuple, one leaf donated, and a pmax of an array, waited for in the other order.
TEST_P(KernelFaults, ThrowAtEveryStartAndWaitWithTreesInFlight) {
  constexpr int kPoints = 5;
  constexpr Index kLen = 8;
  const F2 x = rows(ni(), kLen);
  std::atomic<int> fail_device{-1};
  std::atomic<int> fail_point{-1};
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, View<float, 1, RowMajor> v) {
        const int me = ctx.axis_index();
        auto maybe_throw = [&](int j) {
          if (me == fail_device.load() && j == fail_point.load()) throw Injected(me, j);
        };
        const F1 head = pmap::eval(v);
        maybe_throw(0);
        auto sums = ctx.psum_start(std::make_tuple(head, F1(pmap::eval(head * 2.f))), "i");
        maybe_throw(1);
        auto tops = ctx.pmax_start(std::array<F1, 2>{head, pmap::eval(head + 1.f)}, "i");
        maybe_throw(2);
        const auto [top, top1] = tops.wait();
        maybe_throw(3);
        const auto [sum, sum2] = sums.wait();
        maybe_throw(4);
        F1 out = pmap::eval(sum + sum2 + top + top1);
        return out;
      },
      on_axis(rt()));
  const F1 s = column_sums(x);
  F2 expected(n(), kLen);
  for (Index k = 0; k < kLen; ++k) {
    float top = x(0, k);
    for (int d = 1; d < n(); ++d) top = std::max(top, x(d, k));
    for (int d = 0; d < n(); ++d) expected(d, k) = s(k) + 2.f * s(k) + top + (top + 1.f);
  }
  EXPECT_TRUE(tensors_equal(f(x), expected));
  throw_at_every_point(f, x, expected, n(), kPoints, fail_device, fail_point, "start or wait");
}

PMAP_TEST_INSTANTIATE(KernelFaults);

}  // namespace
