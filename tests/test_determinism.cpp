/// @file test_determinism.cpp
/// @brief Reproducible reductions (README "Guarantees"): psum and pmean of the same inputs on
/// the same number of devices are bitwise identical whatever the thread count, the
/// scheduling and the timing, on every protocol path (staged, in place, split), and equal a
/// serial sum in the order of the devices along the axis (or the group).

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collective_util.hpp"

namespace {

using namespace coll_test;
using F1 = Tensor<float, 1>;
using F2 = Tensor<float, 2>;

/// Values whose sums round differently in different orders.
F2 inputs(Index n, Index len) {
  F2 x(n, len);
  std::mt19937 rng(static_cast<unsigned>(n * 7919 + len));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (Index k = 0; k < x.size(); ++k) x.data()[k] = u(rng) * (k % 3 == 0 ? 1e4f : 1e-3f);
  return x;
}

/// ((x[m0] + x[m1]) + x[m2]) + ... over the members, in their order.
F1 serial_sum(const F2& x, const std::vector<int>& members) {
  F1 s = x.chip(members[0], 0);
  for (std::size_t m = 1; m < members.size(); ++m) s = (s + x.chip(members[m], 0)).eval();
  return s;
}

bool bitwise_equal(const F1& a, const F1& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<std::size_t>(a.size())) == 0;
}

class Determinism : public testing::TestWithParam<int> {};

TEST_P(Determinism, PsumAndPmeanAreTheSerialSumInDeviceOrderAtAnyThreadCount) {
  const int n = GetParam();
  for (Index len : {Index{37}, Index{4000}, Index{70000}}) {  // staged, in place, split
    const F2 x = inputs(n, len);
    const std::vector<int> all = iota(n);
    const F1 sum = serial_sum(x, all);
    const F1 mean = sum / static_cast<float>(n);
    if (n >= 3) {  // the inputs tell summation orders apart (two terms commute exactly)
      const std::vector<int> reversed(all.rbegin(), all.rend());
      ASSERT_FALSE(bitwise_equal(sum, serial_sum(x, reversed))) << "len=" << len;
    }
    pmap::Groups pairs;
    for (int d = 0; d + 1 < n; d += 2) pairs.push_back({d, d + 1});
    if (n % 2 == 1) pairs.push_back({n - 1});
    for (int threads = 1; threads <= 4; ++threads) {
      pmap::Runtime rt(pmap::RuntimeConfig{.num_devices = n, .num_threads = threads});
      for (int rep = 0; rep < 3; ++rep) {
        // Random delays on random devices: arrival order changes from call to call.
        std::vector<int> delay_us(static_cast<std::size_t>(n));
        std::mt19937 rng(static_cast<unsigned>(threads * 100 + rep));
        for (int& d : delay_us) d = static_cast<int>(rng() % 4) * 40;
        auto f = pmap::pmap(
            [&delay_us, &pairs](pmap::Context& ctx, View<float, 1, RowMajor> v) {
              std::this_thread::sleep_for(std::chrono::microseconds(delay_us[static_cast<std::size_t>(ctx.axis_index())]));
              return std::make_tuple(ctx.psum(v, "i"), ctx.pmean(v, "i"), ctx.psum(v, "i", pairs));
            },
            on_axis(rt));
        const auto [s, m, g] = f(x);
        for (int d = 0; d < n; ++d) {
          const std::string where = "n=" + std::to_string(n) + " len=" + std::to_string(len) +
                                    " threads=" + std::to_string(threads) + " device " + std::to_string(d);
          EXPECT_TRUE(bitwise_equal(F1(s.chip(d, 0)), sum)) << "psum, " << where;
          EXPECT_TRUE(bitwise_equal(F1(m.chip(d, 0)), mean)) << "pmean, " << where;
          const auto group = group_of(pairs, n, d).first;
          EXPECT_TRUE(bitwise_equal(F1(g.chip(d, 0)), serial_sum(x, group))) << "grouped psum, " << where;
        }
        if (testing::Test::HasFailure()) return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, Determinism, testing::Values(2, 3, 8),
                         [](const testing::TestParamInfo<int>& p) { return "n" + std::to_string(p.param); });

}  // namespace
