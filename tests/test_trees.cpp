// Reductions over trees (SPEC 10): std::tuple, std::tie, std::array, std::vector, nested,
// scalars and tensors of several dtypes mixed, small (packed) and large (in place) trees,
// groups, and trees that differ between devices. Every leaf must equal what the leaf alone
// gives.

#include <array>
#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "test_util.hpp"

namespace {

using namespace pmap_test;

template <class T, int R>
using Tensor = Eigen::Tensor<T, R, RowMajor>;

class Trees : public RuntimeTest {
 protected:
  pmap::Options named_axis() const {
    pmap::Options o = opts();
    o.axis_name = "i";
    return o;
  }
};

/// Every reduction of a tuple (tensors of two dtypes, a scalar, a bool tensor) equals the
/// leafwise reductions; `size` elements per tensor leaf picks the packed or the table path.
void check_every_reduction(const pmap::Options& o, int n, Index size) {
  Tensor<float, 2> a(n, size);
  Tensor<std::int32_t, 2> b(n, 3);
  Tensor<bool, 2> c(n, 5);
  fill_values(a, 1);
  fill_values(b, 2);
  fill_values(c, 3);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, View<float, 1, RowMajor> x, View<std::int32_t, 1, RowMajor> y,
         View<bool, 1, RowMajor> z) {
        const double s = ctx.axis_index("i") + 0.5;
        const auto tree = std::make_tuple(x, y, s, z);
        auto [sx, sy, ss, sz] = ctx.psum(tree, "i");
        auto [mx, my, ms, mz] = ctx.pmean(tree, "i");
        auto [hx, hy, hs] = ctx.pmax(std::tie(x, y, s), "i");
        auto [lx, ly, ls] = ctx.pmin(std::tie(x, y, s), "i");
        static_assert(std::is_same_v<decltype(sz), Tensor<std::int32_t, 1>>);
        static_assert(std::is_same_v<decltype(my), Tensor<double, 1>>);
        static_assert(std::is_same_v<decltype(ss), double>);
        auto eq = [](const auto& u, const auto& v) { return bool(tensors_equal(u, v)); };
        bool ok = eq(sx, ctx.psum(x, "i")) && eq(sy, ctx.psum(y, "i")) && ss == ctx.psum(s, "i") &&
                  eq(sz, ctx.psum(z, "i")) && eq(mx, ctx.pmean(x, "i")) &&
                  eq(my, ctx.pmean(y, "i")) && ms == ctx.pmean(s, "i") && eq(mz, ctx.pmean(z, "i")) &&
                  eq(hx, ctx.pmax(x, "i")) && eq(hy, ctx.pmax(y, "i")) && hs == ctx.pmax(s, "i") &&
                  eq(lx, ctx.pmin(x, "i")) && eq(ly, ctx.pmin(y, "i")) && ls == ctx.pmin(s, "i");
        return ok;
      },
      o);
  const Tensor<bool, 1> ok = f(a, b, c);
  for (int i = 0; i < n; ++i) EXPECT_TRUE(ok(i)) << "device " << i << ", " << size << " floats";
}

TEST_P(Trees, SmallTreesAreOneCollectiveLikeTheirLeaves) { check_every_reduction(named_axis(), n(), 7); }
TEST_P(Trees, LargeTreesAreReadInPlace) { check_every_reduction(named_axis(), n(), 5000); }
TEST_P(Trees, TreesOf64KiBAndMoreSplitTheirReduction) { check_every_reduction(named_axis(), n(), 20000); }

TEST_P(Trees, ArraysVectorsAndNestedTrees) {
  Tensor<double, 2> a(n(), 4);
  fill_values(a, 1);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, View<double, 1, RowMajor> x) {
        const Tensor<double, 1> twice = x * 2.0;
        const std::array<Tensor<double, 1>, 2> arr{Tensor<double, 1>(x), twice};
        std::vector<Tensor<double, 1>> vec{twice, twice, Tensor<double, 1>(x)};
        const auto nested = std::make_tuple(arr, std::make_tuple(vec, 3.0), std::vector<int>{1, 2});
        auto [ra, rest, ints] = ctx.psum(nested, "i");
        auto& [rv, three] = rest;
        static_assert(std::is_same_v<decltype(ra), std::array<Tensor<double, 1>, 2>>);
        static_assert(std::is_same_v<decltype(ints), std::vector<std::int32_t>>);
        const Tensor<double, 1> sx = ctx.psum(x, "i");
        const Tensor<double, 1> s2 = ctx.psum(twice, "i");
        const int n = ctx.axis_size("i");
        bool ok = tensors_equal(ra[0], sx) && tensors_equal(ra[1], s2) && rv.size() == 3 &&
                  tensors_equal(rv[0], s2) && tensors_equal(rv[2], sx) && three == 3.0 * n &&
                  ints.size() == 2 && ints[0] == n && ints[1] == 2 * n;
        // An empty vector is a tree of no leaves: one collective that reduces nothing.
        const std::vector<Tensor<double, 1>> none;
        ok = ok && ctx.pmean(none, "i").empty();
        return ok;
      },
      named_axis());
  const Tensor<bool, 1> ok = f(a);
  for (int i = 0; i < n(); ++i) EXPECT_TRUE(ok(i)) << "device " << i;
}

TEST_P(Trees, DataMoversOverTreesEqualTheirLeaves) {
  Tensor<float, 2> a(n(), 2 * n());
  Tensor<std::int32_t, 2> b(n(), n());
  fill_values(a, 1);
  fill_values(b, 2);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, View<float, 1, RowMajor> x, View<std::int32_t, 1, RowMajor> y) {
        const int n = ctx.axis_size("i");
        auto eq = [](const auto& u, const auto& v) { return bool(tensors_equal(u, v)); };
        std::vector<std::pair<int, int>> shift;
        std::vector<int> reverse;
        for (int k = 0; k < n; ++k) {
          shift.emplace_back(k, (k + 1) % n);
          reverse.push_back(n - 1 - k);
        }
        const auto tree = std::tie(x, y);
        auto [g0, g1] = ctx.all_gather(tree, "i");
        auto [t0, t1] = ctx.all_gather(tree, "i", 0, pmap::tiled);
        auto [s0, s1] = ctx.psum_scatter(tree, "i", 0, pmap::tiled);
        auto [u1] = ctx.psum_scatter(std::tie(y), "i");
        auto [a0, a1] = ctx.all_to_all(tree, "i", 0, 0, pmap::tiled);
        auto [p0, p1] = ctx.ppermute(tree, "i", shift);
        auto [q0, q1] = ctx.pshuffle(tree, "i", reverse);
        auto [b0, b1] = ctx.pbroadcast(tree, "i", n - 1);
        const std::vector<View<std::int32_t, 1, RowMajor>> vec{y, y};
        auto gathered = ctx.all_gather(vec, "i");
        return eq(g0, ctx.all_gather(x, "i")) && eq(g1, ctx.all_gather(y, "i")) &&
               eq(t0, ctx.all_gather(x, "i", 0, pmap::tiled)) &&
               eq(t1, ctx.all_gather(y, "i", 0, pmap::tiled)) &&
               eq(s0, ctx.psum_scatter(x, "i", 0, pmap::tiled)) &&
               eq(s1, ctx.psum_scatter(y, "i", 0, pmap::tiled)) && eq(u1, ctx.psum_scatter(y, "i")) &&
               eq(a0, ctx.all_to_all(x, "i", 0, 0, pmap::tiled)) &&
               eq(a1, ctx.all_to_all(y, "i", 0, 0, pmap::tiled)) && eq(p0, ctx.ppermute(x, "i", shift)) &&
               eq(p1, ctx.ppermute(y, "i", shift)) && eq(q0, ctx.pshuffle(x, "i", reverse)) &&
               eq(q1, ctx.pshuffle(y, "i", reverse)) && eq(b0, ctx.pbroadcast(x, "i", n - 1)) &&
               eq(b1, ctx.pbroadcast(y, "i", n - 1)) && gathered.size() == 2 &&
               eq(gathered[1], ctx.all_gather(y, "i"));
      },
      named_axis());
  const Tensor<bool, 1> ok = f(a, b);
  for (int i = 0; i < n(); ++i) EXPECT_TRUE(ok(i)) << "device " << i;
}

TEST_P(Trees, GroupsApplyToEveryLeaf) {
  if (n() % 2 != 0) GTEST_SKIP() << "needs an even device count";
  pmap::Groups groups(2);
  for (int i = 0; i < n(); ++i) groups[static_cast<std::size_t>(i % 2)].push_back(i);
  Tensor<float, 2> a(n(), 3);
  fill_values(a, 1);
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, View<float, 1, RowMajor> x) {
        const float s = static_cast<float>(ctx.axis_index("i"));
        auto [tx, ts] = ctx.psum(std::tie(x, s), "i", groups);
        return bool(tensors_equal(tx, ctx.psum(x, "i", groups))) && ts == ctx.psum(s, "i", groups);
      },
      named_axis());
  const Tensor<bool, 1> ok = f(a);
  for (int i = 0; i < n(); ++i) EXPECT_TRUE(ok(i)) << "device " << i;
}

TEST_P(Trees, ManyTreeReductionsWithMoreDevicesThanThreads) {
  Tensor<float, 2> a(n(), 16);
  fill_values(a, 1);
  const int steps = kSanitized ? 40 : 200;
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, View<float, 1, RowMajor> x) {
        Tensor<float, 1> u = x, v = x * 2.f;
        for (int s = 0; s < steps; ++s) std::tie(u, v) = ctx.pmean(std::tie(u, v), "i");
        return pmap::eval(u + v);
      },
      named_axis());
  const Tensor<float, 2> r = f(a);
  for (Index k = 0; k < 16; ++k) {
    float mean = 0;
    for (int i = 0; i < n(); ++i) mean += a(i, k);
    mean /= static_cast<float>(n());
    for (int i = 0; i < n(); ++i) EXPECT_NEAR(r(i, k), 3.f * mean, 1e-4f);
  }
}

TEST_P(Trees, TreesThatDifferBetweenDevicesAreADeviceError) {
  if (n() < 2) GTEST_SKIP() << "needs 2 devices";
  Tensor<float, 2> a(n(), 4);
  fill_values(a, 1);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, View<float, 1, RowMajor> x) {
        std::vector<Tensor<float, 1>> tree(ctx.axis_index("i") == 1 ? 3 : 2, Tensor<float, 1>(x));
        return ctx.psum(tree, "i").size();
      },
      named_axis());
  const std::string msg = catch_message<pmap::DeviceError>([&] { f(a); });
  EXPECT_NE(msg.find("psum over axis i on tree[3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("psum over axis i on tree[2]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the trees first differ at leaf 2 (depth first)"), std::string::npos) << msg;
  // Trees of as many leaves: the first leaf that differs is named.
  auto h = pmap::pmap(
      [](pmap::Context& ctx, View<float, 1, RowMajor> x) {
        const Tensor<float, 1> other(ctx.axis_index("i") == 1 ? 5 : 4);
        return std::get<0>(ctx.pmax(std::make_tuple(x, std::array<Tensor<float, 1>, 2>{Tensor<float, 1>(x), other}), "i"));
      },
      named_axis());
  const std::string leaf_msg = catch_message<pmap::DeviceError>([&] { h(a); });
  EXPECT_NE(leaf_msg.find("pmax over axis i on tree[3]"), std::string::npos) << leaf_msg;
  EXPECT_NE(leaf_msg.find("the trees first differ at leaf 2 (depth first)"), std::string::npos) << leaf_msg;
  // And a tree against a single tensor.
  auto g = pmap::pmap(
      [](pmap::Context& ctx, View<float, 1, RowMajor> x) {
        if (ctx.axis_index("i") == 0) return std::get<0>(ctx.psum(std::tie(x), "i"));
        return ctx.psum(x, "i");
      },
      named_axis());
  EXPECT_FALSE(catch_message<pmap::DeviceError>([&] { g(a); }).empty());
}

/// A tree of data movers is one collective too: trees of different sizes on two devices
/// meet in one rendezvous and fail it (E14 naming both trees), whatever their leaves.
TEST_P(Trees, DataMoverTreesAreOneCollective) {
  if (n() < 2) GTEST_SKIP() << "needs 2 devices";
  Tensor<float, 2> a(n(), 4);
  fill_values(a, 1);
  for (const char* op : {"ppermute", "all_gather", "pbroadcast", "all_to_all", "psum_scatter"}) {
    auto f = pmap::pmap(
        [op](pmap::Context& ctx, View<float, 1, RowMajor> x) {
          const int n = ctx.axis_size("i");
          std::vector<Tensor<float, 1>> tree(ctx.axis_index("i") == 1 ? 3 : 2, Tensor<float, 1>(x));
          std::vector<std::pair<int, int>> shift;
          for (int k = 0; k < n; ++k) shift.emplace_back(k, (k + 1) % n);
          const std::string name = op;
          if (name == "ppermute") return ctx.ppermute(tree, "i", shift).size();
          if (name == "all_gather") return ctx.all_gather(tree, "i").size();
          if (name == "pbroadcast") return ctx.pbroadcast(tree, "i", 0).size();
          std::vector<Tensor<float, 1>> blocks(tree.size(), Tensor<float, 1>(n));
          blocks[0].setConstant(1.f);
          if (name == "psum_scatter") return ctx.psum_scatter(blocks, "i").size();
          return ctx.all_to_all(blocks, "i", 0, 0).size();
        },
        named_axis());
    const std::string msg = catch_message<pmap::DeviceError>([&] { f(a); });
    EXPECT_NE(msg.find(std::string(op) + " over axis i on tree[3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string(op) + " over axis i on tree[2]"), std::string::npos) << msg;
  }
}

/// Large leaves (read in place through the table), a Core leaf, and nested containers.
TEST_P(Trees, LargeDataMoverTreesWithCoreLeaves) {
  constexpr Index kLen = 3000;  // 12 KiB a leaf: above the packed path
  Tensor<float, 2> a(n(), kLen);
  Tensor<std::int32_t, 2> b(n(), kLen);
  fill_values(a, 1);
  fill_values(b, 2);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, View<float, 1, RowMajor> x, View<std::int32_t, 1, RowMajor> y) {
        const int n = ctx.axis_size("i");
        auto eq = [](const auto& u, const auto& v) { return bool(tensors_equal(u, v)); };
        std::vector<std::pair<int, int>> shift;
        for (int k = 0; k < n; ++k) shift.emplace_back(k, (k + 2) % n);
        const Eigen::VectorXf v = Eigen::VectorXf::LinSpaced(kLen, 0.f, 1.f) * static_cast<float>(ctx.axis_index("i"));
        const auto tree = std::make_tuple(x, std::array<View<std::int32_t, 1, RowMajor>, 2>{y, y}, v);
        auto [p0, p1, p2] = ctx.ppermute(tree, "i", shift);
        static_assert(std::is_same_v<decltype(p2), Eigen::VectorXf>);
        auto [b0, b1, b2] = ctx.pbroadcast(tree, "i", n - 1);
        auto [g0, g1] = ctx.all_gather(std::tie(x, y), "i", 0, pmap::tiled);
        return eq(p0, ctx.ppermute(x, "i", shift)) && eq(p1[0], ctx.ppermute(y, "i", shift)) &&
               eq(p1[1], p1[0]) && p2 == ctx.ppermute(v, "i", shift) && eq(b0, ctx.pbroadcast(x, "i", n - 1)) &&
               eq(b1[1], ctx.pbroadcast(y, "i", n - 1)) && b2 == ctx.pbroadcast(v, "i", n - 1) &&
               eq(g0, ctx.all_gather(x, "i", 0, pmap::tiled)) && eq(g1, ctx.all_gather(y, "i", 0, pmap::tiled));
      },
      named_axis());
  const Tensor<bool, 1> ok = f(a, b);
  for (int i = 0; i < n(); ++i) EXPECT_TRUE(ok(i)) << "device " << i;
}

/// psum_scatter over a tree, packed and in place, tiled and not, equals its leaves.
TEST_P(Trees, ScatterSumTreesEqualTheirLeaves) {
  for (const Index len : {Index{3}, Index{1500}}) {  // 1500 * n floats a leaf: in place
    Tensor<float, 2> a(n(), n() * len);
    Tensor<std::int32_t, 2> b(n(), n());
    fill_values(a, 1);
    fill_values(b, 2);
    auto f = pmap::pmap(
        [len](pmap::Context& ctx, View<float, 1, RowMajor> x, View<std::int32_t, 1, RowMajor> y) {
          const int n = ctx.axis_size("i");
          auto eq = [](const auto& u, const auto& v) { return bool(tensors_equal(u, v)); };
          const Tensor<float, 2> x2 = x.reshape(std::array<Index, 2>{n, len});
          auto [s0, s1] = ctx.psum_scatter(std::make_tuple(x2, y), "i");
          auto [t0, t1] = ctx.psum_scatter(std::tie(x, y), "i", 0, pmap::tiled);
          auto u = ctx.psum_scatter(std::vector<Tensor<float, 2>>{x2, x2}, "i", 0, pmap::tiled);
          return eq(s0, ctx.psum_scatter(x2, "i")) && eq(s1, ctx.psum_scatter(y, "i")) &&
                 eq(t0, ctx.psum_scatter(x, "i", 0, pmap::tiled)) &&
                 eq(t1, ctx.psum_scatter(y, "i", 0, pmap::tiled)) && u.size() == 2 &&
                 eq(u[1], ctx.psum_scatter(x2, "i", 0, pmap::tiled));
        },
        named_axis());
    const Tensor<bool, 1> ok = f(a, b);
    for (int i = 0; i < n(); ++i) EXPECT_TRUE(ok(i)) << "device " << i << ", " << len;
  }
}

/// A tree passed as an rvalue donates its owned tensors, leaf by leaf: they are left empty
/// and their storage serves this device's next results; leaves held by lvalue reference
/// are read as usual. Results equal the leafwise collectives either way.
TEST_P(Trees, RvalueTreesDonateTheirTensors) {
  constexpr Index kLen = 20000;  // 80 KiB a leaf: large enough to be kept as a spare
  Tensor<float, 2> a(n(), kLen);
  fill_values(a, 1);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, View<float, 1, RowMajor> x) {
        const int n = ctx.axis_size("i");
        auto eq = [](const auto& u, const auto& v) { return bool(tensors_equal(u, v)); };
        std::vector<std::pair<int, int>> shift;
        for (int k = 0; k < n; ++k) shift.emplace_back(k, (k + 1) % n);
        const Tensor<float, 1> expected = ctx.psum(x, "i");
        Tensor<float, 1> w = x;
        Tensor<float, 1> b = x;
        const float* w_storage = w.data();
        const float* b_storage = b.data();
        auto grads = std::make_tuple(std::move(w), std::move(b));  // the tuple owns them now
        auto [sw, sb] = ctx.psum(std::move(grads), "i");
        bool ok = eq(sw, expected) && eq(sb, expected) && std::get<0>(grads).size() == 0 &&
                  std::get<1>(grads).size() == 0;
        // The donated storage is this device's next two results of that size.
        auto next = ctx.psum(x, "i");
        auto after = ctx.pmax(x, "i");
        ok = ok && eq(next, expected) && ((next.data() == b_storage && after.data() == w_storage) ||
                                          (next.data() == w_storage && after.data() == b_storage));
        // A reference to an rvalue is donated too, an lvalue reference is not.
        Tensor<float, 1> kept = x;
        Tensor<float, 1> given = x;
        auto [pk, pg] = ctx.ppermute(std::forward_as_tuple(kept, std::move(given)), "i", shift);
        ok = ok && kept.size() == kLen && given.size() == 0 && eq(pk, ctx.ppermute(x, "i", shift)) &&
             eq(pg, pk);
        // Vectors, means and all_to_all.
        std::vector<Tensor<float, 1>> vec{Tensor<float, 1>(x), Tensor<float, 1>(x)};
        auto means = ctx.pmean(std::move(vec), "i");
        ok = ok && vec[0].size() == 0 && vec[1].size() == 0 && eq(means[1], ctx.pmean(x, "i"));
        auto [moved] = ctx.all_to_all(std::make_tuple(Tensor<float, 1>(x)), "i", 0, 0, pmap::tiled);
        return ok && eq(moved, ctx.all_to_all(x, "i", 0, 0, pmap::tiled));
      },
      named_axis());
  const Tensor<bool, 1> ok = f(a);
  for (int i = 0; i < n(); ++i) EXPECT_TRUE(ok(i)) << "device " << i;
}

// ---- Eigen Core operands and outputs (SPEC 10) ---------------------------------------------

TEST_P(Trees, CoreOperandsGiveTheirPlainObjects) {
  Tensor<float, 2> a(n(), 6);
  fill_values(a, 1);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, View<float, 1, RowMajor> x) {
        const int i = ctx.axis_index("i");
        // A 2x3 matrix of each storage order, a vector, an array, a Map and an expression.
        Eigen::Matrix<float, 2, 3> cm = Eigen::Map<const Eigen::Matrix<float, 2, 3>>(x.data());
        Eigen::Matrix<float, 2, 3, Eigen::RowMajor> rm = cm;
        Eigen::VectorXf v = Eigen::Map<const Eigen::VectorXf>(x.data(), 6);
        Eigen::ArrayXXi ia = (cm.array() * 4).cast<int>() + i;
        const auto sum_cm = ctx.psum(cm, "i");
        const auto sum_rm = ctx.psum(rm, "i");
        static_assert(std::is_same_v<std::remove_const_t<decltype(sum_cm)>, Eigen::Matrix<float, 2, 3>>);
        static_assert(std::is_same_v<std::remove_const_t<decltype(sum_rm)>, Eigen::Matrix<float, 2, 3, Eigen::RowMajor>>);
        const auto mean_i = ctx.pmean(ia, "i");
        static_assert(std::is_same_v<std::remove_const_t<decltype(mean_i)>, Eigen::ArrayXXd>);
        const Eigen::VectorXf max_v = ctx.pmax(Eigen::Map<const Eigen::VectorXf>(x.data(), 6), "i");
        const Eigen::VectorXf min_expr = ctx.pmin(v * 2.f, "i");
        const Eigen::VectorXf shifted = ctx.pbroadcast(v, "i", 0);
        std::vector<int> reverse;
        for (int k = ctx.axis_size("i") - 1; k >= 0; --k) reverse.push_back(k);
        const Eigen::VectorXf shuffled = ctx.pshuffle(v, "i", reverse);
        // The same through tensors.
        const Tensor<float, 1> tx = x;
        const Tensor<float, 1> sx = ctx.psum(tx, "i");
        const Tensor<float, 1> mx = ctx.pmax(tx, "i");
        const Tensor<float, 1> mn = ctx.pmin(Tensor<float, 1>(tx * 2.f), "i");
        const Tensor<float, 1> b0 = ctx.pbroadcast(tx, "i", 0);
        const Tensor<float, 1> sh = ctx.pshuffle(tx, "i", reverse);
        bool ok = true;
        for (int r = 0; r < 2; ++r)
          for (int c = 0; c < 3; ++c) {
            ok = ok && sum_cm(r, c) == sx(c * 2 + r) && sum_rm(r, c) == sx(c * 2 + r);
          }
        for (int k = 0; k < 6; ++k)
          ok = ok && max_v(k) == mx(k) && min_expr(k) == mn(k) && shifted(k) == b0(k) &&
               shuffled(k) == sh(k);
        const Eigen::ArrayXXi ints = ctx.psum(ia, "i");
        ok = ok && mean_i.rows() == 2 && mean_i.cols() == 3 &&
             std::abs(mean_i(1, 2) - ints(1, 2) / double(ctx.axis_size("i"))) < 1e-12;
        // Core leaves in a tree: one collective.
        auto [tcm, tv, ts] = ctx.psum(std::tie(cm, v, i), "i");
        ok = ok && tcm == sum_cm && tv.size() == 6 && tv(5) == sx(5) && ts == ctx.psum(i, "i");
        return ok;
      },
      named_axis());
  const Tensor<bool, 1> ok = f(a);
  for (int i = 0; i < n(); ++i) EXPECT_TRUE(ok(i)) << "device " << i;
}

TEST_P(Trees, CoreOutputsStackIntoTensorsOfTheirStorageOrder) {
  Tensor<float, 2> a(n(), 6);
  fill_values(a, 1);
  auto f = pmap::pmap(
      [](View<float, 1, RowMajor> x) {
        Eigen::Matrix<float, 2, 3> cm = Eigen::Map<const Eigen::Matrix<float, 2, 3>>(x.data());
        Eigen::Matrix<float, 2, 3, Eigen::RowMajor> rm = cm;
        Eigen::VectorXf v = Eigen::Map<const Eigen::VectorXf>(x.data(), 6);
        return std::make_tuple(cm, rm, v);
      },
      opts());
  const auto [cms, rms, vs] = f(a);
  static_assert(std::is_same_v<std::remove_const_t<decltype(cms)>, Eigen::Tensor<float, 3, ColMajor>>);
  static_assert(std::is_same_v<std::remove_const_t<decltype(rms)>, Eigen::Tensor<float, 3, RowMajor>>);
  static_assert(std::is_same_v<std::remove_const_t<decltype(vs)>, Eigen::Tensor<float, 2, ColMajor>>);
  ASSERT_EQ(cms.dimension(0), n());
  ASSERT_EQ(cms.dimension(1), 2);
  ASSERT_EQ(cms.dimension(2), 3);
  for (int i = 0; i < n(); ++i)
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 3; ++c) {
        EXPECT_EQ(cms(i, r, c), a(i, c * 2 + r));
        EXPECT_EQ(rms(i, r, c), a(i, c * 2 + r));
      }
  for (int i = 0; i < n(); ++i)
    for (int k = 0; k < 6; ++k) EXPECT_EQ(vs(i, k), a(i, k));
  // shard_map: Core blocks concatenate; a replicated Core output.
  const pmap::Mesh mesh({{"x", n()}}, &rt());
  auto g = pmap::shard_map(
      [](pmap::Context& ctx, View<float, 2, RowMajor> blk) {
        Eigen::MatrixXf m = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
            blk.data(), blk.dimension(0), blk.dimension(1));
        return std::make_tuple(m, ctx.psum(Eigen::VectorXf::Ones(2).eval(), "x"));
      },
      mesh, {pmap::P("x")}, {pmap::P("x"), pmap::P()});
  const auto [blocks, ones] = g(a);
  static_assert(std::is_same_v<std::remove_const_t<decltype(blocks)>, Eigen::Tensor<float, 2, ColMajor>>);
  EXPECT_TRUE(tensors_equal(blocks, Eigen::Tensor<float, 2, ColMajor>(a.swap_layout().shuffle(std::array<int, 2>{1, 0}))));
  EXPECT_EQ(ones(0), static_cast<float>(n()));
}

PMAP_TEST_INSTANTIATE(Trees);

}  // namespace
