/// @file test_data_movers.cpp
/// @brief The collectives of SPEC 2.3 that move data (all_gather, psum_scatter, all_to_all,
/// ppermute, pshuffle, pbroadcast) against serial references on 1, 2, 4 and 8 devices and
/// more devices than threads; result types, axis queries and repeated calls.

#include <algorithm>
#include <chrono>
#include <thread>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "collective_util.hpp"
#include "pmap/detail/memory.hpp"

namespace {

using namespace coll_test;

class Collectives : public RuntimeTest {};
INSTANTIATE_TEST_SUITE_P(Runtimes, Collectives, testing::ValuesIn(collective_configs()), config_name);

// ---- all_gather --------------------------------------------------------------------------

template <int L>
void check_all_gather(pmap::Runtime& rt, int n) {
  using X = Tensor<float, 3, L>;
  X x = make<X>(7, n, 2, 3);
  const auto parts = parts_of(x);
  for (int a = -3; a <= 2; ++a) {
    auto f = pmap::pmap([a](pmap::Context& ctx, auto v) { return ctx.all_gather(v, "i", a); },
                        on_axis(rt));
    auto y = f(x);
    const int norm = a < 0 ? a + 3 : a;
    EXPECT_TRUE(tensors_near(y, replicate(stack(parts, norm), n))) << "untiled axis " << a;
  }
  for (int a = -2; a <= 1; ++a) {
    auto f = pmap::pmap(
        [a](pmap::Context& ctx, auto v) { return ctx.all_gather(v, "i", a, pmap::tiled); }, on_axis(rt));
    auto y = f(x);
    const int norm = a < 0 ? a + 2 : a;
    EXPECT_TRUE(tensors_near(y, replicate(concat(parts, norm), n))) << "tiled axis " << a;
  }
}

TEST_P(Collectives, AllGatherEveryAxisRowMajor) { check_all_gather<RowMajor>(rt(), n()); }
TEST_P(Collectives, AllGatherEveryAxisColMajor) { check_all_gather<ColMajor>(rt(), n()); }

TEST_P(Collectives, AllGatherDefaultsAndExpressions) {
  F2 x = make<F2>(8, n(), 4);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        return std::make_tuple(ctx.all_gather(v), ctx.all_gather(v + 1.f, "i"),
                               ctx.all_gather(v, {"i"}, -1, pmap::tiled));
      },
      on_axis(rt()));
  auto [a, b, c] = f(x);
  const auto parts = parts_of(x);
  EXPECT_TRUE(tensors_near(a, replicate(x, n())));
  F2 x1 = x + 1.f;
  EXPECT_TRUE(tensors_near(b, replicate(x1, n())));
  EXPECT_TRUE(tensors_near(c, replicate(concat(parts, 0), n())));
}

// ---- psum_scatter ------------------------------------------------------------------------

TEST_P(Collectives, PsumScatterUntiled) {
  const int N = n();
  F3 x0 = make<F3>(9, N, N, 3);   // scatter dimension 0
  F3 x1 = make<F3>(10, N, 3, N);  // scatter dimension 1 / -1
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto a, auto b) {
        return std::make_tuple(ctx.psum_scatter(a, "i"), ctx.psum_scatter(b, "i", 1),
                               ctx.psum_scatter(b * 2.f, "i", -1));
      },
      on_axis(rt()));
  auto [r0, r1, r2] = f(x0, x1);
  const F2 s0 = group_sum(x0, iota(N));
  const F2 s1 = group_sum(x1, iota(N));
  std::vector<F1> e0, e1, e2;
  for (int p = 0; p < N; ++p) {
    e0.push_back(s0.chip(p, 0));
    e1.push_back(s1.chip(p, 1));
    F1 t = s1.chip(p, 1) * 2.f;
    e2.push_back(t);
  }
  EXPECT_TRUE(tensors_near(r0, stack(e0, 0)));
  EXPECT_TRUE(tensors_near(r1, stack(e1, 0)));
  EXPECT_TRUE(tensors_near(r2, stack(e2, 0)));
}

TEST_P(Collectives, PsumScatterTiled) {
  const int N = n();
  F3 x0 = make<F3>(11, N, 2 * N, 3);
  Tensor<double, 3, ColMajor> x1 = make<Tensor<double, 3, ColMajor>>(12, N, 3, 3 * N);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto a, auto b) {
        return std::make_tuple(ctx.psum_scatter(a, "i", 0, pmap::tiled),
                               ctx.psum_scatter(b, "i", -1, pmap::tiled));
      },
      on_axis(rt()));
  auto [r0, r1] = f(x0, x1);
  const F2 s0 = group_sum(x0, iota(N));
  const Tensor<double, 2, ColMajor> s1 = group_sum(x1, iota(N));
  std::vector<F2> e0;
  std::vector<Tensor<double, 2, ColMajor>> e1;
  for (int p = 0; p < N; ++p) {
    e0.push_back(chunk(s0, 0, p, N));
    e1.push_back(chunk(s1, 1, p, N));
  }
  EXPECT_TRUE(tensors_near(r0, stack(e0, 0)));
  EXPECT_TRUE(tensors_near(r1, stack(e1, 0)));
}

// ---- all_to_all --------------------------------------------------------------------------

TEST_P(Collectives, AllToAllIsASerialTranspose) {
  const int N = n();
  F2 x = make<F2>(13, N, N);
  auto f = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.all_to_all(v, "i", 0, 0); },
                      on_axis(rt()));
  F2 y = f(x);
  F2 t = x.shuffle(std::array<int, 2>{1, 0});
  EXPECT_TRUE(tensors_near(y, t));
}

/// all_to_all on rank-R per-device inputs for one (split, concat) pair against the reference.
template <int L, int R, bool Tiled>
void check_all_to_all(pmap::Runtime& rt, int n, int s, int c, bool negative) {
  std::array<Index, R + 1> gd{};
  gd[0] = n;
  for (int k = 0; k < R; ++k) gd[static_cast<std::size_t>(k + 1)] = k + 2;
  gd[static_cast<std::size_t>(s + 1)] = Tiled ? 2 * n : n;
  using X = Tensor<float, R + 1, L>;
  X x = make_dims<X>(s * 3 + c, gd);
  const int ps = negative ? s - R : s;
  const int pc = negative ? c - R : c;
  auto f = pmap::pmap(
      [ps, pc](pmap::Context& ctx, auto v) {
        if constexpr (Tiled)
          return ctx.all_to_all(v, "i", ps, pc, pmap::tiled);
        else
          return ctx.all_to_all(v, "i", ps, pc);
      },
      on_axis(rt));
  auto y = f(x);
  const auto parts = parts_of(x);
  std::vector<Tensor<float, R, L>> refs;
  for (int p = 0; p < n; ++p)
    refs.push_back(Tiled ? all_to_all_tiled_ref(parts, iota(n), p, s, c)
                         : all_to_all_ref(parts, iota(n), p, s, c));
  EXPECT_TRUE(tensors_near(y, stack(refs, 0)))
      << (Tiled ? "tiled" : "untiled") << " split " << ps << " concat " << pc;
}

TEST_P(Collectives, AllToAllEverySplitConcatRank2) {
  for (int s = 0; s < 2; ++s)
    for (int c = 0; c < 2; ++c)
      for (bool neg : {false, true}) {
        check_all_to_all<RowMajor, 2, false>(rt(), n(), s, c, neg);
        check_all_to_all<RowMajor, 2, true>(rt(), n(), s, c, neg);
      }
}

TEST_P(Collectives, AllToAllEverySplitConcatRank3) {
  for (int s = 0; s < 3; ++s)
    for (int c = 0; c < 3; ++c) {
      check_all_to_all<RowMajor, 3, false>(rt(), n(), s, c, false);
      check_all_to_all<RowMajor, 3, true>(rt(), n(), s, c, c == 1);
      check_all_to_all<ColMajor, 3, false>(rt(), n(), s, c, s == 2);
      check_all_to_all<ColMajor, 3, true>(rt(), n(), s, c, false);
    }
}

// ---- ppermute, pshuffle, pbroadcast --------------------------------------------------------

TEST_P(Collectives, PpermuteRotations) {
  const int N = n();
  F2 x = make<F2>(14, N, 3);
  Tensor<std::int32_t, 3, ColMajor> xi = make<Tensor<std::int32_t, 3, ColMajor>>(15, N, 2, 2);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v, auto w) {
        const int size = ctx.axis_size("i");
        return std::make_tuple(ctx.ppermute(v, "i", ring(size, 1)),
                               ctx.ppermute(v * 2.f, "i", ring(size, -1)),
                               ctx.ppermute(w, {"i"}, ring(size, 1)));
      },
      on_axis(rt()));
  auto [a, b, c] = f(x, xi);
  const auto px = parts_of(x);
  const auto pw = parts_of(xi);
  std::vector<F1> ea, eb;
  std::vector<Tensor<std::int32_t, 2, ColMajor>> ec;
  for (int p = 0; p < N; ++p) {
    ea.push_back(px[static_cast<std::size_t>((p + N - 1) % N)]);
    F1 t = px[static_cast<std::size_t>((p + 1) % N)] * 2.f;
    eb.push_back(t);
    ec.push_back(pw[static_cast<std::size_t>((p + N - 1) % N)]);
  }
  EXPECT_TRUE(tensors_near(a, stack(ea, 0)));
  EXPECT_TRUE(tensors_near(b, stack(eb, 0)));
  EXPECT_TRUE(tensors_near(c, stack(ec, 0)));
}

TEST_P(Collectives, PpermuteZeroFillsDevicesThatReceiveNothing) {
  const int N = n();
  F2 x = make<F2>(16, N, 3);
  x = x + 100.f;  // no zeros in the input
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        const int last = ctx.axis_size() - 1;
        return std::make_tuple(ctx.ppermute(v, "i", Perm{{0, last}}),
                               ctx.ppermute(v, "i", Perm{}),
                               ctx.ppermute(ctx.axis_index() + 1, "i", Perm{{last, 0}}));
      },
      on_axis(rt()));
  auto [a, b, c] = f(x);
  F2 ea(N, 3);
  ea.setZero();
  ea.chip(N - 1, 0) = x.chip(0, 0);
  EXPECT_TRUE(tensors_near(a, ea));
  F2 zero(N, 3);
  zero.setZero();
  EXPECT_TRUE(tensors_near(b, zero));
  Tensor<int, 1> ec(N);
  ec.setZero();
  ec(0) = N;
  EXPECT_TRUE(tensors_near(c, ec));
}

TEST_P(Collectives, PshuffleGivesDeviceIThePermIthValue) {
  const int N = n();
  F2 x = make<F2>(17, N, 4);
  std::vector<int> reversed, shifted;
  for (int i = 0; i < N; ++i) {
    reversed.push_back(N - 1 - i);
    shifted.push_back((i + 2) % N);
  }
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, auto v) {
        return std::make_tuple(ctx.pshuffle(v, "i", reversed), ctx.pshuffle(v - 1.f, "i", shifted));
      },
      on_axis(rt()));
  auto [a, b] = f(x);
  const auto px = parts_of(x);
  std::vector<F1> ea, eb;
  for (int i = 0; i < N; ++i) {
    ea.push_back(px[static_cast<std::size_t>(reversed[static_cast<std::size_t>(i)])]);
    F1 t = px[static_cast<std::size_t>(shifted[static_cast<std::size_t>(i)])] - 1.f;
    eb.push_back(t);
  }
  EXPECT_TRUE(tensors_near(a, stack(ea, 0)));
  EXPECT_TRUE(tensors_near(b, stack(eb, 0)));
}

TEST_P(Collectives, PbroadcastGivesEveryDeviceTheSourceValue) {
  const int N = n();
  Tensor<double, 3, ColMajor> x = make<Tensor<double, 3, ColMajor>>(18, N, 2, 3);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        return std::make_tuple(ctx.pbroadcast(v, "i", 0),
                               ctx.pbroadcast(v, "i", ctx.axis_size() - 1),
                               ctx.pbroadcast(v * 0.5, "i", ctx.axis_size() / 2));
      },
      on_axis(rt()));
  auto [a, b, c] = f(x);
  EXPECT_TRUE(tensors_near(a, replicate(part(x, 0), N)));
  EXPECT_TRUE(tensors_near(b, replicate(part(x, N - 1), N)));
  Tensor<double, 2, ColMajor> h = part(x, N / 2) * 0.5;
  EXPECT_TRUE(tensors_near(c, replicate(h, N)));
}

TEST_P(Collectives, PermutationsOfSkewedDevicesRunAheadAndStayExact) {
  // A small ppermute, pshuffle or pbroadcast waits only for the device it reads, so a fast
  // device runs several of them ahead of a slow one and rewrites its staged copies while the
  // slow one may still be reading an older one (it must first wait for that reader). Skew the
  // devices (a different one sleeps on each step), mix in collectives over the whole group
  // and large ppermutes (in place), and check every value.
  const int steps = 80;
  F2 x = make<F2>(21, n(), 3);
  auto f = pmap::pmap(
      [steps](pmap::Context& ctx, auto v) {
        const int me = ctx.axis_index("i");
        const int N = ctx.axis_size("i");
        auto mod = [N](int a) { return ((a % N) + N) % N; };
        std::vector<std::pair<int, int>> shift;  // device 0 receives zeros
        for (int p = 0; p + 1 < N; ++p) shift.emplace_back(p, p + 1);
        int wrong = 0;
        int right = me;
        int left = me;
        F1 big(16 * 1024);
        for (int k = 0; k < steps; ++k) {
          if (mod(k + me) % 9 == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
          right = ctx.ppermute(right, "i", ring(N, 1));
          left = ctx.ppermute(left, "i", ring(N, -1));
          if (right != mod(me - k - 1) || left != mod(me + k + 1)) ++wrong;
          F1 small(3);
          small.setConstant(static_cast<float>(100 * me + k));
          const F1 s = ctx.ppermute(small, "i", shift);
          const float want = me == 0 ? 0.f : static_cast<float>(100 * (me - 1) + k);
          if (s(0) != want || s(2) != want) ++wrong;
          std::vector<int> perm;
          for (int p = 0; p < N; ++p) perm.push_back(mod(p * 3 + k));
          if (ctx.pshuffle(10 * me + k, "i", perm) != 10 * perm[static_cast<std::size_t>(me)] + k)
            ++wrong;
          if (k % 3 == 0 && ctx.pbroadcast(7 * me + k, "i", k % N) != 7 * (k % N) + k) ++wrong;
          if (k % 5 == 0 && ctx.psum(me, "i") != N * (N - 1) / 2) ++wrong;
          if (k % 11 == 0) {
            big.setConstant(static_cast<float>(me + k));
            const F1 b = ctx.ppermute(big, "i", ring(N, 1));
            const auto from = static_cast<float>(mod(me - 1) + k);
            if (b(0) != from || b(big.size() - 1) != from) ++wrong;
          }
        }
        return std::make_tuple(ctx.psum(v, "i"), wrong);
      },
      on_axis(rt()));
  for (int call = 0; call < 3; ++call) {
    auto [sum, wrong] = f(x);
    EXPECT_TRUE(tensors_near(sum, replicate(group_sum(x, iota(n())), n()))) << "call " << call;
    for (Index p = 0; p < n(); ++p) EXPECT_EQ(wrong(p), 0) << "call " << call << ", device " << p;
  }
}

// ---- result types (SPEC 2.3) ----------------------------------------------------------------

TEST_P(Collectives, ResultTypesFollowTheSpec) {
  F2 x = make<F2>(0, n(), n());
  Tensor<float, 2, ColMajor> xc = make<Tensor<float, 2, ColMajor>>(1, n(), n());
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v, auto c) {
        using V = Tensor<float, 1>;
        using C = Tensor<float, 1, ColMajor>;
        // decltype only: nothing runs, so the pmap result reports each check per device.
        return std::make_tuple(
            std::is_same_v<decltype(ctx.psum(v)), V>,
            std::is_same_v<decltype(ctx.psum(c * 2.f)), C>,
            std::is_same_v<decltype(ctx.pmean(v)), V>,
            std::is_same_v<decltype(ctx.pmax(c)), C>,
            std::is_same_v<decltype(ctx.pargmax(v)), Tensor<std::int32_t, 1>>,
            std::is_same_v<decltype(ctx.pargmin(c)), Tensor<std::int32_t, 1, ColMajor>>,
            std::is_same_v<decltype(ctx.all_gather(c)), Tensor<float, 2, ColMajor>>,
            std::is_same_v<decltype(ctx.all_gather(v, {}, 0, pmap::tiled)), V>,
            std::is_same_v<decltype(ctx.psum_scatter(v)), Tensor<float, 0>>,
            std::is_same_v<decltype(ctx.psum_scatter(v, {}, 0, pmap::tiled)), V>,
            std::is_same_v<decltype(ctx.all_to_all(c, {}, 0, 0)), C>,
            std::is_same_v<decltype(ctx.ppermute(c, {}, Perm{})), C>,
            std::is_same_v<decltype(ctx.pbroadcast(v, {}, 0)), V>,
            std::is_same_v<decltype(ctx.psum(1)), int>,
            std::is_same_v<decltype(ctx.pmean(1)), double>,
            std::is_same_v<decltype(ctx.psum(true)), std::int32_t>,
            std::is_same_v<decltype(ctx.pmax(2.5f)), float>);
      },
      on_axis(rt()));
  const auto checks = f(x, xc);
  int k = 0;
  auto check = [&](const Tensor<bool, 1>& t) { EXPECT_TRUE(t(0)) << "check " << k++; };
  std::apply([&](const auto&... t) { (check(t), ...); }, checks);
}

// ---- axis queries, anonymous axes, results -----------------------------------------------

TEST_P(Collectives, AxisIndexAndSizeForOneNameAListAndInnermost) {
  const int N = n();
  F2 x = make<F2>(0, N, 1);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto) {
        return std::make_tuple(ctx.axis_index(), ctx.axis_index("i"), ctx.axis_index({"i"}),
                               ctx.axis_size(), ctx.axis_size("i"), ctx.axis_size({"i"}),
                               ctx.device().id);
      },
      on_axis(rt()));
  auto [i0, i1, i2, s0, s1, s2, dev] = f(x);
  Tensor<int, 1> idx(N), size(N);
  for (int p = 0; p < N; ++p) {
    idx(p) = p;
    size(p) = N;
  }
  EXPECT_TRUE(tensors_near(i0, idx));
  EXPECT_TRUE(tensors_near(i1, idx));
  EXPECT_TRUE(tensors_near(i2, idx));
  EXPECT_TRUE(tensors_near(s0, size));
  EXPECT_TRUE(tensors_near(s1, size));
  EXPECT_TRUE(tensors_near(s2, size));
  EXPECT_TRUE(tensors_near(dev, idx));
}

TEST_P(Collectives, AnonymousAxisIsTheInnermost) {
  F2 x = make<F2>(19, n(), 3);
  pmap::Options o;
  o.runtime = &rt();
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        return std::make_tuple(ctx.psum(v), ctx.all_gather(v), ctx.axis_index());
      },
      o);
  auto [s, g, i] = f(x);
  EXPECT_TRUE(tensors_near(s, replicate(group_sum(x, iota(n())), n())));
  EXPECT_TRUE(tensors_near(g, replicate(x, n())));
  EXPECT_EQ(i(n() - 1), n() - 1);
}

TEST_P(Collectives, ResultsReturnedDirectlyOrThroughEval) {
  F2 x = make<F2>(20, n(), 3);
  x = x + 50.f;  // no zero sums
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        return std::make_tuple(ctx.psum(v, "i"), pmap::eval(v / ctx.psum(v, "i")),
                               pmap::eval(ctx.pmax(v) - ctx.pmin(v)));
      },
      on_axis(rt()));
  auto [s, frac, range] = f(x);
  const F1 sum = group_sum(x, iota(n()));
  EXPECT_TRUE(tensors_near(s, replicate(sum, n())));
  std::vector<F1> ef;
  for (int p = 0; p < n(); ++p) {
    F1 t = part(x, p) / sum;
    ef.push_back(t);
  }
  EXPECT_TRUE(tensors_near(frac, stack(ef, 0)));
  auto max_op = [](float a, float b) { return std::max(a, b); };
  auto min_op = [](float a, float b) { return std::min(a, b); };
  F1 r = reduce_parts(x, iota(n()), max_op) - reduce_parts(x, iota(n()), min_op);
  EXPECT_TRUE(tensors_near(range, replicate(r, n())));
}

TEST_P(Collectives, OneMappedCalledRepeatedlyWithSeveralCollectives) {
  const int N = n();
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        F1 s = ctx.psum(v, "i");
        F2 g = ctx.all_gather(s, "i");
        F1 r = ctx.ppermute(v, "i", ring(ctx.axis_size(), 1));
        return std::make_tuple(pmap::eval(g.chip(0, 0) + r), ctx.pmax(v, "i"));
      },
      on_axis(rt()));
  for (int call = 0; call < 30; ++call) {
    F2 x = make<F2>(call, N, 5);
    auto [a, m] = f(x);
    const F1 s = group_sum(x, iota(N));
    std::vector<F1> ea;
    for (int p = 0; p < N; ++p) {
      F1 t = s + part(x, (p + N - 1) % N);
      ea.push_back(t);
    }
    ASSERT_TRUE(tensors_near(a, stack(ea, 0))) << "call " << call;
    auto max_op = [](float u, float w) { return std::max(u, w); };
    ASSERT_TRUE(tensors_near(m, replicate(reduce_parts(x, iota(N), max_op), N))) << "call " << call;
  }
}

}  // namespace
