/// @file test_ragged.cpp
/// @brief ragged_all_to_all (SPEC 12) against a serial model: both layouts, ranks 1 to 3,
/// empty chunks and empty results, groups, maps and expressions, the started form, the three
/// ValueErrors, E14 and a device that throws, on 1 to 8 devices and more devices than threads.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "collective_util.hpp"

namespace {

using namespace coll_test;

class Ragged : public RuntimeTest {};
INSTANTIATE_TEST_SUITE_P(Runtimes, Ragged, testing::ValuesIn(collective_configs()), config_name);

/// Rows device i sends to member j of its group: between 0 and 3, some zero.
Index sends(int i, int j, int seed) { return (i * 3 + j * 5 + seed) % 4; }

/// Device i's operand: rows of `cols` values, each naming its device, row and column.
template <int L>
Tensor<float, 2, L> rows_of(int i, Index rows, Index cols) {
  Tensor<float, 2, L> x(rows, cols);
  for (Index r = 0; r < rows; ++r)
    for (Index c = 0; c < cols; ++c) x(r, c) = static_cast<float>(1000 * i + 10 * r + c);
  return x;
}

/// What one device received, copied out of its kernel.
template <int L>
struct Received {
  Tensor<float, 2, L> data;
  std::vector<Index> sizes, offsets;
};

/// The serial model: what member `me` of `members` (device ids) receives.
template <int L>
Received<L> model(const std::vector<int>& members, int me, Index cols, int seed) {
  const int n = static_cast<int>(members.size());
  Received<L> out;
  Index total = 0;
  for (int k = 0; k < n; ++k) {
    out.offsets.push_back(total);
    out.sizes.push_back(sends(members[static_cast<std::size_t>(k)], me, seed));
    total += out.sizes.back();
  }
  out.data.resize(total, cols);
  for (int k = 0; k < n; ++k) {
    const int i = members[static_cast<std::size_t>(k)];
    Index first = 0;
    for (int j = 0; j < me; ++j) first += sends(i, j, seed);
    for (Index r = 0; r < out.sizes[static_cast<std::size_t>(k)]; ++r)
      for (Index c = 0; c < cols; ++c)
        out.data(out.offsets[static_cast<std::size_t>(k)] + r, c) =
            static_cast<float>(1000 * i + 10 * (first + r) + c);
  }
  return out;
}

template <int L>
void expect_same(const Received<L>& got, const Received<L>& want, int device) {
  EXPECT_EQ(got.sizes, want.sizes) << "device " << device;
  EXPECT_EQ(got.offsets, want.offsets) << "device " << device;
  ASSERT_EQ(got.data.dimension(0), want.data.dimension(0)) << "device " << device;
  ASSERT_EQ(got.data.dimension(1), want.data.dimension(1)) << "device " << device;
  for (Index k = 0; k < got.data.size(); ++k)
    ASSERT_EQ(got.data.data()[k], want.data.data()[k]) << "device " << device << " element " << k;
}

/// Every device sends sends(i, j) rows to member j of its group (all devices, or `groups`),
/// and the test compares what each received with the model.
template <int L>
void check_exchange(pmap::Runtime& rt, int n, Index cols, int seed, const pmap::Groups& groups,
                    bool started) {
  std::vector<Received<L>> got(static_cast<std::size_t>(n));
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, auto) {
        const int i = ctx.axis_index("i");
        std::vector<int> members = iota(n);
        for (const auto& grp : groups)
          if (std::find(grp.begin(), grp.end(), i) != grp.end()) members = grp;
        std::vector<Index> s;
        for (int j = 0; j < static_cast<int>(members.size()); ++j) s.push_back(sends(i, j, seed));
        const Tensor<float, 2, L> x = rows_of<L>(i, std::accumulate(s.begin(), s.end(), Index{0}), cols);
        auto r = started ? ctx.ragged_all_to_all_start(x, "i", s, groups).wait()
                         : ctx.ragged_all_to_all(x, "i", s, groups);
        static_assert(std::is_same_v<decltype(r), pmap::Ragged<float, 2, L>>);
        got[static_cast<std::size_t>(i)] = {r.data, r.sizes, r.offsets};
        return 0;
      },
      on_axis(rt));
  f(Tensor<float, 1>(n));
  for (int i = 0; i < n; ++i) {
    std::vector<int> members = iota(n);
    for (const auto& grp : groups)
      if (std::find(grp.begin(), grp.end(), i) != grp.end()) members = grp;
    const int me = static_cast<int>(std::find(members.begin(), members.end(), i) - members.begin());
    expect_same(got[static_cast<std::size_t>(i)], model<L>(members, me, cols, seed), i);
  }
}

TEST_P(Ragged, RowMajorRowsInMemberOrder) {
  for (int seed = 0; seed < 4; ++seed) check_exchange<RowMajor>(rt(), n(), 3, seed, {}, false);
}

TEST_P(Ragged, ColMajorRowsInMemberOrder) {
  for (int seed = 0; seed < 4; ++seed) check_exchange<ColMajor>(rt(), n(), 3, seed, {}, false);
}

TEST_P(Ragged, RowsOfNoColumns) { check_exchange<RowMajor>(rt(), n(), 0, 1, {}, false); }

TEST_P(Ragged, Groups) {
  if (n() % 2 != 0) GTEST_SKIP() << "pairs of devices";
  pmap::Groups pairs;
  for (int d = 0; d < n(); d += 2) pairs.push_back({d + 1, d});  // member order differs from ids
  check_exchange<RowMajor>(rt(), n(), 2, 2, pairs, false);
  check_exchange<ColMajor>(rt(), n(), 2, 3, pairs, false);
}

TEST_P(Ragged, StartedGivesTheBlockingResult) {
  check_exchange<RowMajor>(rt(), n(), 3, 1, {}, true);
  check_exchange<ColMajor>(rt(), n(), 3, 2, {}, true);
}

TEST_P(Ragged, EverythingToOneDeviceAndEmptyResults) {
  const int N = n();
  std::vector<Index> rows(static_cast<std::size_t>(N));
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, auto) {
        // Device i sends its i + 1 rows to member N - 1; everybody else receives nothing.
        const int i = ctx.axis_index("i");
        std::vector<Index> s(static_cast<std::size_t>(N), 0);
        s.back() = i + 1;
        Tensor<int, 1> v(i + 1);
        v.setConstant(i);
        auto r = ctx.ragged_all_to_all(v, "i", s);
        rows[static_cast<std::size_t>(i)] = r.data.dimension(0);
        Tensor<int, 1> want(i == N - 1 ? N * (N + 1) / 2 : 0);
        Index at = 0;
        for (int k = 0; k < N && i == N - 1; ++k)
          for (int c = 0; c <= k; ++c) want(at++) = k;
        bool same = r.data.dimension(0) == want.dimension(0);
        for (Index k = 0; same && k < want.size(); ++k) same = r.data(k) == want(k);
        return static_cast<int>(same);
      },
      on_axis(rt()));
  auto ok = f(Tensor<int, 1>(N).setZero());
  for (int i = 0; i < N; ++i) EXPECT_EQ(ok(i), 1) << "device " << i;
  EXPECT_EQ(rows.back(), N * (N + 1) / 2);
}

TEST_P(Ragged, MapsExpressionsAndRankThree) {
  const int N = n();
  auto f = pmap::pmap(
      [N](pmap::Context& ctx, auto) {
        const int i = ctx.axis_index("i");
        // One row of shape (2, 2) to every member, from a map and from an expression.
        Tensor<double, 3> x(N, 2, 2);
        for (Index k = 0; k < x.size(); ++k) x.data()[k] = static_cast<double>(100 * i + k);
        const std::vector<Index> s(static_cast<std::size_t>(N), 1);
        Eigen::TensorMap<const Tensor<double, 3>> m(x.data(), N, 2, 2);
        auto a = ctx.ragged_all_to_all(m, "i", s);
        auto b = ctx.ragged_all_to_all(x * 2.0, "i", s);
        double err = 0;
        for (int k = 0; k < N; ++k)
          for (Index c = 0; c < 4; ++c) {
            const double want = static_cast<double>(100 * k + i * 4 + c);
            err += std::abs(a.data.data()[k * 4 + c] - want) + std::abs(b.data.data()[k * 4 + c] - 2 * want);
          }
        return err + (a.data.dimension(0) == N && b.data.dimension(1) == 2 ? 0.0 : 1.0);
      },
      on_axis(rt()));
  auto err = f(Tensor<float, 1>(N));
  for (int i = 0; i < N; ++i) EXPECT_EQ(err(i), 0.0) << "device " << i;
}

TEST_P(Ragged, SendSizeErrors) {
  const int N = n();
  auto call = [&](std::vector<Index> s, Index rows) {
    auto f = pmap::pmap(
        [s, rows](pmap::Context& ctx, auto) {
          Tensor<float, 2> x(rows, 2);
          x.setZero();
          auto r = ctx.ragged_all_to_all(x, "i", s);
          return static_cast<int>(r.data.dimension(0));
        },
        on_axis(rt()));
    f(Tensor<float, 1>(N));
  };
  std::vector<Index> one_more(static_cast<std::size_t>(N + 1), 0);
  expect_validation_error<pmap::ValueError>(
      [&] { call(one_more, 0); },
      "ragged_all_to_all needs one send size per member of axis i (" + std::to_string(N) + "), got " +
          std::to_string(N + 1));
  std::vector<Index> negative(static_cast<std::size_t>(N), 1);
  negative.back() = -1;
  std::string listed;
  for (int k = 0; k < N; ++k) listed += (k ? ", " : "") + std::to_string(negative[static_cast<std::size_t>(k)]);
  expect_validation_error<pmap::ValueError>(
      [&] { call(negative, 0); },  // checked before the sum
      "ragged_all_to_all send sizes must be non-negative, got [" + listed + "]");
  std::vector<Index> ones(static_cast<std::size_t>(N), 1);
  expect_validation_error<pmap::ValueError>(
      [&] { call(ones, N + 1); },
      "ragged_all_to_all send sizes sum to " + std::to_string(N) + ", but x has " + std::to_string(N + 1) +
          " rows");
  // The runtime is fine afterwards.
  call(ones, N);
}

TEST_P(Ragged, OneDeviceWithABadCountFailsTheCallWithoutAHang) {
  const int N = n();
  if (N == 1) GTEST_SKIP() << "needs a peer";
  auto f = pmap::pmap(
      [N](pmap::Context& ctx, auto) {
        const int i = ctx.axis_index("i");
        std::vector<Index> s(static_cast<std::size_t>(i == 1 ? N - 1 : N), 0);
        auto r = ctx.ragged_all_to_all(Tensor<float, 1>(0), "i", s);
        return static_cast<int>(r.data.size());
      },
      on_axis(rt()));
  const std::string message = catch_message<pmap::ValueError>([&] { f(Tensor<float, 1>(N)); });
  EXPECT_NE(message.find("ragged_all_to_all needs one send size per member of axis i"), std::string::npos)
      << message;
  check_exchange<RowMajor>(rt(), N, 2, 0, {}, false);
}

TEST_P(Ragged, MembersThatDisagreeOnTheRowShapeRaiseE14) {
  const int N = n();
  if (N == 1) GTEST_SKIP() << "needs a peer";
  auto f = pmap::pmap(
      [N](pmap::Context& ctx, auto) {
        const int i = ctx.axis_index("i");
        Tensor<float, 2> x(N, i == 1 ? 3 : 2);
        x.setZero();
        auto r = ctx.ragged_all_to_all(x, "i", std::vector<Index>(static_cast<std::size_t>(N), 1));
        return static_cast<int>(r.data.size());
      },
      on_axis(rt()));
  const std::string message = catch_message<pmap::DeviceError>([&] { f(Tensor<float, 1>(N)); });
  EXPECT_NE(message.find("ragged_all_to_all"), std::string::npos) << message;
  check_exchange<ColMajor>(rt(), N, 2, 1, {}, false);
}

TEST_P(Ragged, ADeviceThatThrowsLeavesNoPeerWaiting) {
  const int N = n();
  auto f = pmap::pmap(
      [N](pmap::Context& ctx, auto) {
        if (ctx.axis_index("i") == N - 1) throw std::runtime_error("device gives up");
        Tensor<float, 1> x(N);
        x.setConstant(1.f);
        auto r = ctx.ragged_all_to_all(x, "i", std::vector<Index>(static_cast<std::size_t>(N), 1));
        return static_cast<int>(r.data.size());
      },
      on_axis(rt()));
  EXPECT_EQ(catch_message<std::runtime_error>([&] { f(Tensor<float, 1>(N)); }), "device gives up");
  check_exchange<RowMajor>(rt(), N, 1, 3, {}, false);
}

}  // namespace
