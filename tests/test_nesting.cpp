/// @file test_nesting.cpp
/// @brief Nested pmap (SPEC 3.5): a Mapped called inside a kernel maps an inner axis;
/// collectives over the inner name, the outer name and both; flattened axis queries; E7
/// counts outer x inner logical devices.

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <typeinfo>
#include <vector>

#include "collective_util.hpp"

namespace {

using namespace coll_test;

using F1 = Tensor<float, 1>;
using F2 = Tensor<float, 2>;
using F3 = Tensor<float, 3>;

/// Outer size A, inner size B, worker threads of an 8-device runtime.
struct GridConfig {
  int outer;
  int inner;
  int threads;
};

std::string grid_name(const testing::TestParamInfo<GridConfig>& param_info) {
  return "a" + std::to_string(param_info.param.outer) + "b" +
         std::to_string(param_info.param.inner) + "t" + std::to_string(param_info.param.threads);
}

class Nesting : public testing::TestWithParam<GridConfig> {
 protected:
  void SetUp() override {
    rt_ = std::make_unique<pmap::Runtime>(
        pmap::RuntimeConfig{.num_devices = 8, .num_threads = GetParam().threads});
  }
  pmap::Runtime& rt() { return *rt_; }
  int A() const { return GetParam().outer; }
  int B() const { return GetParam().inner; }

  std::unique_ptr<pmap::Runtime> rt_;
};
INSTANTIATE_TEST_SUITE_P(
    Grids, Nesting,
    testing::Values(GridConfig{1, 1, 1}, GridConfig{2, 2, 1}, GridConfig{2, 2, 2},
                    GridConfig{2, 4, 1}, GridConfig{2, 4, 2}, GridConfig{4, 2, 1},
                    GridConfig{4, 2, 2}, GridConfig{1, 8, 2}, GridConfig{8, 1, 2},
                    GridConfig{2, 3, 2}, GridConfig{3, 2, 1}),
    grid_name);

/// Sums over one axis (0 = outer, 1 = inner) of a (A, B, k) tensor, broadcast back.
F3 sum_over(const F3& x, int axis) {
  F3 out(x.dimensions());
  for (Index i = 0; i < x.dimension(0); ++i)
    for (Index j = 0; j < x.dimension(1); ++j)
      for (Index k = 0; k < x.dimension(2); ++k) {
        float s = 0;
        for (Index m = 0; m < x.dimension(axis); ++m) s += axis == 0 ? x(m, j, k) : x(i, m, k);
        out(i, j, k) = s;
      }
  return out;
}

TEST_P(Nesting, AxisQueriesOverInnerOuterAndBoth) {
  F3 x = make<F3>(1, A(), B(), 2);
  pmap::Runtime& runtime = rt();
  auto outer = pmap::pmap(
      [&runtime](pmap::Context&, auto xi) {
        auto inner = pmap::pmap(
            [](pmap::Context& ctx, auto) {
              return std::make_tuple(ctx.axis_index(), ctx.axis_index("i"), ctx.axis_index("j"),
                                     ctx.axis_index({"i", "j"}), ctx.axis_index({"j", "i"}),
                                     ctx.axis_size(), ctx.axis_size("i"), ctx.axis_size({"i", "j"}),
                                     ctx.device().id);
            },
            on_axis(runtime, "j"));
        return inner(xi);
      },
      on_axis(rt(), "i"));
  auto [inner_idx, i_idx, j_idx, ij, ji, inner_size, i_size, ij_size, dev] = outer(x);
  std::set<int> devices;
  for (int i = 0; i < A(); ++i)
    for (int j = 0; j < B(); ++j) {
      EXPECT_EQ(inner_idx(i, j), j);
      EXPECT_EQ(i_idx(i, j), i);
      EXPECT_EQ(j_idx(i, j), j);
      EXPECT_EQ(ij(i, j), i * B() + j);
      EXPECT_EQ(ji(i, j), j * A() + i);
      EXPECT_EQ(inner_size(i, j), B());
      EXPECT_EQ(i_size(i, j), A());
      EXPECT_EQ(ij_size(i, j), A() * B());
      EXPECT_GE(dev(i, j), 0);
      EXPECT_LT(dev(i, j), 8);
      devices.insert(dev(i, j));
    }
  EXPECT_EQ(static_cast<int>(devices.size()), A() * B()) << "A*B distinct logical devices";
}

TEST_P(Nesting, ReductionsOverInnerOuterAndBothNames) {
  F3 x = make<F3>(2, A(), B(), 3);
  pmap::Runtime& runtime = rt();
  auto outer = pmap::pmap(
      [&runtime](pmap::Context&, auto xi) {
        auto inner = pmap::pmap(
            [](pmap::Context& ctx, auto v) {
              return std::make_tuple(ctx.psum(v, "j"), ctx.psum(v), ctx.psum(v, "i"),
                                     ctx.psum(v, {"i", "j"}), ctx.pmean(v, {"j", "i"}),
                                     ctx.pmax(v, {"i", "j"}), ctx.psum(1, {"i", "j"}));
            },
            on_axis(runtime, "j"));
        return inner(xi);
      },
      on_axis(rt(), "i"));
  auto [sj, sinner, si, sij, mij, maxij, count] = outer(x);
  const F3 ej = sum_over(x, 1);
  const F3 ei = sum_over(x, 0);
  const F3 eij = sum_over(ej, 0);
  EXPECT_TRUE(tensors_near(sj, ej));
  EXPECT_TRUE(tensors_near(sinner, ej));
  EXPECT_TRUE(tensors_near(si, ei));
  EXPECT_TRUE(tensors_near(sij, eij));
  F3 emean = eij / static_cast<float>(A() * B());
  EXPECT_TRUE(tensors_near(mij, emean));
  F3 emax(x.dimensions());
  for (Index k = 0; k < 3; ++k) {
    float m = x(0, 0, k);
    for (Index i = 0; i < A(); ++i)
      for (Index j = 0; j < B(); ++j) m = std::max(m, x(i, j, k));
    for (Index i = 0; i < A(); ++i)
      for (Index j = 0; j < B(); ++j) emax(i, j, k) = m;
  }
  EXPECT_TRUE(tensors_near(maxij, emax));
  for (Index i = 0; i < A(); ++i)
    for (Index j = 0; j < B(); ++j) EXPECT_EQ(count(i, j), A() * B());
}

TEST_P(Nesting, GatherAndPermuteOverInnerOuterAndBoth) {
  const int a = A(), b = B();
  F3 x = make<F3>(3, a, b, 2);
  pmap::Runtime& runtime = rt();
  auto outer = pmap::pmap(
      [&runtime](pmap::Context&, auto xi) {
        auto inner = pmap::pmap(
            [](pmap::Context& ctx, auto v) {
              return std::make_tuple(ctx.all_gather(v, {"i", "j"}), ctx.all_gather(v, "i"),
                                     ctx.ppermute(v, "i", ring(ctx.axis_size("i"), 1)),
                                     ctx.ppermute(v, {"i", "j"}, ring(ctx.axis_size({"i", "j"}), 1)),
                                     ctx.pbroadcast(v, "j", ctx.axis_size("j") - 1));
            },
            on_axis(runtime, "j"));
        return inner(xi);
      },
      on_axis(rt(), "i"));
  auto [gij, gi, pi, pij, bj] = outer(x);
  // gij(i, j) is (A*B, 2): every device, flattened row-major over (i, j).
  for (int i = 0; i < a; ++i)
    for (int j = 0; j < b; ++j)
      for (int k = 0; k < 2; ++k) {
        for (int f = 0; f < a * b; ++f) ASSERT_EQ(gij(i, j, f, k), x(f / b, f % b, k));
        for (int m = 0; m < a; ++m) ASSERT_EQ(gi(i, j, m, k), x(m, j, k));
        EXPECT_EQ(pi(i, j, k), x((i + a - 1) % a, j, k));
        const int src = (i * b + j + a * b - 1) % (a * b);
        EXPECT_EQ(pij(i, j, k), x(src / b, src % b, k));
        EXPECT_EQ(bj(i, j, k), x(i, b - 1, k));
      }
}

TEST_P(Nesting, GroupsOverTheFlattenedAxis) {
  const int a = A(), b = B();
  if ((a * b) % 2 != 0) GTEST_SKIP() << "needs an even number of devices";
  F3 x = make<F3>(4, a, b, 2);
  pmap::Groups halves(2);
  for (int f = 0; f < a * b; ++f) halves[static_cast<std::size_t>(f % 2)].push_back(f);
  pmap::Runtime& runtime = rt();
  auto outer = pmap::pmap(
      [&runtime, &halves](pmap::Context&, auto xi) {
        auto inner = pmap::pmap(
            [&halves](pmap::Context& ctx, auto v) { return ctx.psum(v, {"i", "j"}, halves); },
            on_axis(runtime, "j"));
        return inner(xi);
      },
      on_axis(rt(), "i"));
  F3 y = outer(x);
  for (int i = 0; i < a; ++i)
    for (int j = 0; j < b; ++j)
      for (int k = 0; k < 2; ++k) {
        float s = 0;
        for (int f = (i * b + j) % 2; f < a * b; f += 2) s += x(f / b, f % b, k);
        EXPECT_EQ(y(i, j, k), s) << i << "," << j << "," << k;
      }
}

TEST_P(Nesting, OuterCollectivesAroundTheInnerCall) {
  F3 x = make<F3>(5, A(), B(), 3);
  pmap::Runtime& runtime = rt();
  auto outer = pmap::pmap(
      [&runtime](pmap::Context& octx, auto xi) {
        auto inner = pmap::pmap(
            [](pmap::Context& ctx, auto v) { return ctx.psum(v, "j"); }, on_axis(runtime, "j"));
        F2 before = octx.psum(xi, "i");                    // (B, 3), sum over i
        F2 within = inner(xi);                              // (B, 3), sum over j
        return std::make_tuple(pmap::eval(before + within), octx.psum(within, "i"),
                               octx.axis_index(), octx.axis_size("i"));
      },
      on_axis(rt(), "i"));
  auto [mixed, total, oi, os] = outer(x);
  const F3 ei = sum_over(x, 0);
  const F3 ej = sum_over(x, 1);
  F3 emixed = ei + ej;
  EXPECT_TRUE(tensors_near(mixed, emixed));
  EXPECT_TRUE(tensors_near(total, sum_over(ej, 0)));
  for (int i = 0; i < A(); ++i) {
    EXPECT_EQ(oi(i), i);
    EXPECT_EQ(os(i), A());
  }
}

TEST_P(Nesting, RepeatedNestedCallsOnOneOuterMapped) {
  pmap::Runtime& runtime = rt();
  auto inner = pmap::pmap(
      [](pmap::Context& ctx, auto v) { return ctx.psum(v, {"i", "j"}); }, on_axis(runtime, "j"));
  auto outer = pmap::pmap([&inner](pmap::Context&, auto xi) { return inner(xi); }, on_axis(rt(), "i"));
  for (int call = 0; call < 20; ++call) {
    F3 x = make<F3>(call, A(), B(), 2);
    F3 y = outer(x);
    ASSERT_TRUE(tensors_near(y, sum_over(sum_over(x, 1), 0))) << "call " << call;
  }
}

// ---- three levels -------------------------------------------------------------------------

TEST(NestingDeep, ThreeLevelsFlattenRowMajor) {
  pmap::Runtime rt({.num_devices = 8, .num_threads = 2});
  Tensor<float, 4> x = make<Tensor<float, 4>>(6, 2, 2, 2, 1);
  pmap::Runtime* r = &rt;
  auto outer = pmap::pmap(
      [r](pmap::Context&, auto xi) {
        auto middle = pmap::pmap(
            [r](pmap::Context&, auto xij) {
              auto inner = pmap::pmap(
                  [](pmap::Context& ctx, auto v) {
                    return std::make_tuple(ctx.axis_index({"i", "j", "k"}), ctx.axis_index({"k", "i"}),
                                           ctx.psum(v, {"i", "k"}));
                  },
                  on_axis(*r, "k"));
              return inner(xij);
            },
            on_axis(*r, "j"));
        return middle(xi);
      },
      on_axis(rt, "i"));
  auto [ijk, ki, s] = outer(x);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 2; ++k) {
        EXPECT_EQ(ijk(i, j, k), i * 4 + j * 2 + k);
        EXPECT_EQ(ki(i, j, k), k * 2 + i);
        float e = 0;
        for (int i2 = 0; i2 < 2; ++i2)
          for (int k2 = 0; k2 < 2; ++k2) e += x(i2, j, k2, 0);
        EXPECT_EQ(s(i, j, k, 0), e);
      }
}

// ---- E7 and E11 inside nesting ---------------------------------------------------------------

TEST(NestingErrors, E7CountsOuterTimesInnerLogicalDevices) {
  for (int threads : {1, 2}) {
    pmap::Runtime rt({.num_devices = 8, .num_threads = threads});
    pmap::Runtime* r = &rt;
    auto outer = pmap::pmap(
        [r](pmap::Context&, auto xi) {
          auto inner = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "j"); },
                                  on_axis(*r, "j"));
          return inner(xi);
        },
        on_axis(rt, "i"));
    F3 x44 = make<F3>(7, 4, 4, 2);
    expect_throw_msg<pmap::ValueError>(
        [&] { (void)outer(x44); },
        "compiling computation that requires 16 logical devices, but only 8 devices are "
        "available (num_replicas=16)");
    F3 x33 = make<F3>(8, 3, 3, 2);
    expect_throw_msg<pmap::ValueError>(
        [&] { (void)outer(x33); },
        "compiling computation that requires 9 logical devices, but only 8 devices are "
        "available (num_replicas=9)");
    // The runtime still serves nested calls that fit.
    F3 x24 = make<F3>(9, 2, 4, 2);
    EXPECT_TRUE(tensors_near(outer(x24), sum_over(x24, 1))) << threads << " threads";
  }
}

TEST(NestingErrors, UnboundNameInsideTheInnerKernel) {
  pmap::Runtime rt({.num_devices = 8, .num_threads = 2});
  pmap::Runtime* r = &rt;
  auto outer = pmap::pmap(
      [r](pmap::Context&, auto xi) {
        auto inner = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, {"i", "k"}); },
                                on_axis(*r, "j"));
        return inner(xi);
      },
      on_axis(rt, "i"));
  F3 x = make<F3>(10, 2, 4, 2);
  expect_throw_msg<pmap::NameError>([&] { (void)outer(x); }, "unbound axis name: k");
  // The same runtime serves a correct nested call afterwards.
  auto ok = pmap::pmap(
      [r](pmap::Context&, auto xi) {
        auto inner = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); },
                                on_axis(*r, "j"));
        return inner(xi);
      },
      on_axis(rt, "i"));
  EXPECT_TRUE(tensors_near(ok(x), sum_over(x, 0)));
}

// ---- failures after grouped collectives inside an inner call ---------------------------------

/// The inner call of the NestingGrouped cases, over an axis j of size 1 (the last axis of its
/// argument): a grouped all_to_all over the outer axis i within `pairs`, then a psum over j.
auto pair_exchange(pmap::Runtime& rt, const pmap::Groups& pairs) {
  return pmap::pmap(
      [&pairs](pmap::Context& ctx, auto v) {
        Tensor<double, 3, ColMajor> t = v;
        t = ctx.all_to_all(t, {"i"}, 2, 2, pairs);
        return ctx.psum(t, "j");
      },
      pmap::in_axes(-1), pmap::out_axes(pmap::none), on_axis(rt, "j"));
}

TEST(NestingGrouped, GroupedAllToAllOverTheOuterNameInsideAnInnerCallOfSizeOne) {
  // Outer axis i over 6, inner axis j over 1 (mapping the last axis, of size 1): the inner
  // kernel exchanges halves within pairs of the outer axis, then sums over j.
  using D3 = Tensor<double, 3, ColMajor>;
  using D5 = Tensor<double, 5, ColMajor>;
  const pmap::Groups pairs{{0, 4}, {5, 3}, {1, 2}};
  for (int threads : {1, 2}) {
    pmap::Runtime rt({.num_devices = 8, .num_threads = threads});
    pmap::Runtime* r = &rt;
    auto outer = pmap::pmap(
        [r, &pairs](pmap::Context&, auto xi) {
          auto inner = pair_exchange(*r, pairs);
          D3 out = inner(xi);
          return out;
        },
        on_axis(rt, "i"));
    D5 x = make<D5>(11, 6, 1, 3, 2, 1);
    std::vector<D3> parts;
    for (Index p = 0; p < 6; ++p) {
      D3 part3 = x.chip(p, 0).chip(0, 3);
      parts.push_back(part3);
    }
    for (int call = 0; call < 3; ++call) {
      Tensor<double, 4, ColMajor> y = outer(x);
      ASSERT_EQ(y.dimension(0), 6);
      for (int p = 0; p < 6; ++p) {
        const auto [members, pos] = group_of(pairs, 6, p);
        const D3 expect = all_to_all_ref(parts, members, pos, 2, 2);
        const D3 got = y.chip(p, 0);
        EXPECT_TRUE(tensors_equal(got, expect))
            << threads << " threads, call " << call << ", device " << p;
      }
    }
  }
}

TEST(NestingGrouped, UnboundNameAfterAnInnerCallWithAGroupedAllToAllIsNameError) {
  // As above, then the outer kernel names the inner axis, which only the inner call binds:
  // every outer device raises E11 once the inner call has returned, and the call must end
  // with it (not wait for devices that left the inner team).
  using D3 = Tensor<double, 3, ColMajor>;
  using D5 = Tensor<double, 5, ColMajor>;
  const pmap::Groups pairs{{0, 4}, {5, 3}, {1, 2}};
  for (int threads : {1, 2}) {
    pmap::Runtime rt({.num_devices = 8, .num_threads = threads});
    pmap::Runtime* r = &rt;
    auto outer = pmap::pmap(
        [r, &pairs](pmap::Context& octx, auto xi) {
          auto inner = pair_exchange(*r, pairs);
          D3 out = inner(xi);
          return octx.psum(out, "j");
        },
        on_axis(rt, "i"));
    D5 x = make<D5>(12, 6, 1, 3, 2, 1);
    for (int call = 0; call < 5; ++call) {
      expect_throw_msg<pmap::NameError>([&] { (void)outer(x); }, "unbound axis name: j");
      if (testing::Test::HasFailure()) {
        ADD_FAILURE() << threads << " threads, call " << call;
        break;
      }
    }
  }
}

TEST(NestingGrouped, OuterKernelThrowingAfterAGroupedInnerPsumRethrowsItsError) {
  // Outer axis i over 4, inner axis j over 1; the inner kernel reduces over pairs of the
  // outer axis. After the inner call returns, every outer device (or only one) throws: the
  // call must end with that exception, on every call.
  for (int threads : {1, 2}) {
    for (int thrower : {-1, 1, 3}) {
      pmap::Runtime rt({.num_devices = 4, .num_threads = threads});
      pmap::Runtime* r = &rt;
      auto outer = pmap::pmap(
          [r, thrower](pmap::Context& octx, auto xi) {
            auto inner = pmap::pmap(
                [](pmap::Context& ctx, auto v) { return ctx.psum(v, "i", {{0, 1}, {2, 3}}); },
                on_axis(*r, "j"));
            F2 s = inner(xi);
            if (thrower < 0 || octx.axis_index("i") == thrower)
              throw std::runtime_error("outer kernel failed after the inner call");
            return s;
          },
          on_axis(rt, "i"));
      F3 x = make<F3>(13, 4, 1, 3);
      const std::string where = std::to_string(threads) + " threads, thrower " +
                                std::to_string(thrower);
      for (int call = 0; call < 30; ++call) {
        try {
          (void)outer(x);
          ADD_FAILURE() << where << ", call " << call << ": nothing thrown";
        } catch (const std::runtime_error& e) {
          EXPECT_EQ(typeid(e), typeid(std::runtime_error))
              << where << ", call " << call << ": got " << typeid(e).name() << " \"" << e.what()
              << "\"";
          EXPECT_EQ(std::string(e.what()), "outer kernel failed after the inner call")
              << where << ", call " << call;
        } catch (const std::exception& e) {
          ADD_FAILURE() << where << ", call " << call << ": got " << typeid(e).name() << " \""
                        << e.what() << "\"";
        }
        if (testing::Test::HasFailure()) break;
      }
      if (testing::Test::HasFailure()) return;
    }
  }
}

}  // namespace
