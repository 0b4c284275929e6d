/// @file test_collectives.cpp
/// @brief The collectives of SPEC 2.3 with JAX semantics: every collective on 1, 2, 4 and 8
/// devices (and more devices than threads), axis_index_groups (SPEC 8.5), the argument
/// errors of SPEC 5, axis queries, JAX's documented examples and a halo-exchange automaton.

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

using F1 = Tensor<float, 1>;
using F2 = Tensor<float, 2>;
using F3 = Tensor<float, 3>;
using Perm = std::vector<std::pair<int, int>>;

class Collectives : public RuntimeTest {};
INSTANTIATE_TEST_SUITE_P(Runtimes, Collectives,
                         testing::Values(RtConfig{1, 1}, RtConfig{2, 1}, RtConfig{2, 2},
                                         RtConfig{4, 1}, RtConfig{4, 2}, RtConfig{8, 1},
                                         RtConfig{8, 2}),
                         config_name);

/// Elementwise combination of every part of a stacked tensor (max, min).
template <class T, int R, int L, class Op>
Tensor<T, R - 1, L> reduce_parts(const Tensor<T, R, L>& x, const std::vector<int>& members, Op op) {
  Tensor<T, R - 1, L> r = part(x, members.at(0));
  for (std::size_t m = 1; m < members.size(); ++m) {
    Tensor<T, R - 1, L> p = part(x, members[m]);
    for (Index k = 0; k < r.size(); ++k) r.data()[k] = op(r.data()[k], p.data()[k]);
  }
  return r;
}

std::vector<int> reverse_perm(int n) {
  std::vector<int> perm;
  for (int i = n - 1; i >= 0; --i) perm.push_back(i);
  return perm;
}

// ---- reductions --------------------------------------------------------------------------

TEST_P(Collectives, PsumOfViewsExpressionsTensorsAndMaps) {
  F2 x = make<F2>(1, n(), 3);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        F1 owned = v;
        Eigen::TensorMap<F1> map(owned.data(), owned.dimension(0));
        Eigen::TensorMap<const F1> cmap(owned.data(), owned.dimension(0));
        return std::make_tuple(ctx.psum(v, "i"), ctx.psum(v * 2.f, "i"), ctx.psum(owned),
                               ctx.psum(map, {"i"}), ctx.psum(cmap), ctx.psum(v + v * v));
      },
      on_axis(rt()));
  auto [a, b, c, d, e, g] = f(x);
  const F1 s = group_sum(x, iota(n()));
  const F1 s2 = s * 2.f;
  F2 sq = x + x * x;
  const F1 s3 = group_sum(sq, iota(n()));
  EXPECT_TRUE(tensors_near(a, replicate(s, n())));
  EXPECT_TRUE(tensors_near(b, replicate(s2, n())));
  EXPECT_TRUE(tensors_near(c, replicate(s, n())));
  EXPECT_TRUE(tensors_near(d, replicate(s, n())));
  EXPECT_TRUE(tensors_near(e, replicate(s, n())));
  EXPECT_TRUE(tensors_near(g, replicate(s3, n())));
}

TEST_P(Collectives, PsumIsBitwiseEqualOnEveryDevice) {
  F2 x(n(), 64);
  for (Index k = 0; k < x.size(); ++k) x.data()[k] = 0.1f * static_cast<float>(k % 17) + 1.f / 3.f;
  auto f = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); }, on_axis(rt()));
  F2 y = f(x);
  for (Index p = 1; p < n(); ++p)
    for (Index k = 0; k < 64; ++k)
      ASSERT_EQ(std::memcmp(&y(p, k), &y(0, k), sizeof(float)), 0) << "device " << p << " elem " << k;
}

TEST_P(Collectives, ScalarCollectivesGiveScalars) {
  F2 x = make<F2>(0, n(), 1);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto) {
        const int idx = ctx.axis_index("i");
        return std::make_tuple(ctx.psum(1, "i"), ctx.psum(1), ctx.psum(2.5), ctx.psum(idx % 2 == 0),
                               ctx.pmean(idx), ctx.pmax(idx), ctx.pmin(-idx), ctx.pmean(1.5f),
                               ctx.pargmax(idx), ctx.pargmin(idx), ctx.pargmax(7),
                               ctx.pbroadcast(idx * 3, "i", ctx.axis_size() - 1),
                               ctx.ppermute(idx * 10, "i", ring(ctx.axis_size(), 1)),
                               ctx.pshuffle(idx, "i", reverse_perm(ctx.axis_size())));
      },
      on_axis(rt()));
  const int N = n();
  auto [a, b, c, d, e, mx, mn, fm, am, ai, at, bc, pp, sh] = f(x);
  auto col = [&](auto value_of) {
    using T = decltype(value_of(0));
    Tensor<T, 1> t(N);
    for (int p = 0; p < N; ++p) t(p) = value_of(p);
    return t;
  };
  EXPECT_TRUE(tensors_near(a, col([&](int) { return N; })));
  EXPECT_TRUE(tensors_near(b, col([&](int) { return N; })));
  EXPECT_TRUE(tensors_near(c, col([&](int) { return 2.5 * N; })));
  EXPECT_TRUE(tensors_near(d, col([&](int) { return static_cast<std::int32_t>((N + 1) / 2); })));
  EXPECT_TRUE(tensors_near(e, col([&](int) { return (N - 1) / 2.0; })));
  EXPECT_TRUE(tensors_near(mx, col([&](int) { return N - 1; })));
  EXPECT_TRUE(tensors_near(mn, col([&](int) { return -(N - 1); })));
  EXPECT_TRUE(tensors_near(fm, col([&](int) { return 1.5f; })));
  EXPECT_TRUE(tensors_near(am, col([&](int) { return static_cast<std::int32_t>(N - 1); })));
  EXPECT_TRUE(tensors_near(ai, col([&](int) { return static_cast<std::int32_t>(0); })));
  EXPECT_TRUE(tensors_near(at, col([&](int) { return static_cast<std::int32_t>(0); })));
  EXPECT_TRUE(tensors_near(bc, col([&](int) { return 3 * (N - 1); })));
  EXPECT_TRUE(tensors_near(pp, col([&](int p) { return ((p + N - 1) % N) * 10; })));
  EXPECT_TRUE(tensors_near(sh, col([&](int p) { return N - 1 - p; })));
}

TEST_P(Collectives, BoolPsumIsInt32AndIntegerPmeanIsDouble) {
  using B2 = Tensor<bool, 2>;
  using I2 = Tensor<std::int32_t, 2, ColMajor>;
  B2 xb = make<B2>(2, n(), 5);
  I2 xi = make<I2>(3, n(), 4);
  Tensor<std::int64_t, 2> xl = make<Tensor<std::int64_t, 2>>(4, n(), 3);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto b, auto i, auto l) {
        return std::make_tuple(ctx.psum(b, "i"), ctx.pmean(b, "i"), ctx.pmean(i, "i"),
                               ctx.psum(i, "i"), ctx.psum(l, "i"), ctx.pmean(l, "i"));
      },
      on_axis(rt()));
  auto [sb, mb, mi, si, sl, ml] = f(xb, xi, xl);

  Tensor<std::int32_t, 1> cnt(5);
  cnt.setZero();
  for (Index p = 0; p < n(); ++p)
    for (Index k = 0; k < 5; ++k) cnt(k) += xb(p, k) ? 1 : 0;
  EXPECT_TRUE(tensors_near(sb, replicate(cnt, n())));
  Tensor<double, 1> cntd = cnt.cast<double>() / static_cast<double>(n());
  EXPECT_TRUE(tensors_near(mb, replicate(cntd, n())));

  Tensor<std::int32_t, 1, ColMajor> isum = group_sum(xi, iota(n()));
  EXPECT_TRUE(tensors_near(si, replicate(isum, n())));
  Tensor<double, 1, ColMajor> imean = isum.cast<double>() / static_cast<double>(n());
  EXPECT_TRUE(tensors_near(mi, replicate(imean, n())));

  Tensor<std::int64_t, 1> lsum = group_sum(xl, iota(n()));
  EXPECT_TRUE(tensors_near(sl, replicate(lsum, n())));
  Tensor<double, 1> lmean = lsum.cast<double>() / static_cast<double>(n());
  EXPECT_TRUE(tensors_near(ml, replicate(lmean, n())));
}

TEST_P(Collectives, PmeanPmaxPmin) {
  F3 x = make<F3>(5, n(), 2, 3);
  Tensor<std::int32_t, 3, ColMajor> xi = make<Tensor<std::int32_t, 3, ColMajor>>(6, n(), 3, 2);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v, auto w) {
        return std::make_tuple(ctx.pmean(v, "i"), ctx.pmax(v, "i"), ctx.pmin(v), ctx.pmax(w),
                               ctx.pmin(w * 2, "i"), ctx.pmean(v * 3.f));
      },
      on_axis(rt()));
  auto [mean, mx, mn, wmx, wmn, mean3] = f(x, xi);
  const auto all = iota(n());
  F2 m = group_sum(x, all) / static_cast<float>(n());
  EXPECT_TRUE(tensors_near(mean, replicate(m, n())));
  F2 m3 = m * 3.f;
  EXPECT_TRUE(tensors_near(mean3, replicate(m3, n())));
  auto max_op = [](auto a, auto b) { return std::max(a, b); };
  auto min_op = [](auto a, auto b) { return std::min(a, b); };
  EXPECT_TRUE(tensors_near(mx, replicate(reduce_parts(x, all, max_op), n())));
  EXPECT_TRUE(tensors_near(mn, replicate(reduce_parts(x, all, min_op), n())));
  EXPECT_TRUE(tensors_near(wmx, replicate(reduce_parts(xi, all, max_op), n())));
  Tensor<std::int32_t, 3, ColMajor> xi2 = xi * 2;
  EXPECT_TRUE(tensors_near(wmn, replicate(reduce_parts(xi2, all, min_op), n())));
}

TEST_P(Collectives, DonatedReductionsReuseTheBufferAndKeepTheBits) {
  // 24 Ki floats (96 KiB) is above the split threshold, 100 below it. Values whose sum
  // depends on the order: the donated path must combine members in group order too, so its
  // bits equal the plain path's and the serial reference's.
  for (const Index len : {Index{24 * 1024}, Index{100}}) {
    F2 x(n(), len);
    for (Index p = 0; p < n(); ++p)
      for (Index k = 0; k < len; ++k)
        x(p, k) = (p % 2 == 0 ? 1e7f : -1e7f) * static_cast<float>(k % 3) + 0.1f * static_cast<float>(p + k % 7);
    Tensor<std::int32_t, 2> xi = make<Tensor<std::int32_t, 2>>(3, n(), len);
    auto f = pmap::pmap(
        [](pmap::Context& ctx, auto v, auto w) {
          F1 a = v, b = v, c = v, d = v;
          Tensor<std::int32_t, 1> e = w, i = w;
          const void* before[] = {a.data(), b.data(), c.data(), d.data(), i.data()};
          F1 sum = ctx.psum(std::move(a), "i");
          F1 mean = ctx.pmean(std::move(b), "i");
          F1 mx = ctx.pmax(std::move(c), "i");
          F1 mn = ctx.pmin(std::move(d), "i");
          Tensor<double, 1> imean = ctx.pmean(std::move(e), "i");  // int -> double: a new buffer
          Tensor<std::int32_t, 1> isum = ctx.psum(std::move(i), "i");
          const void* after[] = {sum.data(), mean.data(), mx.data(), mn.data(), isum.data()};
          int reused = 0;
          for (int k = 0; k < 5; ++k) reused += before[k] == after[k] ? 1 : 0;
          const bool emptied = a.size() == 0 && e.size() == 0;
          F1 plain = ctx.psum(v, "i");
          return std::make_tuple(sum, mean, mx, mn, imean, isum, plain, reused, emptied);
        },
        on_axis(rt()));
    auto [sum, mean, mx, mn, imean, isum, plain, reused, emptied] = f(x, xi);
    const auto all = iota(n());
    const F1 s = group_sum(x, all);
    EXPECT_TRUE(tensors_equal(sum, replicate(s, n()))) << len;
    EXPECT_TRUE(tensors_equal(plain, sum)) << len;
    F1 m = s / static_cast<float>(n());
    EXPECT_TRUE(tensors_equal(mean, replicate(m, n()))) << len;
    auto max_op = [](auto l, auto r) { return std::max(l, r); };
    auto min_op = [](auto l, auto r) { return std::min(l, r); };
    EXPECT_TRUE(tensors_equal(mx, replicate(reduce_parts(x, all, max_op), n()))) << len;
    EXPECT_TRUE(tensors_equal(mn, replicate(reduce_parts(x, all, min_op), n()))) << len;
    const Tensor<std::int32_t, 1> is = group_sum(xi, all);
    EXPECT_TRUE(tensors_equal(isum, replicate(is, n()))) << len;
    Tensor<double, 1> im = is.cast<double>() / static_cast<double>(n());
    EXPECT_TRUE(tensors_near(imean, replicate(im, n()))) << len;
    // A split reduction (several devices, large operand) writes into the donated buffer.
    const int expected = len > 100 && n() > 1 ? 5 : 0;
    for (Index p = 0; p < n(); ++p) {
      EXPECT_EQ(reused(p), expected) << "device " << p << ", " << len << " floats";
      EXPECT_TRUE(emptied(p)) << "device " << p;
    }
  }
}

TEST_P(Collectives, DonatedChainsRecycleTheirBuffers) {
  // 32 Ki floats (128 KiB) per device: large enough to be kept for the next result.
  const Index len = 32 * 1024;
  F2 x = make<F2>(2, n(), len);
  const auto shift = ring(n(), 1);
  const auto reverse = reverse_perm(n());
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, auto v) {
        const int N = ctx.axis_size();
        // The same chain twice: on views (every result a new buffer), then donating.
        F1 r1 = ctx.ppermute(v, "i", shift);
        F1 r2 = ctx.ppermute(r1, "i", shift);
        F1 r3 = ctx.pshuffle(r2, "i", reverse);
        F1 r4 = ctx.pbroadcast(r3, "i", N - 1);
        F1 r5 = ctx.all_to_all(r4, "i", 0, 0, pmap::tiled);
        F2 r6 = ctx.all_to_all(F2(r5.reshape(Eigen::array<Index, 2>{N, len / N})), "i", 0, 1);
        F1 a = v;
        const void* first = a.data();
        F1 d1 = ctx.ppermute(std::move(a), "i", shift);  // a's storage is kept
        F1 d2 = ctx.ppermute(std::move(d1), "i", shift);  // ... and receives this result
        const bool recycled = d2.data() == first;
        F1 d3 = ctx.pshuffle(std::move(d2), "i", reverse);
        F1 d4 = ctx.pbroadcast(std::move(d3), "i", N - 1);
        F1 d5 = ctx.all_to_all(std::move(d4), "i", 0, 0, pmap::tiled);
        F2 d6(N, len / N);
        d6 = d5.reshape(Eigen::array<Index, 2>{N, len / N});
        F2 d7 = ctx.all_to_all(std::move(d6), "i", 0, 1);
        const bool emptied = a.size() == 0 && d1.size() == 0 && d6.size() == 0;
        return std::make_tuple(r2, r5, d5, r6, d7, recycled, emptied);
      },
      on_axis(rt()));
  auto [r2, r5, d5, r6, d7, recycled, emptied] = f(x);
  // r2: every device holds the row of device p - 2.
  for (Index p = 0; p < n(); ++p) {
    const Index from = ((p - 2) % n() + n()) % n();
    F1 got = part(r2, p);
    EXPECT_TRUE(tensors_equal(got, part(x, from))) << "device " << p;
    EXPECT_TRUE(recycled(p)) << "device " << p;
    EXPECT_TRUE(emptied(p)) << "device " << p;
  }
  EXPECT_TRUE(tensors_equal(d5, r5));
  EXPECT_TRUE(tensors_equal(d7, r6));
}

TEST_P(Collectives, DonatedBuffersServeLaterResultsAndLaterCalls) {
  // Context::donate hands a tensor's storage back: the next results of the same type and
  // size take the donated buffers, newest first, also in the next call of the same function.
  const Index len = 32 * 1024;  // 128 KiB per device: large enough to be kept
  F2 x = make<F2>(3, n(), len);
  const auto shift = ring(n(), 1);
  int call = 0;
  std::vector<const void*> gathered(static_cast<std::size_t>(n()));
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, auto v) {
        const auto me = static_cast<std::size_t>(ctx.axis_index("i"));
        bool reused = true, emptied = true;
        if (call == 0) {
          F1 a = v, b = v;
          const void* pa = a.data();
          const void* pb = b.data();
          ctx.donate(std::move(a));
          ctx.donate(std::move(b));
          F1 small(16);
          small.setZero();
          ctx.donate(std::move(small));  // too small to keep: freed
          emptied = a.size() == 0 && b.size() == 0 && small.size() == 0;
          // Had a or b been freed, malloc would likely hand their memory to these.
          F1 decoy1(len), decoy2(len);
          F1 r1 = ctx.ppermute(v, "i", shift);
          F1 r2 = ctx.ppermute(v, "i", shift);
          reused = r1.data() == pb && r2.data() == pa;
          F1 g = ctx.all_gather(v, "i", 0, pmap::tiled);
          gathered[me] = g.data();
          ctx.donate(std::move(g));
          return std::make_tuple(r2, reused, emptied);
        }
        F1 decoy(ctx.axis_size() * len);  // takes that buffer's memory, had it been freed
        F1 g = ctx.all_gather(v, "i", 0, pmap::tiled);  // in the buffer donated last call
        reused = g.data() == gathered[me] && decoy.data() != gathered[me];
        F1 mine = g.slice(Eigen::array<Index, 1>{static_cast<Index>(me) * len},
                          Eigen::array<Index, 1>{len});
        return std::make_tuple(mine, reused, emptied);
      },
      on_axis(rt()));
  auto [shifted, reused0, emptied0] = f(x);
  call = 1;
  auto [own, reused1, emptied1] = f(x);
  for (Index p = 0; p < n(); ++p) {
    const Index from = ((p - 1) % n() + n()) % n();
    EXPECT_TRUE(tensors_equal(F1(part(shifted, p)), part(x, from))) << "device " << p;
    EXPECT_TRUE(tensors_equal(F1(part(own, p)), part(x, p))) << "device " << p;
    EXPECT_TRUE(reused0(p)) << "device " << p;
    EXPECT_TRUE(emptied0(p)) << "device " << p;
    EXPECT_TRUE(reused1(p)) << "device " << p;
  }
}

TEST_P(Collectives, LargeCollectivesAtUnalignedOffsetsAreExact) {
  // Results of 4 MiB and more are copied with streaming stores, in whole cache lines with
  // ordinary copies around them: rows, chunks and blocks here start at every kind of offset.
  const Index len = n() * (1048576 / n() + 5);  // > 4 MiB per device, divisible by n
  F2 x = make<F2>(4, n(), len);
  const auto shift = ring(n(), 1);
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, auto v) {
        return std::make_tuple(ctx.psum(v, "i"), ctx.ppermute(v, "i", shift),
                               ctx.all_to_all(v, "i", 0, 0, pmap::tiled),
                               // Every device's first block: a result of len floats.
                               ctx.all_gather(v.slice(Eigen::array<Index, 1>{0},
                                                      Eigen::array<Index, 1>{len / ctx.axis_size()}),
                                              "i", 0, pmap::tiled));
      },
      on_axis(rt()));
  auto [sum, shifted, exchanged, gathered] = f(x);
  const F1 s = group_sum(x, iota(n()));
  const Index block = len / n();
  for (Index p = 0; p < n(); ++p) {
    EXPECT_TRUE(tensors_near(F1(part(sum, p)), s)) << "device " << p;
    EXPECT_TRUE(tensors_equal(F1(part(shifted, p)), part(x, ((p - 1) % n() + n()) % n())))
        << "device " << p;
    F1 expect_exchanged(len), expect_gathered(len);
    for (Index k = 0; k < n(); ++k)
      for (Index j = 0; j < block; ++j) {
        expect_exchanged(k * block + j) = x(k, p * block + j);
        expect_gathered(k * block + j) = x(k, j);
      }
    EXPECT_TRUE(tensors_equal(F1(part(exchanged, p)), expect_exchanged)) << "device " << p;
    EXPECT_TRUE(tensors_equal(F1(part(gathered, p)), expect_gathered)) << "device " << p;
  }
}

TEST(StreamCopy, EveryOffsetAndLengthMatchesMemcpyAndStaysInBounds) {
  const std::size_t lengths[] = {0, 1, 15, 63, 64, 65, 127, 4095, 4096 + 17, (1u << 20) + 3};
  std::vector<unsigned char> src((1u << 20) + 256), dst(src.size() + 256);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
  for (std::size_t bytes : lengths)
    for (std::size_t from : {0, 1, 8, 33})
      for (std::size_t to : {0, 1, 16, 63}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        pmap::detail::stream_copy(dst.data() + 64 + to, src.data() + from, bytes);
        const std::size_t end = 64 + to + bytes;
        bool ok = std::memcmp(dst.data() + 64 + to, src.data() + from, bytes) == 0;
        for (std::size_t i = 0; i < 64 + to; ++i) ok = ok && dst[i] == 0xEE;
        for (std::size_t i = end; i < dst.size(); ++i) ok = ok && dst[i] == 0xEE;
        EXPECT_TRUE(ok) << bytes << " bytes from +" << from << " to +" << to;
      }
}

TEST_P(Collectives, SmallAndLargeCollectivesInterleavedWithSkewedDevices) {
  // Small collectives over the whole team read a copy and leave after one barrier, so a fast
  // device may already publish its next copy while a slow one still reads this one. Skew the
  // devices (a different one sleeps on each step) and interleave small ones with large (two
  // barriers, in place) and grouped ones (a subset of the team): every result must be exact.
  const int steps = 60;
  F2 x = make<F2>(4, n(), 4);
  auto f = pmap::pmap(
      [steps](pmap::Context& ctx, auto v) {
        const int me = ctx.axis_index("i");
        const int N = ctx.axis_size("i");
        int wrong = 0;
        F1 big(16 * 1024);
        for (int k = 0; k < steps; ++k) {
          if (k % N == me) std::this_thread::sleep_for(std::chrono::microseconds(200));
          F1 small(4);
          small.setConstant(static_cast<float>(me + k));
          const F1 s = ctx.psum(small, "i");
          const float want_small = static_cast<float>(N * (N - 1) / 2 + N * k);
          if (s(0) != want_small || s(3) != want_small) ++wrong;
          const int at = ctx.pshuffle(me, "i", [&] {
            std::vector<int> perm;
            for (int p = 0; p < N; ++p) perm.push_back((p + k) % N);
            return perm;
          }());
          if (at != (me + k) % N) ++wrong;
          if (k % 7 == 3) {
            big.setConstant(static_cast<float>(me + k));
            const F1 b = ctx.psum(big, "i");
            const float want = static_cast<float>(N * (N - 1) / 2 + N * k);
            if (b(0) != want || b(big.size() - 1) != want) ++wrong;
          }
          if (k % 5 == 1 && N % 2 == 0) {
            pmap::Groups pairs;
            for (int p = 0; p < N; p += 2) pairs.push_back({p, p + 1});
            const int pair_sum = ctx.psum(me, "i", pairs);
            if (pair_sum != (me / 2) * 4 + 1) ++wrong;
          }
        }
        // The argument itself, after all of that.
        return std::make_tuple(ctx.psum(v, "i"), wrong);
      },
      on_axis(rt()));
  auto [sum, wrong] = f(x);
  EXPECT_TRUE(tensors_near(sum, replicate(group_sum(x, iota(n())), n())));
  for (Index p = 0; p < n(); ++p) EXPECT_EQ(wrong(p), 0) << "device " << p;
}

TEST_P(Collectives, PargmaxPargminTakeSmallestIndexOnTies) {
  const int N = n();
  F2 x(N, 5);
  for (int p = 0; p < N; ++p) {
    x(p, 0) = 1.f;                         // all tie
    x(p, 1) = static_cast<float>(p);       // max last, min first
    x(p, 2) = -static_cast<float>(p);      // max first, min last
    x(p, 3) = static_cast<float>(p % 3);   // ties among several devices
    x(p, 4) = static_cast<float>((p * 5) % 7);
  }
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        return std::make_tuple(ctx.pargmax(v, "i"), ctx.pargmin(v, {"i"}), ctx.pargmax(v * -1.f));
      },
      on_axis(rt()));
  auto [amax, amin, aneg] = f(x);
  Tensor<std::int32_t, 1> rmax(5), rmin(5);
  for (Index k = 0; k < 5; ++k) {
    int bmax = 0, bmin = 0;
    for (int p = 1; p < N; ++p) {
      if (x(p, k) > x(bmax, k)) bmax = p;
      if (x(p, k) < x(bmin, k)) bmin = p;
    }
    rmax(k) = bmax;
    rmin(k) = bmin;
  }
  EXPECT_TRUE(tensors_near(amax, replicate(rmax, N)));
  EXPECT_TRUE(tensors_near(amin, replicate(rmin, N)));
  EXPECT_TRUE(tensors_near(aneg, replicate(rmin, N)));
}

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

// ---- axis_index_groups (SPEC 2.3, 8.5) -----------------------------------------------------

class Grouped : public RuntimeTest {
 protected:
  /// Equal-sized group sets: pairs, strided halves, reversed order inside groups.
  std::vector<pmap::Groups> equal_groups() const {
    const int N = n();
    pmap::Groups pairs, strided, reversed;
    for (int g = 0; g < N; g += 2) pairs.push_back({g, g + 1});
    strided.resize(2);
    for (int d = 0; d < N; ++d) strided[static_cast<std::size_t>(d % 2)].push_back(d);
    for (int g = 0; g < N; g += 4) reversed.push_back({g + 3, g + 2, g + 1, g});
    return {pairs, strided, reversed, {iota(N)}};
  }
  std::vector<pmap::Groups> unequal_groups() const {
    const int N = n();
    pmap::Groups a{{0}, {}}, b{{2, 0, 1}, {}};
    for (int d = 1; d < N; ++d) a[1].push_back(d);
    for (int d = 3; d < N; ++d) b[1].push_back(d);
    return {a, b};
  }
};
INSTANTIATE_TEST_SUITE_P(Runtimes, Grouped,
                         testing::Values(RtConfig{4, 1}, RtConfig{4, 2}, RtConfig{8, 1},
                                         RtConfig{8, 2}),
                         config_name);

TEST_P(Grouped, ReductionsOverEqualAndUnequalGroups) {
  const int N = n();
  F2 x = make<F2>(21, N, 3);
  auto sets = equal_groups();
  for (auto& g : unequal_groups()) sets.push_back(g);
  auto max_op = [](float a, float b) { return std::max(a, b); };
  auto min_op = [](float a, float b) { return std::min(a, b); };
  for (const auto& groups : sets) {
    auto f = pmap::pmap(
        [&groups](pmap::Context& ctx, auto v) {
          return std::make_tuple(ctx.psum(v, "i", groups), ctx.pmean(v, "i", groups),
                                 ctx.pmax(v, "i", groups), ctx.pmin(v, "i", groups),
                                 ctx.psum(1, "i", groups));
        },
        on_axis(rt()));
    auto [s, m, mx, mn, cnt] = f(x);
    std::vector<F1> es, em, emx, emn;
    Tensor<int, 1> ecnt(N);
    for (int p = 0; p < N; ++p) {
      const auto members = group_of(groups, N, p).first;
      const F1 sum = group_sum(x, members);
      es.push_back(sum);
      F1 mean = sum / static_cast<float>(members.size());
      em.push_back(mean);
      emx.push_back(reduce_parts(x, members, max_op));
      emn.push_back(reduce_parts(x, members, min_op));
      ecnt(p) = static_cast<int>(members.size());
    }
    EXPECT_TRUE(tensors_near(s, stack(es, 0))) << testing::PrintToString(groups);
    EXPECT_TRUE(tensors_near(m, stack(em, 0))) << testing::PrintToString(groups);
    EXPECT_TRUE(tensors_near(mx, stack(emx, 0))) << testing::PrintToString(groups);
    EXPECT_TRUE(tensors_near(mn, stack(emn, 0))) << testing::PrintToString(groups);
    EXPECT_TRUE(tensors_near(cnt, ecnt)) << testing::PrintToString(groups);
  }
}

TEST_P(Grouped, IntegerPmeanDividesByOwnGroupSize) {
  const int N = n();
  Tensor<int, 1> x(N);
  for (int p = 0; p < N; ++p) x(p) = p;
  for (const auto& groups : unequal_groups()) {
    auto f = pmap::pmap([&groups](pmap::Context& ctx, auto v) { return ctx.pmean(v, "i", groups); },
                        on_axis(rt()));
    Tensor<double, 1> y = f(x);
    for (int p = 0; p < N; ++p) {
      const auto members = group_of(groups, N, p).first;
      double sum = 0;
      for (int m : members) sum += m;
      EXPECT_DOUBLE_EQ(y(p), sum / static_cast<double>(members.size()))
          << "device " << p << " groups " << testing::PrintToString(groups);
    }
  }
}

TEST_P(Grouped, AllGatherPsumScatterAllToAllOverGroups) {
  const int N = n();
  for (const auto& groups : equal_groups()) {
    const int g = static_cast<int>(groups.front().size());
    F3 x = make<F3>(22, N, g, 3);        // untiled psum_scatter / all_to_all: shape[0] == g
    F3 xt = make<F3>(23, N, 2 * g, 2);   // tiled forms
    auto f = pmap::pmap(
        [&groups](pmap::Context& ctx, auto v, auto t) {
          return std::make_tuple(ctx.all_gather(v, "i", 1, groups),
                                 ctx.all_gather(v, "i", 0, pmap::tiled, groups),
                                 ctx.psum_scatter(v, "i", 0, groups),
                                 ctx.psum_scatter(t, "i", 0, pmap::tiled, groups),
                                 ctx.all_to_all(v, "i", 0, 1, groups),
                                 ctx.all_to_all(t, "i", 0, 1, pmap::tiled, groups));
        },
        on_axis(rt()));
    auto [ag, agt, ps, pst, a2a, a2at] = f(x, xt);
    const auto px = parts_of(x);
    const auto pt = parts_of(xt);
    std::vector<F3> eag;
    std::vector<F2> eagt, ea2a, ea2at, epst;
    std::vector<F1> eps;
    for (int p = 0; p < N; ++p) {
      const auto [members, pos] = group_of(groups, N, p);
      std::vector<F2> mine;
      for (int m : members) mine.push_back(px[static_cast<std::size_t>(m)]);
      eag.push_back(stack(mine, 1));
      eagt.push_back(concat(mine, 0));
      const F2 s = group_sum(x, members);
      eps.push_back(s.chip(pos, 0));
      const F2 st = group_sum(xt, members);
      epst.push_back(chunk(st, 0, pos, g));
      ea2a.push_back(all_to_all_ref(px, members, pos, 0, 1));
      ea2at.push_back(all_to_all_tiled_ref(pt, members, pos, 0, 1));
    }
    const std::string name = testing::PrintToString(groups);
    EXPECT_TRUE(tensors_near(ag, stack(eag, 0))) << name;
    EXPECT_TRUE(tensors_near(agt, stack(eagt, 0))) << name;
    EXPECT_TRUE(tensors_near(ps, stack(eps, 0))) << name;
    EXPECT_TRUE(tensors_near(pst, stack(epst, 0))) << name;
    EXPECT_TRUE(tensors_near(a2a, stack(ea2a, 0))) << name;
    EXPECT_TRUE(tensors_near(a2at, stack(ea2at, 0))) << name;
  }
}

TEST_P(Grouped, UnequalGroupsAreRejectedByGatherScatterAllToAll) {
  const int N = n();
  F2 x = make<F2>(24, N, 2 * N);
  for (const auto& groups : unequal_groups()) {
    const std::string name = testing::PrintToString(groups);
    auto run = [&](auto op) {
      auto f = pmap::pmap([&](pmap::Context& ctx, auto v) { return op(ctx, v); }, on_axis(rt()));
      (void)catch_message<pmap::ValueError>([&] { (void)f(x); });
    };
    run([&](pmap::Context& ctx, auto v) { return ctx.all_gather(v, "i", 0, groups); });
    run([&](pmap::Context& ctx, auto v) { return ctx.all_gather(v, "i", 0, pmap::tiled, groups); });
    run([&](pmap::Context& ctx, auto v) { return ctx.psum_scatter(v, "i", 0, pmap::tiled, groups); });
    run([&](pmap::Context& ctx, auto v) { return ctx.all_to_all(v, "i", 0, 0, pmap::tiled, groups); });
    run([&](pmap::Context& ctx, auto v) { return ctx.psum_scatter(v, "i", 0, groups); });
    run([&](pmap::Context& ctx, auto v) { return ctx.all_to_all(v, "i", 0, 0, groups); });
    if (HasFailure()) ADD_FAILURE() << "groups " << name;
  }
  // The runtime still works.
  auto h = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); }, on_axis(rt()));
  EXPECT_TRUE(tensors_near(h(x), replicate(group_sum(x, iota(N)), N)));
}

TEST_P(Grouped, GroupsThatDoNotCoverEveryIndexOnceAreRejected) {
  const int N = n();
  F2 x = make<F2>(26, N, 2);
  const std::string cover = "axis_index_groups must cover all indices exactly once";
  // Unequal sizes are fine for psum, so only the cover rule applies.
  pmap::Groups missing{{0, 1}}, dup{{0, 1}}, out{{0, 1}, {}}, neg{{-1}};
  for (int d = 2; d < N - 1; ++d) missing[0].push_back(d);
  for (int d = 1; d < N; ++d) dup.push_back({d});
  for (int d = 2; d <= N; ++d) out[1].push_back(d);
  for (int d = 0; d < N; ++d) neg.push_back({d});
  for (const auto& groups : {missing, dup, out, neg}) {
    auto f = pmap::pmap([&](pmap::Context& ctx, auto v) { return ctx.psum(v, "i", groups); }, on_axis(rt()));
    expect_throw_msg<pmap::ValueError>([&] { (void)f(x); }, cover);
  }
  // Equal-sized but invalid groups for the collectives that also need equal sizes.
  pmap::Groups few, dup_eq, out_eq, neg_eq;
  for (int d = 0; d < N; d += 2) {
    dup_eq.push_back({d, d + 1});
    out_eq.push_back({d, d + 1});
    neg_eq.push_back({d, d + 1});
  }
  few = {dup_eq.front()};
  dup_eq[1][0] = 1;
  out_eq.back()[1] = N;
  neg_eq[0][0] = -1;
  for (const auto& groups : {few, dup_eq, out_eq, neg_eq}) {
    auto g = pmap::pmap(
        [&](pmap::Context& ctx, auto v) { return ctx.all_gather(v, "i", 0, groups); }, on_axis(rt()));
    expect_throw_msg<pmap::ValueError>([&] { (void)g(x); }, cover);
  }
  auto h = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); }, on_axis(rt()));
  EXPECT_TRUE(tensors_near(h(x), replicate(group_sum(x, iota(N)), N)));
}

// ---- collective argument errors (SPEC 5) ---------------------------------------------------

class ArgumentErrors : public RuntimeTest {
 protected:
  /// Runs op(ctx, v) on every device over per-device inputs of the given shape; it must
  /// fail with a ValueError (deriving from pmap::Error) with exactly `message`.
  template <class Op>
  void expect_error(std::array<Index, 2> shape, Op op, const std::string& message) {
    F3 x = make<F3>(27, n(), shape[0], shape[1]);
    auto f = pmap::pmap([&](pmap::Context& ctx, auto v) { return op(ctx, v); }, on_axis(rt()));
    try {
      (void)f(x);
      ADD_FAILURE() << "nothing thrown, expected \"" << message << "\"";
    } catch (const pmap::ValueError& e) {
      EXPECT_EQ(std::string(e.what()), message);
      EXPECT_NE(dynamic_cast<const pmap::Error*>(&e), nullptr);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "expected ValueError \"" << message << "\", got " << typeid(e).name()
                    << " \"" << e.what() << "\"";
    }
  }
  template <class Op>
  void expect_value_error(Op op) {
    F3 x = make<F3>(28, n(), 2, 2);
    auto f = pmap::pmap([&](pmap::Context& ctx, auto v) { return op(ctx, v); }, on_axis(rt()));
    (void)catch_message<pmap::ValueError>([&] { (void)f(x); });
  }
  void expect_healthy() {
    F2 x = make<F2>(29, n(), 3);
    auto f = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); }, on_axis(rt()));
    EXPECT_TRUE(tensors_near(f(x), replicate(group_sum(x, iota(n())), n())));
  }
};
INSTANTIATE_TEST_SUITE_P(Runtimes, ArgumentErrors,
                         testing::Values(RtConfig{4, 1}, RtConfig{4, 2}), config_name);

TEST_P(ArgumentErrors, PpermuteDuplicateSourcesOrDestinations) {
  expect_error({2, 2}, [](pmap::Context& ctx, auto v) { return ctx.ppermute(v, "i", Perm{{0, 1}, {0, 2}}); },
               "ppermute sources and destinations must be unique, got ((0, 1), (0, 2)).");
  expect_error({2, 2}, [](pmap::Context& ctx, auto v) { return ctx.ppermute(v, "i", Perm{{0, 1}, {2, 1}, {3, 3}}); },
               "ppermute sources and destinations must be unique, got ((0, 1), (2, 1), (3, 3)).");
  expect_healthy();
}

TEST_P(ArgumentErrors, PpermuteIndicesOutsideTheAxisAreValueErrors) {
  expect_value_error([](pmap::Context& ctx, auto v) { return ctx.ppermute(v, "i", Perm{{0, 4}}); });
  expect_value_error([](pmap::Context& ctx, auto v) { return ctx.ppermute(v, "i", Perm{{-1, 0}}); });
  expect_value_error([](pmap::Context& ctx, auto v) { return ctx.pbroadcast(v, "i", 4); });
  expect_value_error([](pmap::Context& ctx, auto v) { return ctx.pbroadcast(v, "i", -1); });
  expect_healthy();
}

TEST_P(ArgumentErrors, PshuffleNotAPermutation) {
  expect_error({2, 2}, [](pmap::Context& ctx, auto v) { return ctx.pshuffle(v, "i", std::vector<int>{0, 0, 1, 2}); },
               "`perm` does not represent a permutation: [0, 0, 1, 2]");
  expect_error({2, 2}, [](pmap::Context& ctx, auto v) { return ctx.pshuffle(v, "i", std::vector<int>{1, 2}); },
               "`perm` does not represent a permutation: [1, 2]");
  expect_healthy();
}

TEST_P(ArgumentErrors, AllToAllSizes) {
  expect_error({3, 2}, [](pmap::Context& ctx, auto v) { return ctx.all_to_all(v, "i", 0, 1); },
               "all_to_all requires the size of the mapped axis i to equal x.shape[split_axis], "
               "but they are 4 and 3 respectively.");
  expect_error({2, 6}, [](pmap::Context& ctx, auto v) { return ctx.all_to_all(v, "i", -1, 0, pmap::tiled); },
               "The size of all_to_all split_axis (6) has to be divisible by the size of the "
               "named axis i (4)");
  expect_healthy();
}

TEST_P(ArgumentErrors, PsumScatterSizes) {
  expect_error({3, 2}, [](pmap::Context& ctx, auto v) { return ctx.psum_scatter(v, "i", 0); },
               "reduce_scatter operand scatter dimension size 3 must match shard count 4");
  expect_error({2, 6}, [](pmap::Context& ctx, auto v) { return ctx.psum_scatter(v, "i", 1, pmap::tiled); },
               "tiled reduce_scatter operand scatter dimension size 6 must be divisible by "
               "shard_count 4");
  expect_healthy();
}

TEST_P(ArgumentErrors, AxesOutOfBounds) {
  // all_gather untiled canonicalises against rank + 1, tiled against rank.
  expect_error({2, 2}, [](pmap::Context& ctx, auto v) { return ctx.all_gather(v, "i", 3); },
               "axis 3 is out of bounds for array of dimension 3");
  expect_error({2, 2}, [](pmap::Context& ctx, auto v) { return ctx.all_gather(v, "i", -4); },
               "axis -4 is out of bounds for array of dimension 3");
  expect_error({2, 2}, [](pmap::Context& ctx, auto v) { return ctx.all_gather(v, "i", 2, pmap::tiled); },
               "axis 2 is out of bounds for array of dimension 2");
  expect_error({2, 2}, [](pmap::Context& ctx, auto v) { return ctx.all_gather(v, "i", -3, pmap::tiled); },
               "axis -3 is out of bounds for array of dimension 2");
  expect_error({4, 4}, [](pmap::Context& ctx, auto v) { return ctx.psum_scatter(v, "i", 2); },
               "axis 2 is out of bounds for array of dimension 2");
  expect_error({4, 4}, [](pmap::Context& ctx, auto v) { return ctx.psum_scatter(v, "i", -3, pmap::tiled); },
               "axis -3 is out of bounds for array of dimension 2");
  expect_error({4, 4}, [](pmap::Context& ctx, auto v) { return ctx.all_to_all(v, "i", 2, 0); },
               "axis 2 is out of bounds for array of dimension 2");
  expect_error({4, 4}, [](pmap::Context& ctx, auto v) { return ctx.all_to_all(v, "i", 0, -3); },
               "axis -3 is out of bounds for array of dimension 2");
  expect_error({4, 4}, [](pmap::Context& ctx, auto v) { return ctx.all_to_all(v, "i", 0, 2, pmap::tiled); },
               "axis 2 is out of bounds for array of dimension 2");
  expect_healthy();
}

// ---- JAX's documented examples -------------------------------------------------------------

class JaxExamples : public RuntimeTest {};
INSTANTIATE_TEST_SUITE_P(Runtimes, JaxExamples, testing::Values(RtConfig{4, 1}, RtConfig{4, 2}),
                         config_name);

TEST_P(JaxExamples, PsumNormaliseGroupsPmean) {
  F1 x(4);
  x.setValues({0.f, 1.f, 2.f, 3.f});
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        return std::make_tuple(ctx.psum(v, "i"), pmap::eval(v / ctx.psum(v, "i")),
                               ctx.psum(v, "i", pmap::Groups{{0, 1}, {2, 3}}), ctx.pmean(v, "i"));
      },
      on_axis(rt()));
  auto [s, norm, grouped, mean] = f(x);
  F1 es(4), en(4), eg(4), em(4);
  es.setValues({6.f, 6.f, 6.f, 6.f});
  en.setValues({0.f, 1.f / 6.f, 2.f / 6.f, 3.f / 6.f});
  eg.setValues({1.f, 1.f, 5.f, 5.f});
  em.setValues({1.5f, 1.5f, 1.5f, 1.5f});
  EXPECT_TRUE(tensors_near(s, es));
  EXPECT_TRUE(tensors_near(norm, en));
  EXPECT_TRUE(tensors_near(grouped, eg));
  EXPECT_TRUE(tensors_near(mean, em));
}

TEST_P(JaxExamples, RotationPpermuteRollsRowsByOne) {
  F2 x(4, 3);
  for (Index i = 0; i < 4; ++i)
    for (Index j = 0; j < 3; ++j) x(i, j) = static_cast<float>(10 * i + j);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) { return ctx.ppermute(v, "i", Perm{{0, 1}, {1, 2}, {2, 3}, {3, 0}}); },
      on_axis(rt()));
  F2 y = f(x);
  F2 rolled(4, 3);
  for (Index i = 0; i < 4; ++i) rolled.chip(i, 0) = x.chip((i + 3) % 4, 0);
  EXPECT_TRUE(tensors_near(y, rolled));
}

// ---- devices outnumbering threads ----------------------------------------------------------

TEST(ManyDevices, SixteenDevicesOnOneThreadThroughAThousandPsums) {
  pmap::Runtime rt({.num_devices = 16, .num_threads = 1});
  F2 x = make<F2>(30, 16, 2);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        long long total = 0;
        F1 acc(v.dimension(0));
        acc.setZero();
        for (int k = 0; k < 1000; ++k) {
          if (k % 2 == 0) {
            acc = acc + ctx.psum(v, "i");
          } else {
            total += ctx.psum(ctx.axis_index() + k, "i");
          }
        }
        return std::make_tuple(total, acc);
      },
      on_axis(rt));
  auto [total, acc] = f(x);
  long long expected = 0;
  for (int k = 1; k < 1000; k += 2) expected += 120 + 16LL * k;
  const F1 s = group_sum(x, iota(16));
  F1 eacc = s * 500.f;
  for (Index p = 0; p < 16; ++p) EXPECT_EQ(total(p), expected) << "device " << p;
  EXPECT_TRUE(tensors_near(acc, replicate(eacc, 16)));
}

// ---- Rule 30 with a halo exchange ----------------------------------------------------------

using I1 = Tensor<std::int32_t, 1>;
using I2 = Tensor<std::int32_t, 2>;

I1 rule30_serial(I1 cells, int steps) {
  const Index size = cells.dimension(0);
  for (int t = 0; t < steps; ++t) {
    I1 next(size);
    for (Index k = 0; k < size; ++k) {
      const int l = cells((k + size - 1) % size), c = cells(k), r = cells((k + 1) % size);
      next(k) = l ^ (c | r);
    }
    cells = next;
  }
  return cells;
}

struct Rule30Config {
  int devices;  // axis size
  int threads;
};

std::string rule30_name(const testing::TestParamInfo<Rule30Config>& param_info) {
  return "n" + std::to_string(param_info.param.devices) + "t" +
         std::to_string(param_info.param.threads);
}

class Rule30 : public testing::TestWithParam<Rule30Config> {};
INSTANTIATE_TEST_SUITE_P(Sizes, Rule30,
                         testing::Values(Rule30Config{2, 1}, Rule30Config{2, 2}, Rule30Config{4, 1},
                                         Rule30Config{4, 2}, Rule30Config{5, 1}, Rule30Config{5, 2},
                                         Rule30Config{8, 1}, Rule30Config{8, 2}),
                         rule30_name);

TEST_P(Rule30, HaloExchangeMatchesSerialSimulation) {
  const int n = GetParam().devices;
  constexpr Index width = 6;
  constexpr int steps = 40;
  pmap::Runtime rt({.num_devices = 8, .num_threads = GetParam().threads});
  I1 initial(n * width);
  initial.setZero();
  initial(n * width / 2) = 1;
  initial(1) = 1;
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto chunk_view) {
        const int size = ctx.axis_size("i");
        const auto to_right = ring(size, 1);
        const auto to_left = ring(size, -1);
        I1 s = chunk_view;
        const Index w = s.dimension(0);
        for (int t = 0; t < steps; ++t) {
          // Scalar halo from the left neighbour, a one-cell slice expression from the right.
          const std::int32_t left = ctx.ppermute(s(w - 1), "i", to_right);
          const I1 right = ctx.ppermute(s.slice(std::array<Index, 1>{0}, std::array<Index, 1>{1}),
                                        "i", to_left);
          I1 next(w);
          for (Index k = 0; k < w; ++k) {
            const int l = k == 0 ? left : s(k - 1);
            const int r = k == w - 1 ? right(0) : s(k + 1);
            next(k) = l ^ (s(k) | r);
          }
          s = next;
        }
        return s;
      },
      on_axis(rt));
  I2 x = initial.reshape(std::array<Index, 2>{n, width});
  I2 y = f(x);
  I1 serial = rule30_serial(initial, steps);
  I1 flat = y.reshape(std::array<Index, 1>{n * width});
  EXPECT_TRUE(tensors_near(flat, serial));
}

}  // namespace
