// shard_map (SPEC 9): meshes, partition specs, uneven and empty blocks, outputs assembled
// in block order, replication checks, every error before any kernel runs, and agreement
// with pmap on the same program. Every device test runs with more devices than threads too.

#include <atomic>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <Eigen/LU>

#include "test_util.hpp"

namespace {

using namespace pmap_test;
using pmap::Mesh;
using pmap::P;
using Strings = std::vector<std::string>;

template <class T, int R, int L = RowMajor>
using Tensor = Eigen::Tensor<T, R, L>;

/// The rule of SPEC 9, written again independently of the library: block b of k along a
/// dimension of size s.
std::pair<Index, Index> expected_block(Index s, Index k, Index b) {
  Index start = 0;
  for (Index c = 0; c < b; ++c) start += s / k + (c < s % k ? 1 : 0);
  return {start, s / k + (b < s % k ? 1 : 0)};
}

pmap::ShardOptions named(std::string name) {
  pmap::ShardOptions o;
  o.name = std::move(name);
  return o;
}

class ShardMap : public RuntimeTest {};

// ---- Mesh and P ---------------------------------------------------------------------------

TEST_P(ShardMap, MeshOverTheFirstDevicesRowMajor) {
  const Mesh mesh({{"x", n()}}, &rt());
  EXPECT_EQ(mesh.size(), n());
  EXPECT_EQ(mesh.axis_size("x"), n());
  EXPECT_EQ(mesh.axis_names(), Strings{"x"});
  for (int i = 0; i < n(); ++i) EXPECT_EQ(mesh.devices()[static_cast<std::size_t>(i)], rt().devices()[static_cast<std::size_t>(i)]);
  expect_throw_msg<pmap::NameError>([&] { (void)mesh.axis_size("y"); }, "unbound axis name: y");
  if (n() >= 4) {
    const Mesh grid({{"a", 2}, {"b", n() / 2}}, &rt());
    EXPECT_EQ(grid.size(), n());
    EXPECT_EQ(grid.axis_size("b"), n() / 2);
    EXPECT_EQ(grid.axis_names(), (Strings{"a", "b"}));
  }
}

TEST_P(ShardMap, MeshOverAnExplicitDeviceListKeepsItsOrder) {
  std::vector<pmap::Device> reversed(rt().devices().rbegin(), rt().devices().rend());
  const Mesh mesh({{"x", n()}}, reversed, &rt());
  for (int i = 0; i < n(); ++i) EXPECT_EQ(mesh.devices()[static_cast<std::size_t>(i)], reversed[static_cast<std::size_t>(i)]);
  // Context::device() is the device at that position of the mesh.
  auto f = pmap::shard_map([](pmap::Context& ctx) { return Tensor<int, 1>(Tensor<int, 1>(1).setConstant(ctx.device().id)); },
                           mesh, {}, {P("x")});
  const auto ids = f();
  for (int i = 0; i < n(); ++i) EXPECT_EQ(ids(i), reversed[static_cast<std::size_t>(i)].id);
}

TEST_P(ShardMap, MeshErrors) {
  expect_validation_error<pmap::ValueError>([&] { Mesh({{"x", 0}}, &rt()); },
                                            "Mesh axis 'x' has size 0, but a mesh axis needs at least 1 device");
  expect_validation_error<pmap::ValueError>([&] { Mesh({{"x", 1}, {"x", 1}}, &rt()); },
                                            "Mesh axis names must be distinct, but 'x' appears twice");
  expect_validation_error<pmap::ValueError>(
      [&] { Mesh({{"x", n() + 1}}, &rt()); },
      "Mesh needs " + std::to_string(n() + 1) + " devices, but only " + std::to_string(n()) +
          " devices are available");
  expect_validation_error<pmap::ValueError>(
      [&] { Mesh({{"x", 2}, {"y", n()}}, &rt()); },
      "Mesh needs " + std::to_string(2 * n()) + " devices, but only " + std::to_string(n()) +
          " devices are available");
  const std::vector<pmap::Device> one{rt().devices()[0]};
  expect_validation_error<pmap::ValueError>([&] { Mesh({{"x", 2}}, one, &rt()); },
                                            "Mesh of shape {'x': 2} needs 2 devices, but was given 1");
  const std::vector<pmap::Device> twice{rt().devices()[0], rt().devices()[0]};
  expect_validation_error<pmap::ValueError>(
      [&] { Mesh({{"x", 2}}, twice, &rt()); },
      "Mesh devices must be distinct, but " + rt().devices()[0].to_string() + " appears twice");
  pmap::Runtime other({.num_devices = n() + 1, .num_threads = 1});
  const std::vector<pmap::Device> foreign{other.devices()[static_cast<std::size_t>(n())]};
  expect_validation_error<pmap::ValueError>(
      [&] { Mesh({{"x", 1}}, foreign, &rt()); },
      "Mesh devices: " + foreign[0].to_string() + " is not a device of the runtime, which has " +
          std::to_string(n()) + " devices");
}

TEST(ShardMapSpec, PBuildsEntries) {
  EXPECT_TRUE(P().dims.empty());
  const auto p = P("x", pmap::none, std::string("y"), std::string_view("z"), Strings{"a", "b"});
  ASSERT_EQ(p.dims.size(), 5u);
  EXPECT_EQ(p.dims[0], Strings{"x"});
  EXPECT_TRUE(p.dims[1].empty());
  EXPECT_EQ(p.dims[2], Strings{"y"});
  EXPECT_EQ(p.dims[3], Strings{"z"});
  EXPECT_EQ(p.dims[4], (Strings{"a", "b"}));
}

// ---- blocks ---------------------------------------------------------------------------------

/// For every mesh size k <= devices (so k > extent gives empty blocks) and every dimension d
/// of a rank-3 tensor: device b receives exactly block b of d (against the serial rule and
/// slicing), zero-copy when contiguous, and the identity kernel's output is the input.
template <int L>
void check_blocks_along_every_dimension(pmap::Runtime& rt, int n) {
  Tensor<float, 3, L> x(5, 3, 4);
  fill_values(x, 1);
  for (int k = 1; k <= n; ++k) {
    const Mesh mesh({{"x", k}}, &rt);
    for (int d = 0; d < 3; ++d) {
      pmap::PartitionSpec spec;
      spec.dims.resize(static_cast<std::size_t>(d + 1));
      spec.dims[static_cast<std::size_t>(d)] = {"x"};
      std::vector<const float*> data(static_cast<std::size_t>(k));
      std::vector<Tensor<float, 3, L>> got(static_cast<std::size_t>(k));
      auto f = pmap::shard_map(
          [&](pmap::Context& ctx, View<float, 3, L> b) {
            const auto i = static_cast<std::size_t>(ctx.axis_index("x"));
            data[i] = b.data();
            got[i] = b;
            return b;
          },
          mesh, {spec}, {spec});
      const Tensor<float, 3, L> y = f(x);
      EXPECT_TRUE(tensors_equal(y, x)) << "k=" << k << " d=" << d;
      for (int b = 0; b < k; ++b) {
        const auto [start, extent] = expected_block(x.dimension(d), k, b);
        std::array<Index, 3> offsets{0, 0, 0}, extents{x.dimension(0), x.dimension(1), x.dimension(2)};
        offsets[static_cast<std::size_t>(d)] = start;
        extents[static_cast<std::size_t>(d)] = extent;
        const Tensor<float, 3, L> want = x.slice(offsets, extents);
        EXPECT_TRUE(tensors_equal(got[static_cast<std::size_t>(b)], want)) << "k=" << k << " d=" << d << " b=" << b;
        const bool contiguous = L == RowMajor ? d == 0 : d == 2;
        if (contiguous && extent > 0) {
          Index offset = start;
          for (int e = 0; e < 3; ++e) if (e != d) offset *= x.dimension(e);
          EXPECT_EQ(data[static_cast<std::size_t>(b)], x.data() + offset) << "a contiguous block is a view";
        } else if (extent > 0 && k > 1) {
          EXPECT_FALSE(points_inside(data[static_cast<std::size_t>(b)], x.data(), x.size()))
              << "a strided block is staged";
        }
      }
    }
  }
}

TEST_P(ShardMap, UnevenAndEmptyBlocksRowMajor) { check_blocks_along_every_dimension<RowMajor>(rt(), n()); }
TEST_P(ShardMap, UnevenAndEmptyBlocksColMajor) { check_blocks_along_every_dimension<ColMajor>(rt(), n()); }

TEST_P(ShardMap, BatchOf1001RowsOnEveryDevice) {
  Tensor<double, 2> x(1001, 3);
  fill_values(x, 2);
  const Mesh mesh({{"batch", n()}}, &rt());
  auto f = pmap::shard_map([](auto b) { return pmap::eval(b * 2.0 + 1.0); }, mesh, {P("batch")},
                           {P("batch")});
  const Tensor<double, 2> y = f(x);
  const Tensor<double, 2> want = x * 2.0 + 1.0;
  EXPECT_TRUE(tensors_equal(y, want));
}

TEST_P(ShardMap, ProcessBlockOnOneProcessIsTheWholeTensor) {
  const Mesh mesh({{"x", n()}}, &rt());
  Tensor<float, 2, ColMajor> x(5, 3);
  x.setRandom();
  const Tensor<float, 2, ColMajor> block = pmap::process_block(x, mesh, P("x"));
  ASSERT_EQ(block.dimensions(), x.dimensions());
  for (Eigen::Index k = 0; k < x.size(); ++k) EXPECT_EQ(block.data()[k], x.data()[k]);
  EXPECT_THROW(pmap::process_block(x, mesh, P("nope")), pmap::NameError);
  expect_validation_error<pmap::ValueError>(
      [&] { pmap::process_block(x, mesh, P("x", pmap::none, pmap::none)); },
      "process_block spec[0] has 3 entries, but the tensor has rank 2 (float32[5,3]); a spec "
      "may have at most one entry per dimension");
}

TEST_P(ShardMap, TwoAxisMeshSplitsRowsAndColumns) {
  if (n() < 4) GTEST_SKIP() << "needs 4 devices";
  const int a = 2, b = n() / 2;
  const Mesh mesh({{"data", a}, {"model", b}}, &rt());
  Tensor<int, 2> x(7, 9);
  fill_values(x, 3);
  // Each device adds its mesh position; the serial reference does the same per block.
  auto f = pmap::shard_map(
      [](pmap::Context& ctx, View<int, 2, RowMajor> blk) {
        return pmap::eval(blk + ctx.axis_index({"data", "model"}) * 1000);
      },
      mesh, {P("data", "model")}, {P("data", "model")});
  const Tensor<int, 2> y = f(x);
  Tensor<int, 2> want = x;
  for (int i = 0; i < a; ++i)
    for (int j = 0; j < b; ++j) {
      const auto [r0, rn] = expected_block(7, a, i);
      const auto [c0, cn] = expected_block(9, b, j);
      for (Index r = r0; r < r0 + rn; ++r)
        for (Index c = c0; c < c0 + cn; ++c) want(r, c) += (i * b + j) * 1000;
    }
  EXPECT_TRUE(tensors_equal(y, want));
}

TEST_P(ShardMap, SeveralAxesOnOneDimensionInBothOrders) {
  if (n() < 4) GTEST_SKIP() << "needs 4 devices";
  const int a = 2, b = n() / 2;
  const Mesh mesh({{"x", a}, {"y", b}}, &rt());
  Tensor<int, 1> x(11);
  fill_values(x, 0);
  for (const Strings& order : {Strings{"x", "y"}, Strings{"y", "x"}}) {
    auto f = pmap::shard_map(
        [&](pmap::Context& ctx, View<int, 1, RowMajor> blk) {
          // The block index is the position along the listed axes, row-major.
          const int block = ctx.axis_index({order[0], order[1]});
          return pmap::eval(blk * 0 + block);
        },
        mesh, {P(order)}, {P(order)});
    const Tensor<int, 1> y = f(x);
    for (int blk = 0; blk < n(); ++blk) {
      const auto [s, e] = expected_block(11, n(), blk);
      for (Index k = s; k < s + e; ++k) EXPECT_EQ(y(k), blk) << order[0] << order[1];
    }
  }
}

TEST_P(ShardMap, ThreeAxisMeshWithCollectivesOverEachAxisAndSeveral) {
  if (n() < 8) GTEST_SKIP() << "needs 8 devices";
  const Mesh mesh({{"a", 2}, {"b", 2}, {"c", 2}}, &rt());
  Tensor<float, 3> x(2, 2, 6);
  fill_values(x, 1);
  auto f = pmap::shard_map(
      [](pmap::Context& ctx, View<float, 3, RowMajor> blk) {
        EXPECT_EQ(ctx.axis_size({}), 2);                      // the last mesh axis
        EXPECT_EQ(ctx.axis_size({"a", "b", "c"}), 8);
        auto over_a = ctx.psum(blk, "a");
        auto over_bc = ctx.psum(over_a, {"b", "c"});
        return std::make_tuple(pmap::eval(over_bc), ctx.axis_index({"c", "a"}));
      },
      mesh, {P("a", "b", "c")}, {P(), P(Strings{"c", "a"})});
  // Rank-0 outputs cannot be split: the second spec has one entry for a rank-0 output.
  expect_validation_error<pmap::ValueError>(
      [&] { f(x); },
      "shard_map out_specs[1] has 1 entries, but output 1 has rank 0; a spec may have at most one "
      "entry per dimension");
  auto g = pmap::shard_map(
      [](pmap::Context& ctx, View<float, 3, RowMajor> blk) {
        auto total = ctx.psum(ctx.psum(blk, "a"), {"b", "c"});
        Tensor<int, 1> pos(1);
        pos(0) = ctx.axis_index({"c", "a"});
        return std::make_tuple(pmap::eval(total), pos);
      },
      mesh, {P("a", "b", "c")}, {P(), P(Strings{"c", "a"})});
  const auto [total, pos] = g(x);
  Tensor<float, 3> want(1, 1, 3);
  want.setZero();
  for (Index i = 0; i < 2; ++i)
    for (Index j = 0; j < 2; ++j)
      for (Index k = 0; k < 6; ++k) want(0, 0, k % 3) += x(i, j, k);
  EXPECT_TRUE(tensors_near(total, want));
  // Output 1 is split over (c, a): replicated along b, block c*2+a holds that position.
  ASSERT_EQ(pos.dimension(0), 4);
  for (int blk = 0; blk < 4; ++blk) EXPECT_EQ(pos(blk), blk);
}

// ---- arguments -----------------------------------------------------------------------------

TEST_P(ShardMap, ReplicatedContainersAndNonTensorArguments) {
  const Mesh mesh({{"x", n()}}, &rt());
  Tensor<float, 1> x(10), w(3);
  fill_values(x, 1);
  fill_values(w, 2);
  std::vector<Tensor<float, 1>> pair{x, x};
  const float scale = 3.f;
  // One spec for every argument: the tensors of the tuple and the vector are split, w is
  // replicated by its own P(), the float is broadcast.
  auto f = pmap::shard_map(
      [&](auto tup, std::vector<View<float, 1, RowMajor>> vec, View<float, 1, RowMajor> whole, const float& s) {
        EXPECT_EQ(whole.size(), 3);
        EXPECT_EQ(whole.data(), w.data());
        EXPECT_EQ(&s, &scale);
        return pmap::eval(std::get<0>(tup) * s + vec[1] + whole(0));
      },
      mesh, {P("x"), P("x"), P(), P()}, {P("x")});
  const Tensor<float, 1> y = f(std::make_tuple(x), pair, w, scale);
  const Tensor<float, 1> want = x * 3.f + x + w(0);
  EXPECT_TRUE(tensors_equal(y, want));
  // A single spec shared by every argument applies to the tensors only.
  auto g = pmap::shard_map([](View<float, 1, RowMajor> b, const float& s) { return pmap::eval(b * s); },
                           mesh, {P("x")}, {P("x")});
  const Tensor<float, 1> z = g(x, scale);
  EXPECT_TRUE(tensors_equal(z, Tensor<float, 1>(x * 3.f)));
}

TEST_P(ShardMap, KernelWithoutArguments) {
  const Mesh mesh({{"x", n()}}, &rt());
  auto f = pmap::shard_map(
      [](pmap::Context& ctx) {
        Tensor<int, 1> mine(2);
        mine.setConstant(ctx.axis_index("x"));
        return std::make_tuple(mine, ctx.psum(1, "x"));
      },
      mesh, {}, {P("x"), P()});
  const auto [blocks, count] = f();
  ASSERT_EQ(blocks.dimension(0), 2 * n());
  for (int k = 0; k < 2 * n(); ++k) EXPECT_EQ(blocks(k), k / 2);
  EXPECT_EQ(count(), n());
}

// ---- outputs -------------------------------------------------------------------------------

TEST_P(ShardMap, OutputBlocksOfDifferentSizesConcatenateInBlockOrder) {
  const Mesh mesh({{"x", n()}}, &rt());
  // Device i returns i + 1 rows of its index: not the input's blocks at all.
  auto f = pmap::shard_map(
      [](pmap::Context& ctx) {
        const int i = ctx.axis_index("x");
        Tensor<int, 2> out(i + 1, 2);
        out.setConstant(i);
        return out;
      },
      mesh, {}, {P("x")});
  const Tensor<int, 2> y = f();
  ASSERT_EQ(y.dimension(0), n() * (n() + 1) / 2);
  Index row = 0;
  for (int i = 0; i < n(); ++i)
    for (int r = 0; r <= i; ++r, ++row) EXPECT_EQ(y(row, 1), i);
}

TEST_P(ShardMap, ReplicationCheck) {
  if (n() < 2) GTEST_SKIP() << "needs 2 devices";
  const Mesh mesh({{"x", n()}}, &rt());
  Tensor<float, 1> x(2 * n());
  fill_values(x, 1);
  auto agreeing = pmap::shard_map([](pmap::Context& ctx, View<float, 1, RowMajor> b) { return ctx.psum(b, "x"); },
                                  mesh, {P("x")}, {P()});
  const Tensor<float, 1> s = agreeing(x);
  EXPECT_EQ(s.dimension(0), 2);
  auto differing = [&](bool check) {
    pmap::ShardOptions o;
    o.check_replicated = check;
    return pmap::shard_map([](View<float, 1, RowMajor> b) { return pmap::eval(b * 1.f); }, mesh,
                           {P("x")}, {P()}, o);
  };
  expect_validation_error<pmap::ValueError>(
      [&] { differing(true)(x); },
      "shard_map out_specs[0] does not name mesh axis 'x', so output 0 must be equal along it, but "
      "device 1 differs from device 0");
  const Tensor<float, 1> first = differing(false)(x);
  EXPECT_TRUE(tensors_equal(first, Tensor<float, 1>(x.slice(std::array<Index, 1>{0}, std::array<Index, 1>{2}))));
}

TEST_P(ShardMap, LargeOutputsAreComparedAndPlacedOnTheDevices) {
  // 1 MiB per device: the pass after the call runs on the devices (kParallelPassBytes).
  const Mesh mesh({{"x", n()}}, &rt());
  const Index rows = 256 * 1024 / 4;
  Tensor<float, 2> x(rows * n(), 4);
  fill_values(x, 1);
  auto f = pmap::shard_map(
      [](pmap::Context& ctx, View<float, 2, RowMajor> b) {
        return std::make_tuple(pmap::eval(b * 2.f), ctx.psum(b, "x"));
      },
      mesh, {P("x")}, {P("x"), P()});
  const auto [twice, total] = f(x);
  EXPECT_TRUE(tensors_equal(twice, Tensor<float, 2>(x * 2.f)));
  Tensor<float, 2> want(rows, 4);
  want.setZero();
  for (int i = 0; i < n(); ++i)
    want += x.slice(std::array<Index, 2>{i * rows, 0}, std::array<Index, 2>{rows, 4});
  EXPECT_TRUE(tensors_near(total, want));
  if (n() < 2) return;
  auto g = pmap::shard_map(
      [](pmap::Context& ctx, View<float, 2, RowMajor> b) {
        Tensor<float, 2> s = ctx.psum(b, "x");
        if (ctx.axis_index("x") == ctx.axis_size("x") - 1) s(rows - 1, 3) += 1.f;  // the last element
        return s;
      },
      mesh, {P("x")}, {P()});
  Tensor<float, 2> out(rows, 4);
  out.setConstant(-1.f);
  expect_validation_error<pmap::ValueError>(
      [&] { g.into(out, x); },
      "shard_map out_specs[0] does not name mesh axis 'x', so output 0 must be equal along it, but "
      "device " + std::to_string(n() - 1) + " differs from device 0");
  EXPECT_EQ(out(0, 0), -1.f) << "nothing written";
}

TEST_P(ShardMap, ReadmeExamples) {
  {
    const Mesh mesh({{"batch", std::min(n(), 2)}}, &rt());
    const Index systems = 101, m = 8;
    Eigen::Tensor<double, 3, Eigen::RowMajor> A(systems, m, m);
    Eigen::Tensor<double, 2, Eigen::RowMajor> b(systems, m), x(systems, m);
    A.setRandom();
    for (Index s = 0; s < systems; ++s)
      for (Index k = 0; k < m; ++k) A(s, k, k) += 10.0;
    b.setRandom();
    auto solve = pmap::shard_map(
        [m](auto As, auto bs) {
          Eigen::Tensor<double, 2, Eigen::RowMajor> out(bs.dimension(0), m);
          for (Eigen::Index s = 0; s < bs.dimension(0); ++s) {
            using M = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
            Eigen::Map<const M> a(As.data() + s * m * m, m, m);
            Eigen::Map<const Eigen::VectorXd> r(bs.data() + s * m, m);
            Eigen::Map<Eigen::VectorXd>(out.data() + s * m, m) = a.partialPivLu().solve(r);
          }
          return out;
        },
        mesh, {P("batch")}, {P("batch")});
    solve.into(x, A, b);
    for (Index s = 0; s < systems; ++s)
      for (Index i = 0; i < m; ++i) {
        double r = 0;
        for (Index k = 0; k < m; ++k) r += A(s, i, k) * x(s, k);
        EXPECT_NEAR(r, b(s, i), 1e-9);
      }
  }
  if (n() < 8) return;
  const Mesh mesh({{"data", 2}, {"model", 4}}, &rt());
  Tensor<float, 2> x(6, 5), w(5, 8);
  fill_values(x, 1);
  fill_values(w, 2);
  auto step = pmap::shard_map(
      [](pmap::Context& ctx, auto xb, auto wb) {
        Eigen::array<Eigen::IndexPair<int>, 1> dims{Eigen::IndexPair<int>(1, 0)};
        auto h = pmap::eval(xb.contract(wb, dims));
        auto norm = ctx.psum(h.square().sum(), {"data", "model"});
        return std::make_tuple(h, norm);
      },
      mesh, {P("data", pmap::none), P(pmap::none, "model")}, {P("data", "model"), P()});
  auto [h, norm] = step(x, w);
  const Eigen::array<Eigen::IndexPair<int>, 1> dims{Eigen::IndexPair<int>(1, 0)};
  const Tensor<float, 2> want = x.contract(w, dims);
  EXPECT_TRUE(tensors_near(h, want));
  const Tensor<float, 0> want_norm = want.square().sum();
  EXPECT_NEAR(norm(), want_norm(), 1e-3 * want_norm());
}

TEST_P(ShardMap, MixedOutputsReplicatedAlongOneAxis) {
  if (n() < 4) GTEST_SKIP() << "needs 4 devices";
  const int a = 2, b = n() / 2;
  const Mesh mesh({{"x", a}, {"y", b}}, &rt());
  // Split along x, replicated along y: fine when the value depends on x only.
  auto ok = pmap::shard_map(
      [](pmap::Context& ctx) {
        Tensor<int, 1> v(1);
        v(0) = ctx.axis_index("x");
        return v;
      },
      mesh, {}, {P("x")});
  const Tensor<int, 1> y = ok();
  ASSERT_EQ(y.dimension(0), 2);
  EXPECT_EQ(y(0), 0);
  EXPECT_EQ(y(1), 1);
  auto bad = pmap::shard_map(
      [](pmap::Context& ctx) {
        Tensor<int, 1> v(1);
        v(0) = ctx.axis_index("x") + (ctx.axis_index("y") == 1 ? 10 : 0);
        return v;
      },
      mesh, {}, {P("x")}, named("step"));
  // The first differing device in mesh order is (x 0, y 1): position 1, against position 0.
  expect_validation_error<pmap::ValueError>(
      [&] { bad(); },
      "step out_specs[0] does not name mesh axis 'y', so output 0 must be equal along it, but "
      "device 1 differs from device 0");
}

TEST_P(ShardMap, BlocksDisagreeingOutsideSplitDimensions) {
  if (n() < 2) GTEST_SKIP() << "needs 2 devices";
  const Mesh mesh({{"x", n()}}, &rt());
  auto f = pmap::shard_map(
      [](pmap::Context& ctx) {
        Tensor<int, 2> v(1, ctx.axis_index("x") == 1 ? 3 : 2);
        v.setZero();
        return v;
      },
      mesh, {}, {P("x")});
  const std::string msg = catch_message<pmap::DeviceError>([&] { f(); });
  EXPECT_EQ(msg,
            "shard_map output 0 has a block of shape (1, 2) on device 0 but of shape (1, 3) on "
            "device 1; blocks may differ only along the dimensions out_specs[0] splits");
}

TEST_P(ShardMap, IntoWritesCallerOwnedResults) {
  const Mesh mesh({{"x", n()}}, &rt());
  Tensor<float, 2> x(13, 2);
  fill_values(x, 1);
  auto f = pmap::shard_map([](pmap::Context& ctx, View<float, 2, RowMajor> b) {
    return std::make_tuple(pmap::eval(b + 1.f), ctx.psum(b.sum(), "x"));
  }, mesh, {P("x")}, {P("x"), P()});
  Tensor<float, 2> y(13, 2);
  Tensor<float, 0> total;
  f.into(std::tie(y, total), x);
  EXPECT_TRUE(tensors_equal(y, Tensor<float, 2>(x + 1.f)));
  const Tensor<float, 0> want_total = x.sum();
  EXPECT_FLOAT_EQ(total(), want_total());
  Tensor<float, 2> wrong(12, 2);
  wrong.setConstant(-1.f);
  expect_validation_error<pmap::ValueError>(
      [&] { f.into(std::tie(wrong, total), x); },
      "pmap into: output 0 must have shape (13, 2) and type float32, but the given output has "
      "shape (12, 2) and type float32");
  for (Index k = 0; k < wrong.size(); ++k) EXPECT_EQ(wrong.data()[k], -1.f) << "nothing written";
}

// ---- errors before any kernel runs ---------------------------------------------------------

TEST_P(ShardMap, SpecErrorsBeforeAnyKernelRuns) {
  const Mesh mesh({{"x", n()}}, &rt());
  std::atomic<int> ran{0};
  auto kernel = [&](View<float, 2, RowMajor> b) {
    ++ran;
    return pmap::eval(b * 1.f);
  };
  Tensor<float, 2> x(4, 3);
  fill_values(x, 0);
  auto call = [&](std::vector<pmap::PartitionSpec> in, std::vector<pmap::PartitionSpec> out) {
    return [&, in, out] { pmap::shard_map(kernel, mesh, in, out, named("f"))(x); };
  };
  expect_throw_msg<pmap::NameError>(call({P("z")}, {P("x")}), "unbound axis name: z");
  expect_throw_msg<pmap::NameError>(call({P("x")}, {P(pmap::none, "q")}), "unbound axis name: q");
  expect_validation_error<pmap::ValueError>(
      call({P("x", "x")}, {P("x")}),
      "f in_specs[0] uses mesh axis 'x' twice; each mesh axis may split at most one dimension, once");
  expect_validation_error<pmap::ValueError>(
      call({P("x")}, {P(Strings{"x", "x"})}),
      "f out_specs[0] uses mesh axis 'x' twice; each mesh axis may split at most one dimension, once");
  expect_validation_error<pmap::ValueError>(
      call({P("x", pmap::none, pmap::none)}, {P("x")}),
      "f in_specs[0] has 3 entries, but args[0] has rank 2 (float32[4,3]); a spec may have at "
      "most one entry per dimension");
  expect_validation_error<pmap::ValueError>(
      call({P("x")}, {P("x", pmap::none, pmap::none)}),
      "f out_specs[0] has 3 entries, but output 0 has rank 2; a spec may have at most one entry "
      "per dimension");
  expect_validation_error<pmap::ValueError>(
      call({P("x"), P("x")}, {P("x")}),
      "f got 2 in_specs for 1 arguments; pass one per argument, or a single one for all");
  expect_validation_error<pmap::ValueError>(
      call({P("x")}, {P("x"), P()}),
      "f got 2 out_specs for 1 outputs; pass one per output, or a single one for all");
  auto scalar_arg = pmap::shard_map([&](View<float, 2, RowMajor> b, int) { ++ran; return pmap::eval(b * 1.f); },
                                    mesh, {P("x"), P("x")}, {P("x")}, named("f"));
  expect_validation_error<pmap::ValueError>(
      [&] { scalar_arg(x, 3); },
      "f in_specs[1] splits args[1], which is not a tensor (type int32); a non-tensor argument is "
      "broadcast and takes P()");
  EXPECT_EQ(ran.load(), 0);
}

TEST_P(ShardMap, NestedInAPmapKernelMapsAnInnerMesh) {
  // Each of the n outer devices runs the inner mesh of 1 on its own row (SPEC 13; the
  // inner-mesh cases are tests/test_nested_mesh.cpp).
  const Mesh mesh({{"x", 1}}, &rt());
  auto inner = pmap::shard_map([](View<float, 1, RowMajor> b) { return pmap::eval(b * 2.f); }, mesh,
                               {P("x")}, {P("x")});
  Tensor<float, 2> x(n(), 2);
  fill_values(x, 0);
  auto outer = pmap::pmap([&](View<float, 1, RowMajor> row) { return inner(Tensor<float, 1>(row)); }, opts());
  const Tensor<float, 2> y = outer(x);
  const Tensor<float, 2> want = x * 2.f;
  EXPECT_TRUE(tensors_near(y, want));
}

TEST_P(ShardMap, KernelExceptionsPropagate) {
  const Mesh mesh({{"x", n()}}, &rt());
  auto f = pmap::shard_map(
      [](pmap::Context& ctx, View<float, 1, RowMajor> b) {
        if (ctx.axis_index("x") == ctx.axis_size("x") - 1) throw std::runtime_error("boom");
        return ctx.psum(b, "x");  // the others wait here, then are cancelled
      },
      mesh, {P("x")}, {P()});
  Tensor<float, 1> x(3 * n());
  fill_values(x, 0);
  expect_throw_msg<std::runtime_error>([&] { f(x); }, "boom");
  // The function is usable afterwards.
  auto g = pmap::shard_map([](pmap::Context& ctx, View<float, 1, RowMajor> b) { return ctx.psum(b, "x"); },
                           mesh, {P("x")}, {P()});
  EXPECT_EQ(g(x).dimension(0), 3);
}

TEST_P(ShardMap, ManyCollectivesWithMoreDevicesThanThreads) {
  const Mesh mesh({{"x", n()}}, &rt());
  const int steps = kSanitized ? 60 : 300;
  auto f = pmap::shard_map(
      [&](pmap::Context& ctx, View<double, 1, RowMajor> b) {
        Tensor<double, 1> v = b;
        for (int s = 0; s < steps; ++s) v = ctx.pmean(v, "x");
        return v;
      },
      mesh, {P("x")}, {P()});
  Tensor<double, 1> x(2 * n());
  fill_values(x, 0);
  const Tensor<double, 1> y = f(x);
  for (Index k = 0; k < 2; ++k) {
    double mean = 0;
    for (int i = 0; i < n(); ++i) mean += x(2 * i + k);
    EXPECT_NEAR(y(k), mean / n(), 1e-9);
  }
}

TEST_P(ShardMap, AgreesWithPmapOnTheSameProgram) {
  Tensor<float, 2> x(n(), 6);
  fill_values(x, 4);
  auto step = [](pmap::Context& ctx, const auto& row) {
    auto total = ctx.psum(row, "i");
    auto gathered = ctx.all_gather(row, "i", 0, pmap::tiled);
    return std::make_tuple(pmap::eval(row * 2.f + total), pmap::eval(gathered * 1.f));
  };
  pmap::Options o = opts();
  o.axis_name = "i";
  auto by_pmap = pmap::pmap([&](pmap::Context& ctx, View<float, 1, RowMajor> row) { return step(ctx, row); },
                            pmap::out_axes(0, pmap::none), o);
  const Mesh mesh({{"i", n()}}, &rt());
  auto by_shard = pmap::shard_map(
      [&](pmap::Context& ctx, View<float, 2, RowMajor> blk) {
        const View<float, 1, RowMajor> row(blk.data(), 6);
        auto [a, b] = step(ctx, row);
        return std::make_tuple(pmap::eval(a.reshape(std::array<Index, 2>{1, 6})), b);
      },
      mesh, {P("i")}, {P("i"), P()});
  const auto [pa, pb] = by_pmap(x);
  const auto [sa, sb] = by_shard(x);
  EXPECT_TRUE(tensors_equal(sa, pa));
  EXPECT_TRUE(tensors_equal(sb, pb));
}

PMAP_TEST_INSTANTIATE(ShardMap);

}  // namespace
