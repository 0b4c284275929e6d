/// @file test_collectives.cpp
/// @brief The reductions of SPEC 2.3 with JAX semantics (psum, pmean, pmax, pmin, pargmax,
/// pargmin) on 1, 2, 4 and 8 devices and more devices than threads: views, expressions,
/// scalars, dtypes, donation, large and unaligned buffers, skewed devices. The data movers
/// are in test_data_movers.cpp, groups, argument errors and whole programs in
/// test_collective_rules.cpp.

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

}  // namespace
