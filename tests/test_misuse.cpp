/// @file test_misuse.cpp
/// @brief Collective misuse (SPEC 5, E11 and E14; SPEC 8.7): unbound axis names, devices
/// that return while peers wait in a collective, devices that disagree on the collective or
/// its shape, kernels that throw while peers wait. Each is reported at once, never a hang,
/// and the runtime serves the next call normally.

#include <atomic>
#include <stdexcept>
#include <string>
#include <tuple>
#include <typeinfo>
#include <utility>
#include <vector>

#include "collective_util.hpp"

namespace {

using namespace coll_test;

using F1 = Tensor<float, 1>;
using F2 = Tensor<float, 2>;

/// The axis name every misuse test binds: long enough that finding it in a message means
/// the message names the axis.
constexpr const char* kAxis = "batch";

struct MyError : std::exception {
  explicit MyError(int c) : code(c) {}
  const char* what() const noexcept override { return "my kernel error"; }
  int code;
};

class Misuse : public RuntimeTest {
 protected:
  /// A normal psum call on this runtime that must succeed and be correct, several times.
  void expect_healthy() {
    F2 x = make<F2>(1, n(), 3);
    auto f = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, kAxis); }, on_axis(rt(), kAxis));
    for (int k = 0; k < 5; ++k)
      ASSERT_TRUE(tensors_near(f(x), replicate(group_sum(x, iota(n())), n()))) << "call " << k;
  }

  /// Runs f, which must throw pmap::DeviceError (a std::runtime_error, not a pmap::Error)
  /// whose message contains every string of `parts`. Returns the message.
  template <class F>
  std::string expect_device_error(F&& f, std::vector<std::string> parts) {
    try {
      f();
      ADD_FAILURE() << "nothing thrown, expected pmap::DeviceError";
    } catch (const pmap::DeviceError& e) {
      const std::string what = e.what();
      EXPECT_NE(dynamic_cast<const std::runtime_error*>(&e), nullptr);
      EXPECT_GE(e.device_id(), 0) << what;
      EXPECT_LT(e.device_id(), n()) << what;
      for (const auto& p : parts) EXPECT_NE(what.find(p), std::string::npos) << "\"" << p << "\" not in: " << what;
      return what;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "expected pmap::DeviceError, got " << typeid(e).name() << " \"" << e.what()
                    << "\"";
    }
    return "";
  }
};
INSTANTIATE_TEST_SUITE_P(Runtimes, Misuse,
                         testing::Values(RtConfig{2, 1}, RtConfig{4, 2}, RtConfig{8, 1},
                                         RtConfig{8, 2}),
                         config_name);

// ---- E11: unbound axis names --------------------------------------------------------------

TEST_P(Misuse, UnboundAxisNameInACollectiveIsANameError) {
  F2 x = make<F2>(2, n(), 3);
  auto run = [&](auto op) {
    auto f = pmap::pmap([&](pmap::Context& ctx, auto v) { return op(ctx, v); }, on_axis(rt(), kAxis));
    expect_throw_msg<pmap::NameError>([&] { (void)f(x); }, "unbound axis name: k");
  };
  run([](pmap::Context& ctx, auto v) { return ctx.psum(v, "k"); });
  run([](pmap::Context& ctx, auto v) { return ctx.pmean(v, {kAxis, "k"}); });
  run([](pmap::Context& ctx, auto v) { return ctx.all_gather(v, "k"); });
  run([](pmap::Context& ctx, auto v) { return ctx.ppermute(v, "k", ring(ctx.axis_size(), 1)); });
  run([](pmap::Context& ctx, auto v) { return ctx.pbroadcast(v, "k", 0); });
  run([](pmap::Context& ctx, auto) { return ctx.axis_index("k"); });
  run([](pmap::Context& ctx, auto) { return ctx.axis_size({"k"}); });
  expect_healthy();
}

TEST_P(Misuse, AnonymousAxisBindsNoName) {
  F2 x = make<F2>(3, n(), 2);
  pmap::Options o;
  o.runtime = &rt();
  auto f = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); }, o);
  expect_throw_msg<pmap::NameError>([&] { (void)f(x); }, "unbound axis name: i");
  expect_healthy();
}

TEST_P(Misuse, NameErrorDerivesFromPmapError) {
  F2 x = make<F2>(4, n(), 2);
  auto f = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "k"); }, on_axis(rt(), kAxis));
  try {
    (void)f(x);
    ADD_FAILURE() << "nothing thrown";
  } catch (const pmap::Error& e) {
    EXPECT_NE(dynamic_cast<const pmap::NameError*>(&e), nullptr);
    EXPECT_NE(dynamic_cast<const std::invalid_argument*>(&e), nullptr);
  }
}

// ---- E14: a device returns while its peers wait --------------------------------------------

TEST_P(Misuse, DeviceReturnsWhilePeersWaitInPsum) {
  if (n() < 2) GTEST_SKIP();
  F2 x = make<F2>(5, n(), 3);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) -> F1 {
        if (ctx.axis_index() != 0) return ctx.psum(v, kAxis);
        return pmap::eval(v);
      },
      on_axis(rt(), kAxis));
  expect_device_error([&] { (void)f(x); }, {"psum", kAxis});
  expect_healthy();
}

TEST_P(Misuse, OnlyOneDeviceCallsACollective) {
  if (n() < 2) GTEST_SKIP();
  F2 x = make<F2>(6, n(), 3);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) -> F1 {
        if (ctx.axis_index() == ctx.axis_size() - 1) return ctx.all_gather(v, kAxis, 0, pmap::tiled);
        return pmap::eval(v);
      },
      on_axis(rt(), kAxis));
  expect_device_error([&] { (void)f(x); }, {"all_gather", kAxis});
  expect_healthy();
}

TEST_P(Misuse, OneDeviceCallsAnExtraCollective) {
  if (n() < 2) GTEST_SKIP();
  F2 x = make<F2>(7, n(), 3);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        F1 s = ctx.psum(v, kAxis);
        if (ctx.axis_index() == 0) s = ctx.pmax(s, kAxis);
        return s;
      },
      on_axis(rt(), kAxis));
  expect_device_error([&] { (void)f(x); }, {"pmax", kAxis});
  expect_healthy();
}

TEST_P(Misuse, OneDeviceCallsAPpermuteThatNobodyWaitsFor) {
  // Device 0 receives nothing from this permutation, so its ppermute waits for nobody; device
  // 1, which would read device 0's input, returns without calling it. The call must fail
  // anyway, when the devices are seen to have called different numbers of collectives.
  if (n() < 2) GTEST_SKIP();
  F2 x = make<F2>(12, n(), 3);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) -> F1 {
        F1 s = ctx.psum(v, kAxis);
        if (ctx.axis_index() == 0)
          return ctx.ppermute(s, kAxis, std::vector<std::pair<int, int>>{{0, 1}});
        return s;
      },
      on_axis(rt(), kAxis));
  const std::string what = expect_device_error([&] { (void)f(x); }, {"ppermute", kAxis});
  EXPECT_NE(what.find("returned from its kernel without calling it"), std::string::npos) << what;
  expect_healthy();
}

TEST_P(Misuse, OneDeviceSkipsAPpermuteBeforeAPsum) {
  // The device after the one that skips the ring permutation reads from it, and finds it in
  // the psum that follows instead.
  if (n() < 2) GTEST_SKIP();
  F2 x = make<F2>(13, n(), 3);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        F1 s = pmap::eval(v);
        if (ctx.axis_index() != 0) s = ctx.ppermute(s, kAxis, ring(ctx.axis_size(), 1));
        return ctx.psum(s, kAxis);
      },
      on_axis(rt(), kAxis));
  const std::string what = expect_device_error([&] { (void)f(x); }, {kAxis});
  EXPECT_NE(what.find("ppermute"), std::string::npos) << what;
  expect_healthy();
}

// ---- E14: devices disagree ------------------------------------------------------------------

TEST_P(Misuse, DevicesCallDifferentCollectives) {
  if (n() < 2) GTEST_SKIP();
  F2 x = make<F2>(8, n(), 3);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) -> F1 {
        if (ctx.axis_index() == 1) return ctx.pmax(v, kAxis);
        return ctx.psum(v, kAxis);
      },
      on_axis(rt(), kAxis));
  const std::string what = expect_device_error([&] { (void)f(x); }, {kAxis});
  EXPECT_TRUE(what.find("psum") != std::string::npos || what.find("pmax") != std::string::npos)
      << "names no collective: " << what;
  expect_healthy();
}

TEST_P(Misuse, DevicesCallACollectiveWithDifferentShapes) {
  if (n() < 2) GTEST_SKIP();
  F2 x = make<F2>(9, n(), 3);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto) {
        F1 t(ctx.axis_index() == 0 ? 3 : 2);
        t.setConstant(1.f);
        return ctx.psum(t, kAxis)(0);
      },
      on_axis(rt(), kAxis));
  expect_device_error([&] { (void)f(x); }, {"psum", kAxis});
  expect_healthy();
}

TEST_P(Misuse, DevicesCallAllGatherWithDifferentShapes) {
  if (n() < 2) GTEST_SKIP();
  F2 x = make<F2>(10, n(), 3);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto) {
        Tensor<float, 2> t(2, ctx.axis_index() == ctx.axis_size() - 1 ? 4 : 3);
        t.setConstant(1.f);
        return ctx.all_gather(t, kAxis)(0, 0, 0);
      },
      on_axis(rt(), kAxis));
  expect_device_error([&] { (void)f(x); }, {"all_gather", kAxis});
  expect_healthy();
}

// ---- kernel exceptions while peers wait -----------------------------------------------------

TEST_P(Misuse, KernelThrowsWhilePeersWaitInACollective) {
  F2 x = make<F2>(11, n(), 3);
  const int bad = n() - 1;
  auto f = pmap::pmap(
      [bad](pmap::Context& ctx, auto v) {
        F1 s = ctx.psum(v, kAxis);
        if (ctx.axis_index() == bad) throw MyError(ctx.axis_index());
        return ctx.psum(s, kAxis);
      },
      on_axis(rt(), kAxis));
  try {
    (void)f(x);
    ADD_FAILURE() << "nothing thrown";
  } catch (const MyError& e) {
    EXPECT_EQ(e.code, bad);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected MyError, got " << typeid(e).name() << " \"" << e.what() << "\"";
  }
  expect_healthy();
}

TEST_P(Misuse, StandardExceptionFromAKernelIsRethrownAsIs) {
  F2 x = make<F2>(12, n(), 3);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        if (ctx.axis_index() == 0) throw std::out_of_range("device zero gave up");
        return ctx.all_gather(v, kAxis);
      },
      on_axis(rt(), kAxis));
  try {
    (void)f(x);
    ADD_FAILURE() << "nothing thrown";
  } catch (const std::out_of_range& e) {
    EXPECT_EQ(typeid(e), typeid(std::out_of_range));
    EXPECT_STREQ(e.what(), "device zero gave up");
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected std::out_of_range, got " << typeid(e).name() << " \"" << e.what() << "\"";
  }
  expect_healthy();
}

TEST_P(Misuse, CollectiveArgumentErrorOnOneDeviceWhilePeersWait) {
  // Device 0 passes an invalid perm (a ValueError on that device); the others wait in a
  // valid ppermute. The ValueError reaches the caller; nobody hangs.
  if (n() < 2) GTEST_SKIP();
  F2 x = make<F2>(13, n(), 3);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        const int size = ctx.axis_size();
        if (ctx.axis_index() == 0)
          return ctx.ppermute(v, kAxis, std::vector<std::pair<int, int>>{{0, 1}, {0, 1}});
        return ctx.ppermute(v, kAxis, ring(size, 1));
      },
      on_axis(rt(), kAxis));
  expect_throw_msg<pmap::ValueError>([&] { (void)f(x); },
                                     "ppermute sources and destinations must be unique, got "
                                     "((0, 1), (0, 1)).");
  expect_healthy();
}

// ---- the same Mapped after a failure --------------------------------------------------------

TEST_P(Misuse, SameMappedServesTheNextCallAfterEachFailure) {
  if (n() < 2) GTEST_SKIP();
  std::atomic<int> mode{0};
  auto f = pmap::pmap(
      [&mode](pmap::Context& ctx, auto v) -> F1 {
        const int m = mode.load();
        if (m == 1 && ctx.axis_index() == 0) return pmap::eval(v);           // returns early
        if (m == 2 && ctx.axis_index() == 1) return ctx.pmin(v, kAxis);      // other collective
        if (m == 3 && ctx.axis_index() == 0) throw MyError(3);               // throws
        return ctx.psum(v, kAxis);
      },
      on_axis(rt(), kAxis));
  F2 x = make<F2>(14, n(), 4);
  const auto expected = replicate(group_sum(x, iota(n())), n());
  for (int round = 0; round < 3; ++round) {
    for (int m = 1; m <= 3; ++m) {
      mode = m;
      if (m == 3) {
        EXPECT_THROW((void)f(x), MyError);
      } else {
        EXPECT_THROW((void)f(x), pmap::DeviceError) << "mode " << m;
      }
      mode = 0;
      ASSERT_TRUE(tensors_near(f(x), expected)) << "after mode " << m << " round " << round;
    }
  }
}

}  // namespace
