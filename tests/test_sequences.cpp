/// @file test_sequences.cpp
/// @brief The devices of a call must call the same collectives in the same order (SPEC 5,
/// E14; SPEC 8.7), also where no peer reads the device that differs: a ppermute, pshuffle or
/// pbroadcast waits for its source alone, so a device that calls another collective, another
/// shape or other pairs there, or none, where nobody reads it, is found when the call ends
/// (src/sequences.cpp). Each case raises pmap::DeviceError naming the collective, the axis
/// and the devices on each side, on every run, flat, nested and in shard_map over two axes.

#include <string>
#include <utility>
#include <vector>

#include "collective_util.hpp"

namespace {

using namespace coll_test;
using pmap::P;

/// What a device of the cases below calls, by its flat index p of n devices; `axes` are the
/// names of all n devices.
enum class Case { shape, kind, parameters };

F1 call_case(pmap::Context& ctx, Case c, int p, int n, const pmap::AxisNames& axes) {
  F1 w(p == 1 && c == Case::shape ? 5 : 3);
  w.setConstant(static_cast<float>(p));
  switch (c) {
    case Case::shape:  // no pairs: nobody reads anybody
      return ctx.ppermute(w, axes, {});
    case Case::kind: {
      if (p == 0) return ctx.pbroadcast(w, axes, 0);  // reads itself; nobody reads it
      std::vector<int> perm(static_cast<std::size_t>(n));  // 0 fixed, the others rotate
      perm[0] = 0;
      for (int d = 1; d < n; ++d) perm[static_cast<std::size_t>(d)] = d + 1 < n ? d + 1 : 1;
      return ctx.pshuffle(w, axes, perm);
    }
    case Case::parameters: {
      if (p == n - 1) return ctx.ppermute(w, axes, {});  // nobody reads the last device
      const Perm pairs = n > 2 ? Perm{{0, n / 2}, {n - 1, n - 1}} : Perm{{0, 0}, {1, 1}};
      return ctx.ppermute(w, axes, pairs);
    }
  }
  return w;
}

/// Where each case's devices differ: the collectives named and the device reported.
struct Expected {
  std::vector<std::string> parts;
};

Expected expected(Case c, int n) {
  switch (c) {
    case Case::shape:
      return {{"ppermute", "device 1", "float32[5]", "float32[3]"}};
    case Case::kind:
      return {{"pbroadcast", "pshuffle", "device 0"}};
    case Case::parameters:
      return {{"ppermute", "device " + std::to_string(n - 1), "pairs"}};
  }
  return {};
}

class Sequences : public RuntimeTest {
 protected:
  /// Runs f `runs` times; each must throw pmap::DeviceError containing every part.
  template <class F>
  void expect_e14(F&& f, const std::vector<std::string>& parts, int runs = 3) {
    for (int run = 0; run < runs; ++run) {
      try {
        f();
        ADD_FAILURE() << "run " << run << ": nothing thrown, expected pmap::DeviceError";
      } catch (const pmap::DeviceError& e) {
        const std::string what = e.what();
        for (const auto& part : parts)
          EXPECT_NE(what.find(part), std::string::npos)
              << "run " << run << ": \"" << part << "\" not in: " << what;
      }
    }
  }
  /// A healthy call on the same runtime afterwards.
  void expect_healthy() {
    F2 x = make<F2>(3, n(), 3);
    auto f = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); }, on_axis(rt()));
    ASSERT_TRUE(tensors_near(f(x), replicate(group_sum(x, iota(n())), n())));
  }
};
INSTANTIATE_TEST_SUITE_P(Runtimes, Sequences,
                         testing::Values(RtConfig{2, 1}, RtConfig{2, 2}, RtConfig{4, 1},
                                         RtConfig{4, 2}, RtConfig{8, 1}, RtConfig{8, 2}),
                         config_name);

constexpr Case kCases[] = {Case::shape, Case::kind, Case::parameters};

TEST_P(Sequences, FlatPmap) {
  F2 x = make<F2>(1, n(), 2);
  for (Case c : kCases) {
    auto f = pmap::pmap(
        [c](pmap::Context& ctx, auto) {
          return static_cast<float>(
              call_case(ctx, c, ctx.axis_index(), ctx.axis_size(), "i").size());
        },
        on_axis(rt()));
    std::vector<std::string> parts = expected(c, n()).parts;
    parts.push_back("axis i");
    expect_e14([&] { (void)f(x); }, parts);
    expect_healthy();
  }
}

TEST_P(Sequences, ShardMapOverBothAxesOfATwoAxisMesh) {
  const int b = n() / 2;
  const pmap::Mesh mesh({{"x", 2}, {"y", b}}, &rt());
  for (Case c : kCases) {
    auto f = pmap::shard_map(
        [c, b](pmap::Context& ctx) {
          const int p = ctx.axis_index("x") * b + ctx.axis_index("y");
          F1 r(1);
          r(0) = static_cast<float>(call_case(ctx, c, p, 2 * b, {"x", "y"}).size());
          return r;
        },
        mesh, {}, {P(std::vector<std::string>{"x", "y"})});
    std::vector<std::string> parts = expected(c, n()).parts;
    parts.push_back("('x', 'y')");
    expect_e14([&] { (void)f(); }, parts);
    expect_healthy();
  }
}

TEST_P(Sequences, NestedPmapSkipsAPbroadcastOverTheOuterAxis) {
  // Outer over "i" (3 devices, 2 on a 2-device runtime), inner over "j" of 1: outer device 0
  // returns from its inner kernel without the pbroadcast from outer device 1 that the others
  // call, which no device waits for device 0 in. The inner calls share one team; the last of
  // them to end compares all of it.
  const int a = n() == 2 ? 2 : 3;
  F2 x = make<F2>(2, a, 1);
  pmap::Runtime& runtime = rt();
  auto outer = pmap::pmap(
      [&runtime](pmap::Context& octx, auto xi) {
        const int i = octx.axis_index();
        auto inner = pmap::pmap(
            [i](pmap::Context& ctx, auto v) {
              F1 s = pmap::eval(v);
              if (i != 0) s = ctx.pbroadcast(s, "i", 1);
              return s;
            },
            on_axis(runtime, "j"));
        F2 in(1, xi.dimension(0));
        for (Index k = 0; k < xi.dimension(0); ++k) in(0, k) = xi(k);
        return inner(in);
      },
      on_axis(rt(), "i"));
  expect_e14([&] { (void)outer(x); },
             {"pbroadcast over axis i", "returned from its kernel without calling it",
              "device 0"});
  expect_healthy();
}

TEST_P(Sequences, NestedPmapInShardMapSkipsAPbroadcast) {
  // The same skip with the outer devices those of a shard_map over {x: 2, y: b}.
  const int b = n() / 2;
  const pmap::Mesh mesh({{"x", 2}, {"y", b}}, &rt());
  pmap::Runtime& runtime = rt();
  auto f = pmap::shard_map(
      [&runtime, b](pmap::Context& octx) {
        const int p = octx.axis_index("x") * b + octx.axis_index("y");
        auto inner = pmap::pmap(
            [p](pmap::Context& ctx, auto v) {
              F1 s = pmap::eval(v);
              if (p != 0) s = ctx.pbroadcast(s, {"x", "y"}, 1);
              return s;
            },
            on_axis(runtime, "j"));
        F2 in(1, 2);
        in.setConstant(static_cast<float>(p));
        F2 r = inner(in);
        return r;
      },
      mesh, {}, {P(std::vector<std::string>{"x", "y"})});
  expect_e14([&] { (void)f(); },
             {"pbroadcast", "returned from its kernel without calling it", "device 0"});
  expect_healthy();
}

TEST_P(Sequences, AgreeingDevicesStillPass) {
  // The same collectives with nobody differing: no error, the right values, many times
  // (the histories of equal sequences are equal also across calls of one Mapped).
  F2 x = make<F2>(4, n(), 3);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        F1 s = pmap::eval(v);
        for (int k = 0; k < 5; ++k) s = ctx.ppermute(s, "i", ring(ctx.axis_size(), 1));
        s = ctx.ppermute(s, "i", {});
        return s;
      },
      on_axis(rt()));
  for (int run = 0; run < 5; ++run) {
    const F2 y = f(x);
    EXPECT_EQ(y.dimension(0), ni());
    for (Index k = 0; k < y.size(); ++k) ASSERT_EQ(y.data()[k], 0.f) << "run " << run;
  }
}

}  // namespace
