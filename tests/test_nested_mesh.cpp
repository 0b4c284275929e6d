/// @file test_nested_mesh.cpp
/// @brief shard_map inside a kernel (SPEC 13): an inner mesh under a pmap or a shard_map,
/// uneven inner blocks, collectives over inner, outer and both axes, more devices than
/// threads, the inner mesh's errors, and an inner device that throws.

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>
#include <string>
#include <vector>

#include "collective_util.hpp"

namespace {

using namespace coll_test;

/// Runtimes of 4 and 8 devices on 1 and 2 threads: outer axes of 2, inner meshes of 2 and 4.
std::vector<RtConfig> nested_configs() { return {{4, 1}, {4, 2}, {8, 1}, {8, 2}}; }

class NestedMesh : public RuntimeTest {};
INSTANTIATE_TEST_SUITE_P(Runtimes, NestedMesh, testing::ValuesIn(nested_configs()), config_name);

/// x[r] = r + 1 for r < rows.
F1 rows_vector(Index rows) {
  F1 x(rows);
  for (Index r = 0; r < rows; ++r) x(r) = static_cast<float>(r + 1);
  return x;
}

// A pmap over "i" (2 outer devices), each calling a shard_map over the inner mesh
// {"x": 2, "y": n / 4}. Outer device i passes 7 + i rows split over "x" (blocks of 4 and 3,
// or 4 and 4), replicated along "y". Each inner device returns its block plus
// 1000 * (psum of its block's sum over "x") + 100 * (psum of 1 over "i") + (axis_index over
// {"i", "x"}), which only the right groups give.
TEST_P(NestedMesh, ShardMapInsidePmap) {
  const int N = n();
  const int y = N / 4;
  auto outer = pmap::pmap(
      [y, this](pmap::Context& octx, auto) {
        const int i = octx.axis_index("i");
        const pmap::Mesh mesh({{"x", 2}, {"y", y}}, &rt());
        auto inner = pmap::shard_map(
            [](pmap::Context& ctx, auto block) {
              const float local = static_cast<float>(pmap::eval(block.sum())());
              const float over_x = ctx.psum(local, "x");
              const float over_i = ctx.psum(1.f, "i");
              const float position = static_cast<float>(ctx.axis_index({"i", "x"}));
              return pmap::eval(block + (1000.f * over_x + 100.f * over_i + position));
            },
            mesh, {pmap::P("x")}, {pmap::P("x")});
        const F1 got = inner(rows_vector(7 + i));
        // The serial model: the whole vector's sum, 2 outer devices, position i * 2 + block.
        const float total = static_cast<float>((7 + i) * (8 + i) / 2);
        const Index first_block = (7 + i + 1) / 2;
        float err = 0;
        for (Index r = 0; r < got.size(); ++r) {
          const float position = static_cast<float>(i * 2 + (r < first_block ? 0 : 1));
          err += std::abs(got(r) - (static_cast<float>(r + 1) + 1000.f * total + 200.f + position));
        }
        return err + (got.size() == 7 + i ? 0.f : 1e6f);
      },
      on_axis(rt(), "i"));
  const F1 err = outer(F1(2).setZero());
  EXPECT_EQ(err(0), 0.f);
  EXPECT_EQ(err(1), 0.f);
}

// A shard_map over {"a": 2} whose kernel calls a shard_map over {"x": n / 2}: each inner
// device returns [1, 3], the psums of its block's sum over "x", over "a" and over both, so
// the result is [2 * n / 2, 3], one row per device; with 5 rows, outer blocks of 3 and 2 and
// inner blocks of 1 or 0 rows (some empty when n / 2 > 2).
TEST_P(NestedMesh, ShardMapInsideShardMap) {
  const int inner_size = n() / 2;
  const pmap::Mesh outer_mesh({{"a", 2}}, &rt());
  auto outer = pmap::shard_map(
      [inner_size, this](pmap::Context&, auto block) {
        const pmap::Mesh mesh({{"x", inner_size}}, &rt());
        auto inner = pmap::shard_map(
            [](pmap::Context& ctx, auto b) {
              const float s = static_cast<float>(pmap::eval(b.sum())());
              Tensor<float, 2> out(1, 3);
              out(0, 0) = ctx.psum(s, "x");
              out(0, 1) = ctx.psum(s, "a");
              out(0, 2) = ctx.psum(s, {"a", "x"});
              return out;
            },
            mesh, {pmap::P("x")}, {pmap::P("x")});
        return inner(F1(block));
      },
      outer_mesh, {pmap::P("a")}, {pmap::P("a")});
  const F1 x = rows_vector(5);
  const Tensor<float, 2> got = outer(x);
  ASSERT_EQ(got.dimension(0), 2 * inner_size);
  // The model: outer block b has rows [begin_b, end_b); inner device x of it the rows SPEC 9
  // gives it; s(b, x) the sum of x[r] = r + 1 over them.
  auto split = [](Index size, Index parts, Index k) {
    const Index base = size / parts, extra = size % parts;
    const Index begin = k * base + std::min(k, extra);
    return std::pair<Index, Index>{begin, begin + base + (k < extra ? 1 : 0)};
  };
  auto s = [&](Index b, Index k) {
    const auto [ob, oe] = split(5, 2, b);
    const auto [ib, ie] = split(oe - ob, inner_size, k);
    float sum = 0;
    for (Index r = ob + ib; r < ob + ie; ++r) sum += static_cast<float>(r + 1);
    return sum;
  };
  for (Index b = 0; b < 2; ++b)
    for (Index k = 0; k < inner_size; ++k) {
      float over_x = 0;
      for (Index j = 0; j < inner_size; ++j) over_x += s(b, j);
      const Index row = b * inner_size + k;
      EXPECT_EQ(got(row, 0), over_x) << "row " << row;
      EXPECT_EQ(got(row, 1), s(0, k) + s(1, k)) << "row " << row;
      EXPECT_EQ(got(row, 2), 15.f) << "row " << row;
    }
}

TEST_P(NestedMesh, InnerMeshMayNotReuseAnOuterAxisName) {
  auto outer = pmap::pmap(
      [this](pmap::Context&, auto) {
        const pmap::Mesh mesh({{"i", 2}}, &rt());
        auto inner = pmap::shard_map([](auto b) { return b; }, mesh, {pmap::P("i")}, {pmap::P("i")});
        return inner(F1(2).setZero());
      },
      on_axis(rt(), "i"));
  expect_validation_error<pmap::ValueError>(
      [&] { outer(F1(2).setZero()); },
      "shard_map: the inner mesh's axis 'i' is already bound by an enclosing pmap or shard_map; "
      "an inner mesh needs axis names of its own");
}

TEST_P(NestedMesh, OuterTimesInnerBeyondTheDevicesIsE7) {
  const int N = n();
  auto outer = pmap::pmap(
      [N, this](pmap::Context&, auto) {
        const pmap::Mesh mesh({{"x", N / 2 + 1}}, &rt());
        auto inner = pmap::shard_map([](auto b) { return b; }, mesh, {pmap::P("x")}, {pmap::P("x")});
        return inner(F1(N).setZero());
      },
      on_axis(rt(), "i"));
  const std::string need = std::to_string(2 * (N / 2 + 1));
  expect_validation_error<pmap::ValueError>(
      [&] { outer(F1(2).setZero()); },
      "compiling computation that requires " + need + " logical devices, but only " +
          std::to_string(N) + " devices are available (num_replicas=" + need + ")");
}

TEST_P(NestedMesh, AnInnerDeviceThatThrowsFailsTheCallAndTheNextOneRuns) {
  const int N = n();
  for (const bool fail : {true, false}) {
    auto outer = pmap::pmap(
        [N, fail, this](pmap::Context& octx, auto) {
          const int i = octx.axis_index("i");
          const pmap::Mesh mesh({{"x", N / 2}}, &rt());
          auto inner = pmap::shard_map(
              [i, fail](pmap::Context& ctx, auto b) {
                if (fail && i == 1 && ctx.axis_index("x") == 0) throw std::runtime_error("inner gives up");
                return pmap::eval(b * 0.f + ctx.psum(1.f, {"i", "x"}));
              },
              mesh, {pmap::P("x")}, {pmap::P("x")});
          return pmap::eval(inner(F1(N / 2).setZero()).sum());
        },
        on_axis(rt(), "i"));
    if (fail) {
      EXPECT_EQ(catch_message<std::runtime_error>([&] { outer(F1(2).setZero()); }), "inner gives up");
    } else {
      const auto sums = outer(F1(2).setZero());
      EXPECT_EQ(sums(0), static_cast<float>(N * (N / 2)));
      EXPECT_EQ(sums(1), static_cast<float>(N * (N / 2)));
    }
  }
}

}  // namespace
