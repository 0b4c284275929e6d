/// @file test_collective_rules.cpp
/// @brief axis_index_groups (SPEC 2.3, 8.5), the argument errors of SPEC 5, JAX's
/// documented examples, devices outnumbering threads through a thousand collectives, and a
/// halo-exchange automaton against its serial simulation.

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
