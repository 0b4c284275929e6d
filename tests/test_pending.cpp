/// @file test_pending.cpp
/// @brief Nonblocking collectives (SPEC 11): every *_start form waited gives bit for bit the
/// blocking result, for tensors, expressions, donated tensors, scalars, trees and Eigen Core
/// operands, small (staged) and large (in place), with groups, nested and in shard_map; waits
/// in any order with blocking collectives and further starts between; devices that start
/// different sequences get E14 naming both; a Pending destroyed unwaited completes its
/// collective; a kernel that throws with collectives in flight cancels the call and leaves
/// the runtime usable. 1 to 8 devices on 1 and 2 threads.

#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "collective_util.hpp"

namespace {

using namespace coll_test;
using pmap::P;
using I1 = Tensor<int, 1>;

class Pending : public RuntimeTest {};
INSTANTIATE_TEST_SUITE_P(Runtimes, Pending, testing::ValuesIn(collective_configs()), config_name);

/// Same dimensions and the same bytes (bit for bit, also for NaN-free floats).
template <class A, class B>
bool same(const A& a, const B& b) {
  if constexpr (std::is_arithmetic_v<A>) {
    return std::memcmp(&a, &b, sizeof a) == 0;
  } else {
    if (a.size() != b.size()) return false;
    if constexpr (requires { a.dimensions(); }) {
      if (!(a.dimensions() == b.dimensions())) return false;
    } else {
      if (a.rows() != b.rows() || a.cols() != b.cols()) return false;
    }
    return std::memcmp(a.data(), b.data(), sizeof(*a.data()) * static_cast<std::size_t>(a.size())) == 0;
  }
}

// Small operands take the staged path, 64 Ki floats the in-place one.
constexpr Index kSmall = 5;
constexpr Index kLarge = 64 * 1024;

TEST_P(Pending, StartedReductionsAreTheBlockingOnes) {
  for (Index len : {kSmall, kLarge}) {
    expect_no_mismatch(rt(), n(), len, [](pmap::Context& ctx, auto v) {
      const F1 x = pmap::eval(v);
      int bad = 0;
      {
        auto h = ctx.psum_start(x, "i");  // lvalue
        bad += !same(h.wait(), ctx.psum(x, "i"));
      }
      {
        auto h = ctx.pmean_start(x * 2.f, "i");  // expression, evaluated now
        bad += !same(h.wait(), ctx.pmean(x * 2.f, "i"));
      }
      {
        F1 donated = x;
        auto h = ctx.pmax_start(std::move(donated), "i");  // rvalue: owned, donated
        bad += !same(h.wait(), ctx.pmax(x, "i"));
      }
      {
        auto h = ctx.pmin_start(x(0), "i");  // scalar
        bad += !same(h.wait(), ctx.pmin(x(0), "i"));
      }
      {
        auto h = ctx.psum_start(std::make_tuple(F1(x), x(0)), "i");  // donated tree
        auto r = h.wait();
        auto e = ctx.psum(std::make_tuple(F1(x), x(0)), "i");
        bad += !same(std::get<0>(r), std::get<0>(e)) + !same(std::get<1>(r), std::get<1>(e));
      }
      {
        const Eigen::MatrixXf m = Eigen::Map<const Eigen::MatrixXf>(x.data(), 1, x.size());
        auto h = ctx.pmax_start(m, "i");  // Eigen Core operand
        bad += !same(h.wait(), ctx.pmax(m, "i"));
      }
      return bad;
    });
  }
}

TEST_P(Pending, StartedDataMoversAreTheBlockingOnes) {
  const int devices = n();
  for (Index len : {Index{2} * devices, kLarge}) {
    expect_no_mismatch(rt(), devices, len, [devices](pmap::Context& ctx, auto v) {
      const F1 x = pmap::eval(v);
      int bad = 0;
      bad += !same(ctx.all_gather_start(x, "i").wait(), ctx.all_gather(x, "i"));
      bad += !same(ctx.all_gather_start(x, "i", 0, pmap::tiled).wait(),
                   ctx.all_gather(x, "i", 0, pmap::tiled));
      bad += !same(ctx.psum_scatter_start(x, "i", 0, pmap::tiled).wait(),
                   ctx.psum_scatter(x, "i", 0, pmap::tiled));
      const F2 square = ctx.all_gather(x.slice(std::array<Index, 1>{0}, std::array<Index, 1>{devices}), "i");
      bad += !same(ctx.psum_scatter_start(square, "i").wait(), ctx.psum_scatter(square, "i"));
      bad += !same(ctx.all_to_all_start(square, "i", 0, 0).wait(), ctx.all_to_all(square, "i", 0, 0));
      bad += !same(ctx.all_to_all_start(x, "i", 0, 0, pmap::tiled).wait(),
                   ctx.all_to_all(x, "i", 0, 0, pmap::tiled));
      const Perm right = ring(devices, 1);
      bad += !same(ctx.ppermute_start(x, "i", right).wait(), ctx.ppermute(x, "i", right));
      F1 donated = x;
      bad += !same(ctx.ppermute_start(std::move(donated), "i", right).wait(), ctx.ppermute(x, "i", right));
      // Trees: posted when their leaves pack into one staged copy, in place above.
      const F1 y = pmap::eval(x * 2.f);
      auto pair = [&bad](const auto& r, const auto& e) {
        bad += !same(std::get<0>(r), std::get<0>(e)) + !same(std::get<1>(r), std::get<1>(e));
      };
      pair(ctx.ppermute_start(std::tie(x, y), "i", right).wait(),
           ctx.ppermute(std::tie(x, y), "i", right));
      pair(ctx.ppermute_start(std::make_tuple(F1(x), F1(y)), "i", right).wait(),  // donated
           ctx.ppermute(std::tie(x, y), "i", right));
      pair(ctx.all_gather_start(std::tie(x, y), "i").wait(), ctx.all_gather(std::tie(x, y), "i"));
      pair(ctx.psum_scatter_start(std::tie(x, y), "i", 0, pmap::tiled).wait(),
           ctx.psum_scatter(std::tie(x, y), "i", 0, pmap::tiled));
      pair(ctx.all_to_all_start(std::make_tuple(F1(x), F1(y)), "i", 0, 0, pmap::tiled).wait(),
           ctx.all_to_all(std::tie(x, y), "i", 0, 0, pmap::tiled));
      // Eigen Core operands: posted as a tensor is (their storage seen as one), in place above.
      // A Matrix read where it is, a donated one, a Map and an expression evaluated now.
      const Eigen::RowVectorXf m = Eigen::Map<const Eigen::RowVectorXf>(x.data(), x.size());
      const Eigen::Map<const Eigen::RowVectorXf> map(y.data(), y.size());
      const Eigen::RowVectorXf want_m = ctx.ppermute(m, "i", right);
      const Eigen::RowVectorXf want_map = ctx.ppermute(map, "i", right);
      const Eigen::RowVectorXf want_expr = ctx.ppermute(m * 3.f, "i", right);
      auto core = [&bad](const Eigen::RowVectorXf& r, const Eigen::RowVectorXf& e) {
        bad += r.size() != e.size() || !(r.array() == e.array()).all();
      };
      core(ctx.ppermute_start(m, "i", right).wait(), want_m);
      core(ctx.ppermute_start(Eigen::RowVectorXf(m), "i", right).wait(), want_m);  // donated
      core(ctx.ppermute_start(map, "i", right).wait(), want_map);
      core(ctx.ppermute_start(m * 3.f, "i", right).wait(), want_expr);
      {  // two in flight, waited in the other order
        auto a = ctx.ppermute_start(m, "i", right);
        auto b = ctx.ppermute_start(map, "i", ring(devices, -1));
        core(b.wait(), ctx.ppermute(map, "i", ring(devices, -1)));
        core(a.wait(), want_m);
      }
      return bad;
    });
  }
}

TEST_P(Pending, WaitsInAnyOrderWithBlockingCollectivesAndStartsBetween) {
  const int devices = n();
  for (Index len : {kSmall, kLarge}) {
    expect_no_mismatch(rt(), devices, len, [devices](pmap::Context& ctx, auto v) {
      const F1 x = pmap::eval(v);
      const F1 y = pmap::eval(x * 3.f + 1.f);
      const Perm left = ring(devices, -1);
      const Perm right = ring(devices, 1);
      auto a = ctx.psum_start(x, "i");
      auto b = ctx.ppermute_start(x, "i", left);
      auto gathered = ctx.all_gather(y, "i");  // blocking, between
      auto c = ctx.ppermute_start(y, "i", right);
      auto rc = c.wait();
      auto rb = b.wait();
      auto d = ctx.pmax_start(y, "i");
      auto ra = a.wait();
      auto rd = d.wait();
      int bad = 0;
      bad += !same(ra, ctx.psum(x, "i"));
      bad += !same(rb, ctx.ppermute(x, "i", left));
      bad += !same(gathered, ctx.all_gather(y, "i"));
      bad += !same(rc, ctx.ppermute(y, "i", right));
      bad += !same(rd, ctx.pmax(y, "i"));
      return bad;
    });
  }
}

TEST_P(Pending, GroupsApplyToStartedCollectives) {
  if (n() % 2 != 0) GTEST_SKIP() << "pairs of devices";
  pmap::Groups pairs;
  for (int d = 0; d < n(); d += 2) pairs.push_back({d, d + 1});
  expect_no_mismatch(rt(), n(), kSmall, [pairs](pmap::Context& ctx, auto v) {
    const F1 x = pmap::eval(v);
    int bad = !same(ctx.psum_start(x, "i", pairs).wait(), ctx.psum(x, "i", pairs));
    bad += !same(ctx.all_gather_start(x, "i", 0, pairs).wait(), ctx.all_gather(x, "i", 0, pairs));
    return bad;
  });
}

TEST_P(Pending, ReadyMakesProgressAndWaitReturnsTheResult) {
  const int devices = n();
  expect_no_mismatch(rt(), devices, kSmall, [devices](pmap::Context& ctx, auto v) {
    const F1 x = pmap::eval(v);
    auto h = ctx.ppermute_start(x, "i", ring(devices, 1));
    int polls = 0;
    while (!h.ready()) ++polls;  // ends: ready() runs the collective
    const bool again = h.ready();
    return static_cast<int>(!again) + !same(h.wait(), ctx.ppermute(x, "i", ring(devices, 1)));
  });
}

TEST_P(Pending, APendingDestroyedUnwaitedCompletesItsCollective) {
  // Even devices drop their Pending, odd ones wait: the odd ones still receive the even
  // ones' values, and the blocking psum that follows meets everyone.
  const int devices = n();
  F2 x = make<F2>(4, devices, kSmall);
  auto f = pmap::pmap(
      [devices](pmap::Context& ctx, auto v) {
        const F1 mine = pmap::eval(v);
        F1 got(mine.size());
        got.setZero();
        {
          auto h = ctx.ppermute_start(mine, "i", ring(devices, 1));
          if (ctx.axis_index() % 2 == 1) got = h.wait();
        }
        return std::make_tuple(got, ctx.psum(mine, "i"));
      },
      on_axis(rt()));
  auto [got, sum] = f(x);
  const F2 shifted = [&] {
    F2 s(devices, kSmall);
    for (int p = 0; p < devices; ++p)
      for (Index k = 0; k < kSmall; ++k) s(p, k) = x((p - 1 + devices) % devices, k);
    return s;
  }();
  for (int p = 1; p < devices; p += 2)
    for (Index k = 0; k < kSmall; ++k) EXPECT_EQ(got(p, k), shifted(p, k)) << p << "," << k;
  for (int p = 0; p < devices; ++p)
    for (Index k = 0; k < kSmall; ++k) {
      float e = 0.f;
      for (int q = 0; q < devices; ++q) e += x(q, k);
      EXPECT_EQ(sum(p, k), e);
    }
}

TEST_P(Pending, DevicesThatStartDifferentCollectivesGetE14NamingBoth) {
  if (n() < 2) GTEST_SKIP() << "needs two devices";
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        const F1 x = pmap::eval(v);
        if (ctx.axis_index() == 0) return ctx.psum_start(x, "i").wait();
        return ctx.pmax_start(x, "i").wait();
      },
      on_axis(rt()));
  F2 x = make<F2>(5, n(), kSmall);
  const std::string message = catch_message<pmap::DeviceError>([&] { (void)f(x); });
  EXPECT_NE(message.find("psum"), std::string::npos) << message;
  EXPECT_NE(message.find("pmax"), std::string::npos) << message;
}

TEST_P(Pending, PpermutesInFlightThatDifferGetE14NamingBoth) {
  // Posted ppermutes (staged: they travel while the device computes) are compared when they
  // complete; the second of two in flight names its own shape, not the later one's.
  if (n() < 2) GTEST_SKIP() << "needs two devices";
  const int devices = n();
  auto f = pmap::pmap(
      [devices](pmap::Context& ctx, auto v) {
        const F1 x = pmap::eval(v);
        auto a = ctx.ppermute_start(x, "i", ring(devices, 1));
        const Index len = ctx.axis_index() == 0 ? 2 : 3;
        auto b = ctx.ppermute_start(F1(x.slice(std::array<Index, 1>{0}, std::array<Index, 1>{len})), "i",
                                    ring(devices, -1));
        auto c = ctx.ppermute_start(x, "i", ring(devices, 1));
        F1 out = a.wait();
        (void)b.wait();
        (void)c.wait();
        return out;
      },
      on_axis(rt()));
  F2 x = make<F2>(8, n(), kSmall);
  const std::string message = catch_message<pmap::DeviceError>([&] { (void)f(x); });
  EXPECT_NE(message.find("ppermute over axis i on float32[2]"), std::string::npos) << message;
  EXPECT_NE(message.find("ppermute over axis i on float32[3]"), std::string::npos) << message;
}

TEST_P(Pending, GroupCollectivesInFlightThatDifferGetE14NamingBoth) {
  // Posted psums and gathers over the whole axis (staged) are compared when they complete;
  // the second of three in flight names its own shape, not the later ones'.
  if (n() < 2) GTEST_SKIP() << "needs two devices";
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        const F1 x = pmap::eval(v);
        auto a = ctx.psum_start(x, "i");
        const Index len = ctx.axis_index() == 0 ? 2 : 3;
        auto b = ctx.pmax_start(F1(x.slice(std::array<Index, 1>{0}, std::array<Index, 1>{len})),
                                "i");
        auto c = ctx.all_gather_start(x, "i");
        F1 out = a.wait();
        (void)b.wait();
        (void)c.wait();
        return out;
      },
      on_axis(rt()));
  F2 x = make<F2>(10, n(), kSmall);
  const std::string message = catch_message<pmap::DeviceError>([&] { (void)f(x); });
  EXPECT_NE(message.find("pmax over axis i on float32[2]"), std::string::npos) << message;
  EXPECT_NE(message.find("pmax over axis i on float32[3]"), std::string::npos) << message;
}

TEST_P(Pending, TreesInFlightThatDifferGetE14NamingTheLeaf) {
  // Posted trees are compared when they complete: the first of two in flight names the leaf
  // at which it differs, not the leaves of the tree started after it.
  if (n() < 2) GTEST_SKIP() << "needs two devices";
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        const F1 x = pmap::eval(v);
        const Index len = ctx.axis_index() == 0 ? 2 : 3;
        auto a = ctx.psum_start(
            std::make_tuple(x, F1(x.slice(std::array<Index, 1>{0}, std::array<Index, 1>{len}))),
            "i");
        auto b = ctx.pmax_start(std::array<F1, 4>{x, x, x, x}, "i");
        F1 out = std::get<0>(a.wait());
        (void)b.wait();
        return out;
      },
      on_axis(rt()));
  F2 x = make<F2>(11, n(), kSmall);
  const std::string message = catch_message<pmap::DeviceError>([&] { (void)f(x); });
  EXPECT_NE(message.find("psum over axis i on tree[2]"), std::string::npos) << message;
  EXPECT_NE(message.find("the trees first differ at leaf 1 (depth first)"), std::string::npos)
      << message;
}

TEST_P(Pending, APostedPsumMetByABlockingOneAndAGatherIsTheBlockingResult) {
  // A started psum and all_gather (posted) on some devices meet the blocking ones on the
  // others: one barrier, one copy, the same bits.
  const int devices = n();
  expect_no_mismatch(rt(), devices, kSmall, [](pmap::Context& ctx, auto v) {
    const F1 x = pmap::eval(v);
    int bad = 0;
    for (int step = 0; step < 6; ++step) {
      const bool start = (ctx.axis_index() + step) % 2 == 0;
      F1 sum;
      F2 gathered;
      if (start) {
        auto s = ctx.psum_start(x, "i");
        auto g = ctx.all_gather_start(pmap::eval(x + 1.f), "i");
        gathered = g.wait();
        sum = s.wait();
      } else {
        sum = ctx.psum(x, "i");
        gathered = ctx.all_gather(pmap::eval(x + 1.f), "i");
      }
      const F2 all = ctx.all_gather(x, "i");
      bad += !same(sum, ctx.psum(x, "i"));
      for (Index d = 0; d < all.dimension(0); ++d)
        for (Index k = 0; k < x.size(); ++k) bad += gathered(d, k) != all(d, k) + 1.f;
    }
    return bad;
  });
}

TEST_P(Pending, APostedPpermuteMetByAnotherCollectiveIsE14) {
  if (n() < 2) GTEST_SKIP() << "needs two devices";
  const int devices = n();
  auto f = pmap::pmap(
      [devices](pmap::Context& ctx, auto v) {
        const F1 x = pmap::eval(v);
        if (ctx.axis_index() == 0) return ctx.psum_start(x, "i").wait();
        return ctx.ppermute_start(x, "i", ring(devices, 1)).wait();
      },
      on_axis(rt()));
  F2 x = make<F2>(9, n(), kSmall);
  const std::string message = catch_message<pmap::DeviceError>([&] { (void)f(x); });
  EXPECT_NE(message.find("psum"), std::string::npos) << message;
  EXPECT_NE(message.find("ppermute"), std::string::npos) << message;
}

TEST_P(Pending, ManyPpermutesInFlightWaitedInReverseAreTheBlockingOnes) {
  // More started than a device keeps in flight (the older complete first), waited newest
  // first, with a blocking collective among them and the devices skewed.
  const int devices = n();
  expect_no_mismatch(rt(), devices, kSmall, [devices](pmap::Context& ctx, auto v) {
    const F1 x = pmap::eval(v);
    volatile int skew = 0;
    while (skew < 20000 * ctx.axis_index()) skew = skew + 1;
    std::vector<pmap::Pending<F1>> started;
    for (int k = 0; k < 5; ++k) {
      started.push_back(ctx.ppermute_start(pmap::eval(x + static_cast<float>(k)), "i", ring(devices, k + 1)));
      if (k == 2) started.push_back(ctx.ppermute_start(ctx.psum(x, "i"), "i", ring(devices, 1)));
    }
    int wrong = 0;
    for (int k = 5; k >= 0; --k) {
      const F1 got = started[static_cast<std::size_t>(k)].wait();
      const F1 want = k == 3 ? ctx.ppermute(ctx.psum(x, "i"), "i", ring(devices, 1))
                             : ctx.ppermute(pmap::eval(x + static_cast<float>(k > 3 ? k - 1 : k)), "i",
                                            ring(devices, (k > 3 ? k - 1 : k) + 1));
      wrong += !same(got, want);
    }
    return wrong;
  });
}

TEST_P(Pending, PairsRewrittenInPlaceBetweenStepsAreReadAfresh) {
  // A device remembers the pairs of its last few ppermutes (a loop passes the same ones):
  // one vector rewritten in place at every step, through more sets than it remembers,
  // started and blocking, against all_gather's row of the source.
  const int devices = n();
  expect_no_mismatch(rt(), devices, kSmall, [devices](pmap::Context& ctx, auto v) {
    const F1 x = pmap::eval(v);
    const auto all = ctx.all_gather(x, "i");
    const int me = ctx.axis_index("i");
    std::vector<std::pair<int, int>> perm;
    int wrong = 0;
    for (int step = 0; step < 24; ++step) {
      const int shift = (step * 7) % 6;  // 0, 1, ..., 5 in another order: six sets of pairs
      perm = ring(devices, shift);
      const int source = ((me - shift) % devices + devices) % devices;
      const F1 want = all.chip(source, 0);
      auto started = ctx.ppermute_start(x, "i", perm);
      wrong += !same(ctx.ppermute(x, "i", perm), want);
      wrong += !same(started.wait(), want);
    }
    return wrong;
  });
}

TEST_P(Pending, ADeviceThatChangesItsPairsMidLoopGetsE14) {
  // The same ppermute at every step, until device 1 passes other pairs: remembered pairs must
  // not hide that from the devices' comparison.
  if (n() < 3) GTEST_SKIP() << "needs three devices (two devices have one ring)";
  const int devices = n();
  auto f = pmap::pmap(
      [devices](pmap::Context& ctx, auto v) {
        const F1 x = pmap::eval(v);
        F1 sum = x;
        for (int step = 0; step < 6; ++step) {
          const int shift = ctx.axis_index() == 1 && step >= 3 ? -1 : 1;
          sum = pmap::eval(sum + ctx.ppermute_start(x, "i", ring(devices, shift)).wait());
        }
        return sum;
      },
      on_axis(rt()));
  F2 x = make<F2>(10, n(), kSmall);
  const std::string message = catch_message<pmap::DeviceError>([&] { (void)f(x); });
  EXPECT_NE(message.find("ppermute"), std::string::npos) << message;
}

TEST_P(Pending, E14AfterRepeatedCollectivesNamesTheShapesThatDiffer) {
  // A device describes a collective for error messages only when it differs from the one it
  // described last: after the same psum (started and blocking) three times, the fourth
  // differs in shape on device 0, and E14 names both shapes.
  if (n() < 2) GTEST_SKIP() << "needs two devices";
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        const F1 x = pmap::eval(v);
        F1 sum = ctx.psum_start(x, "i").wait();
        sum = pmap::eval(sum + ctx.psum(x, "i"));
        sum = pmap::eval(sum + ctx.psum_start(x, "i").wait());
        const Index len = ctx.axis_index() == 0 ? 2 : kSmall;
        (void)ctx.psum(F1(x.slice(std::array<Index, 1>{0}, std::array<Index, 1>{len})), "i");
        return sum;
      },
      on_axis(rt()));
  F2 x = make<F2>(11, n(), kSmall);
  const std::string message = catch_message<pmap::DeviceError>([&] { (void)f(x); });
  EXPECT_NE(message.find("float32[2]"), std::string::npos) << message;
  EXPECT_NE(message.find("float32[5]"), std::string::npos) << message;
}

TEST_P(Pending, AnErrorMetByAnUnwaitedCollectiveReachesTheCaller) {
  if (n() < 2) GTEST_SKIP() << "needs two devices";
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        const F1 x = pmap::eval(v);
        if (ctx.axis_index() == 0) {
          auto dropped = ctx.psum_start(x, "i");
        } else {
          auto dropped = ctx.pmin_start(x, "i");
        }
        return x;
      },
      on_axis(rt()));
  F2 x = make<F2>(6, n(), kSmall);
  const std::string message = catch_message<pmap::DeviceError>([&] { (void)f(x); });
  EXPECT_NE(message.find("pmin"), std::string::npos) << message;
}

TEST_P(Pending, AKernelThatThrowsWithCollectivesInFlightCancelsTheCall) {
  const int devices = n();
  for (Index len : {kSmall, kLarge}) {
    auto f = pmap::pmap(
        [devices](pmap::Context& ctx, auto v) {
          const F1 x = pmap::eval(v);
          auto a = ctx.psum_start(x, "i");
          auto b = ctx.ppermute_start(F1(x), "i", ring(devices, 1));
          if (ctx.axis_index() == devices - 1) throw std::runtime_error("device failed");
          auto rb = b.wait();
          return pmap::eval(a.wait() + rb);
        },
        on_axis(rt()));
    F2 x = make<F2>(7, devices, len);
    expect_throw_msg<std::runtime_error>([&] { (void)f(x); }, "device failed");
    // The runtime is unaffected.
    auto g = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum_start(pmap::eval(v), "i").wait(); },
                        on_axis(rt()));
    F2 expected(devices, len);
    for (Index k = 0; k < len; ++k) {
      float e = 0.f;
      for (int q = 0; q < devices; ++q) e += x(q, k);
      for (int p = 0; p < devices; ++p) expected(p, k) = e;
    }
    EXPECT_TRUE(tensors_equal(g(x), expected));
  }
}

TEST_P(Pending, WaitingTwiceIsAValueError) {
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        auto h = ctx.psum_start(pmap::eval(v), "i");
        auto r = h.wait();
        (void)h.wait();
        return r;
      },
      on_axis(rt()));
  F2 x = make<F2>(8, n(), kSmall);
  const std::string message = catch_message<pmap::ValueError>([&] { (void)f(x); });
  EXPECT_NE(message.find("already waited"), std::string::npos) << message;
}

TEST_P(Pending, StartedInsideANestedPmapOverInnerAndOuterAxes) {
  if (n() % 2 != 0) GTEST_SKIP() << "an inner axis of 2";
  const int outer_size = n() / 2;
  F3 x = make<F3>(9, outer_size, 2, kSmall);
  pmap::Runtime& runtime = rt();
  auto f = pmap::pmap(
      [&runtime](pmap::Context& outer_ctx, auto xi) {
        auto early = outer_ctx.psum_start(pmap::eval(xi), "i");  // completes before the nested call
        auto inner = pmap::pmap(
            [](pmap::Context& ctx, auto v) {
              const F1 y = pmap::eval(v);
              auto a = ctx.psum_start(y, {"i", "j"});
              auto b = ctx.ppermute_start(y, "j", {{0, 1}, {1, 0}});
              auto c = ctx.pmax_start(y, "i");
              int bad = !same(b.wait(), ctx.ppermute(y, "j", {{0, 1}, {1, 0}}));
              bad += !same(a.wait(), ctx.psum(y, {"i", "j"}));
              bad += !same(c.wait(), ctx.pmax(y, "i"));
              return bad;
            },
            on_axis(runtime, "j"));
        auto bad = inner(xi);
        auto sum = early.wait();
        return std::make_tuple(bad, sum);
      },
      on_axis(rt(), "i"));
  auto [bad, sum] = f(x);
  for (int i = 0; i < outer_size; ++i)
    for (int j = 0; j < 2; ++j) EXPECT_EQ(bad(i, j), 0) << i << "," << j;
  for (int i = 0; i < outer_size; ++i)
    for (int j = 0; j < 2; ++j)
      for (Index k = 0; k < kSmall; ++k) {
        float e = 0.f;
        for (int q = 0; q < outer_size; ++q) e += x(q, j, k);
        EXPECT_EQ(sum(i, j, k), e);
      }
}

TEST_P(Pending, StartedInsideShardMapOverTwoAxes) {
  if (n() % 2 != 0) GTEST_SKIP() << "a 2-axis mesh";
  const pmap::Mesh mesh({{"a", n() / 2}, {"b", 2}}, &rt());
  F2 x = make<F2>(10, n() / 2 * 3, 4);
  auto f = pmap::shard_map(
      [](pmap::Context& ctx, auto block) {
        const F2 y = pmap::eval(block);
        auto s = ctx.psum_start(y, {"a", "b"});
        auto g = ctx.all_gather_start(y, "b", 0, pmap::tiled);
        auto p = ctx.ppermute_start(y, "b", {{0, 1}, {1, 0}});
        int bad = !same(g.wait(), ctx.all_gather(y, "b", 0, pmap::tiled));
        bad += !same(p.wait(), ctx.ppermute(y, "b", {{0, 1}, {1, 0}}));
        bad += !same(s.wait(), ctx.psum(y, {"a", "b"}));
        return I1(I1(1).setConstant(bad));
      },
      mesh, {P("a", "b")}, {P(std::vector<std::string>{"a", "b"})});
  I1 bad = f(x);
  for (Index k = 0; k < bad.size(); ++k) EXPECT_EQ(bad(k), 0) << k;
}

}  // namespace

namespace {

TEST(PendingAcrossCalls, E14InALaterCallNamesWhatThePeerCallsNotAnOlderStartedOne) {
  // A staged copy that described a started collective of an earlier call of the same team
  // does not describe the peer's collective of this call (Team::reset).
  pmap::Runtime rt({.num_devices = 2, .num_threads = 1});
  int call = 0;
  auto f = pmap::pmap(
      [&call](pmap::Context& ctx, auto v) {
        const F1 x = pmap::eval(v);
        if (call == 0) return ctx.psum_start(x, "i").wait();
        if (ctx.axis_index() == 1) return ctx.pmax(x, "i");  // staged
        F1 large(kLarge);
        large.setConstant(1.f);
        const F1 r = ctx.pmin(large, "i");  // in place
        return F1(r.slice(std::array<Index, 1>{0}, std::array<Index, 1>{x.size()}));
      },
      on_axis(rt));
  F2 x = make<F2>(11, 2, kSmall);
  (void)f(x);
  call = 1;
  const std::string message = catch_message<pmap::DeviceError>([&] { (void)f(x); });
  EXPECT_NE(message.find("pmin over axis i on float32[65536]"), std::string::npos) << message;
  EXPECT_NE(message.find("pmax over axis i on float32[5]"), std::string::npos) << message;
}

}  // namespace
