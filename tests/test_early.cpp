/// @file test_early.cpp
/// @brief Started point-to-point collectives in the shapes a stencil uses them (SPEC 11):
/// one-point halos and rings started before the work that does not need them and waited for
/// after it. Bit for bit the blocking results in stencil loops with both halos started and
/// waits in either order; three in flight (the oldest completes first); behind a started
/// collective waited later and around blocking collectives; a Pending dropped while its
/// kernel unwinds and the kernel goes on; a kernel that throws with both halos started;
/// different permutations on different devices (E14). 1 to 8 devices on 1 and 2 threads.

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "collective_util.hpp"

namespace {

using namespace coll_test;

class Early : public RuntimeTest {};
INSTANTIATE_TEST_SUITE_P(Runtimes, Early, testing::ValuesIn(collective_configs()), config_name);

bool same(const F1& a, const F1& b) {
  if (a.size() != b.size()) return false;
  for (Index k = 0; k < a.size(); ++k)
    if (a(k) != b(k)) return false;
  return true;
}

F1 point(const F1& x, Index k) {
  F1 p(1);
  p(0) = x(k);
  return p;
}

/// One explicit step of the periodic heat equation given both halos.
F1 heat_step(const F1& u, float left, float right) {
  const Index m = u.size();
  F1 next(m);
  for (Index k = 0; k < m; ++k) {
    const float l = k == 0 ? left : u(k - 1);
    const float r = k == m - 1 ? right : u(k + 1);
    next(k) = u(k) + 0.25f * (l - 2.f * u(k) + r);
  }
  return next;
}

TEST_P(Early, StencilWithBothHalosInFlightIsTheBlockingStencil) {
  const int devices = n();
  expect_no_mismatch(rt(), devices, 6, [devices](pmap::Context& ctx, auto v) {
    const Perm to_left = ring(devices, -1), to_right = ring(devices, 1);
    F1 blocking = pmap::eval(v), overlapped = blocking;
    for (int step = 0; step < 40; ++step) {
      const F1 from_right = ctx.ppermute(point(blocking, 0), "i", to_left);
      const F1 from_left = ctx.ppermute(point(blocking, blocking.size() - 1), "i", to_right);
      blocking = heat_step(blocking, from_left(0), from_right(0));

      auto right = ctx.ppermute_start(point(overlapped, 0), "i", to_left);
      auto left = ctx.ppermute_start(point(overlapped, overlapped.size() - 1), "i", to_right);
      F1 l, r;
      if (step % 2 == 0) {  // waits in start order and in the other
        r = right.wait();
        l = left.wait();
      } else {
        l = left.wait();
        r = right.wait();
      }
      overlapped = heat_step(overlapped, l(0), r(0));
    }
    return static_cast<int>(!same(blocking, overlapped));
  });
}

TEST_P(Early, ThreeInFlightCompleteTheOldestFirst) {
  const int devices = n();
  expect_no_mismatch(rt(), devices, 5, [devices](pmap::Context& ctx, auto v) {
    const F1 x = pmap::eval(v);
    const F1 y = pmap::eval(x * 2.f), z = pmap::eval(x + 1.f);
    int bad = 0;
    for (int round = 0; round < 10; ++round) {
      auto a = ctx.ppermute_start(x, "i", ring(devices, 1));
      auto b = ctx.ppermute_start(y, "i", ring(devices, 2));
      auto c = ctx.ppermute_start(z, "i", ring(devices, -1));  // a runs first
      bad += !same(c.wait(), ctx.ppermute(z, "i", ring(devices, -1)));
      bad += !same(a.wait(), ctx.ppermute(x, "i", ring(devices, 1)));
      bad += !same(b.wait(), ctx.ppermute(y, "i", ring(devices, 2)));
    }
    return bad;
  });
}

TEST_P(Early, BehindALaterRunningStartAndAroundBlockingCollectives) {
  const int devices = n();
  expect_no_mismatch(rt(), devices, 5, [devices](pmap::Context& ctx, auto v) {
    const F1 x = pmap::eval(v);
    F1 big(64 * 1024);  // in place (64K floats), with a small one started behind it
    big.setConstant(x(0));
    int bad = 0;
    for (int round = 0; round < 5; ++round) {
      auto a = ctx.ppermute_start(x, "i", ring(devices, 1));
      auto s = ctx.psum(x, "i");                               // a completes first
      auto b = ctx.ppermute_start(big, "i", ring(devices, 1));
      auto c = ctx.ppermute_start(x, "i", ring(devices, -1));  // waited first
      bad += !same(c.wait(), ctx.ppermute(x, "i", ring(devices, -1)));
      bad += !same(b.wait(), ctx.ppermute(big, "i", ring(devices, 1)));
      bad += !same(a.wait(), ctx.ppermute(x, "i", ring(devices, 1)));
      bad += !same(s, ctx.psum(x, "i"));
      auto d = ctx.ppermute_start(x(0), "i", ring(devices, 1));  // a scalar
      bad += d.wait() != ctx.ppermute(x(0), "i", ring(devices, 1));
    }
    return bad;
  });
}

TEST_P(Early, APendingDroppedWhileUnwindingLeavesTheNextCollectivesRight) {
  const int devices = n();
  expect_no_mismatch(rt(), devices, 5, [devices](pmap::Context& ctx, auto v) {
    const F1 x = pmap::eval(v);
    int bad = 0;
    for (int round = 0; round < 5; ++round) {
      try {
        auto a = ctx.ppermute_start(x, "i", ring(devices, 1));
        auto b = ctx.ppermute_start(x, "i", ring(devices, -1));
        throw std::runtime_error("caught in the kernel");
      } catch (const std::runtime_error&) {
      }
      bad += !same(ctx.ppermute(x, "i", ring(devices, 1)), ctx.ppermute(x, "i", ring(devices, 1)));
      const F1 s = ctx.psum(x, "i");
      auto c = ctx.ppermute_start(s, "i", ring(devices, 1));
      bad += !same(c.wait(), ctx.ppermute(s, "i", ring(devices, 1)));
    }
    return bad;
  });
}

TEST_P(Early, AKernelThatThrowsWithBothHalosInFlightCancelsTheCall) {
  if (n() < 2) GTEST_SKIP() << "needs two devices";
  const int devices = n();
  for (int thrower : {0, devices - 1}) {
    auto f = pmap::pmap(
        [devices, thrower](pmap::Context& ctx, auto v) {
          F1 u = pmap::eval(v);
          for (int step = 0; step < 20; ++step) {
            auto right = ctx.ppermute_start(point(u, 0), "i", ring(devices, -1));
            auto left = ctx.ppermute_start(point(u, u.size() - 1), "i", ring(devices, 1));
            if (step == 7 && ctx.axis_index() == thrower) throw std::runtime_error("device failed");
            const F1 l = left.wait(), r = right.wait();
            u = heat_step(u, l(0), r(0));
          }
          return u;
        },
        on_axis(rt()));
    F2 x = make<F2>(9, devices, 4);
    expect_throw_msg<std::runtime_error>([&] { (void)f(x); }, "device failed");
  }
  // The runtime is unaffected.
  auto g = pmap::pmap(
      [devices](pmap::Context& ctx, auto v) {
        return ctx.ppermute_start(pmap::eval(v), "i", ring(devices, 1)).wait();
      },
      on_axis(rt()));
  F2 x = make<F2>(4, devices, 3);
  const F2 got = g(x);
  for (int p = 0; p < devices; ++p)
    for (Index k = 0; k < 3; ++k) EXPECT_EQ(got(p, k), x((p + devices - 1) % devices, k));
}

TEST_P(Early, DifferentPermutationsOnDifferentDevicesAreE14) {
  if (n() < 3) GTEST_SKIP() << "needs three devices";
  const int devices = n();
  auto f = pmap::pmap(
      [devices](pmap::Context& ctx, auto v) {
        const F1 x = pmap::eval(v);
        const int shift = ctx.axis_index() == 1 ? 2 : 1;
        auto a = ctx.ppermute_start(x, "i", ring(devices, shift));
        return a.wait();
      },
      on_axis(rt()));
  F2 x = make<F2>(2, devices, 3);
  try {
    (void)f(x);
    ADD_FAILURE() << "no error";
  } catch (const pmap::DeviceError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("called ppermute over axis i on float32[3], but device"), std::string::npos)
        << text;
  }
}

}  // namespace
