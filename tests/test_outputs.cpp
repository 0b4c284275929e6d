/// @file test_outputs.cpp
/// @brief What the kernel returns and what the call returns (SPEC 2.2), out_axes (SPEC
/// 3.2), pmap::eval and Mapped::into.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "test_util.hpp"

namespace {

using namespace pmap_test;

template <class T, int R, int L = ColMajor>
using Tensor = Eigen::Tensor<T, R, L>;

template <class T>
std::vector<T> slots(int count, T init) {
  return std::vector<T>(static_cast<std::size_t>(count), init);
}

class Outputs : public RuntimeTest {};
PMAP_TEST_INSTANTIATE(Outputs);

// ---- output kinds ------------------------------------------------------------------------

TEST_P(Outputs, OwningTensor) {
  auto x = make<Tensor<float, 2, RowMajor>>(1, n(), 3);
  auto f = pmap::pmap(
      [](View<float, 1, RowMajor> v) {
        Tensor<float, 1, RowMajor> t(4);
        t.setConstant(v(0));
        t(3) = v(2) * 2.f;
        return t;
      },
      opts());
  auto r = f(x);
  EXPECT_TRUE((std::is_same_v<decltype(r), Tensor<float, 2, RowMajor>>));
  std::vector<Tensor<float, 1, RowMajor>> parts;
  for (Index i = 0; i < ni(); ++i) {
    Tensor<float, 1, RowMajor> t(4);
    t.setConstant(x(i, 0));
    t(3) = x(i, 2) * 2.f;
    parts.push_back(t);
  }
  EXPECT_TRUE(tensors_equal(r, stack(parts, 0)));
}

TEST_P(Outputs, ParameterViewReturnedAsIs) {
  auto x = make<Tensor<double, 3, RowMajor>>(1, n(), 2, 3);
  auto f = pmap::pmap([](auto v) { return v; }, opts());
  auto r = f(x);
  EXPECT_TRUE((std::is_same_v<decltype(r), Tensor<double, 3, RowMajor>>));
  EXPECT_TRUE(tensors_equal(r, x));
}

TEST_P(Outputs, TensorMapOverLongLivedBuffer) {
  // Each device returns a TensorMap over its own row of a buffer that outlives the call.
  Tensor<float, 2, RowMajor> table = make<Tensor<float, 2, RowMajor>>(7, n(), 3);
  auto x = make<Tensor<float, 1, RowMajor>>(0, n());
  auto f = pmap::pmap(
      [&table](pmap::Context& ctx, auto) {
        return Eigen::TensorMap<Tensor<float, 1, RowMajor>>(table.data() + 3 * ctx.axis_index(), 3);
      },
      opts());
  auto r = f(x);
  EXPECT_TRUE((std::is_same_v<decltype(r), Tensor<float, 2, RowMajor>>));
  EXPECT_TRUE(tensors_equal(r, table));
}

TEST_P(Outputs, ExpressionOverParameters) {
  auto x = make<Tensor<float, 2, RowMajor>>(1, n(), 5);
  auto y = make<Tensor<float, 2, RowMajor>>(2, n(), 5);
  auto f = pmap::pmap([](auto a, auto b) { return a * 2.f + b; }, opts());
  auto r = f(x, y);
  EXPECT_TRUE((std::is_same_v<decltype(r), Tensor<float, 2, RowMajor>>));
  std::vector<Tensor<float, 1, RowMajor>> parts;
  for (Index i = 0; i < ni(); ++i) parts.push_back(slice(x, i, 0) * 2.f + slice(y, i, 0));
  EXPECT_TRUE(tensors_equal(r, stack(parts, 0)));
}

TEST_P(Outputs, ExpressionOverCapturedTensorMap) {
  auto bias = make<Tensor<float, 1, RowMajor>>(3, 4);
  Eigen::TensorMap<const Tensor<float, 1, RowMajor>> bias_map(bias.data(), 4);
  auto x = make<Tensor<float, 2, RowMajor>>(1, n(), 4);
  auto f = pmap::pmap([bias_map](auto v) { return (v - bias_map).abs(); }, opts());
  auto r = f(x);
  std::vector<Tensor<float, 1, RowMajor>> parts;
  for (Index i = 0; i < ni(); ++i) parts.push_back((slice(x, i, 0) - bias).abs());
  EXPECT_TRUE(tensors_equal(r, stack(parts, 0)));
}

TEST_P(Outputs, ShapeChangingExpressions) {
  auto x = make<Tensor<float, 3, RowMajor>>(1, n(), 2, 3);
  auto f = pmap::pmap(
      [](auto v) {
        const Eigen::array<Index, 1> axis{1};
        const Eigen::array<Index, 2> perm{1, 0};
        return std::make_tuple(v.sum(axis), v.shuffle(perm));
      },
      opts());
  auto [sums, transposed] = f(x);
  EXPECT_TRUE((std::is_same_v<decltype(sums), Tensor<float, 2, RowMajor>>));
  EXPECT_TRUE((std::is_same_v<decltype(transposed), Tensor<float, 3, RowMajor>>));
  std::vector<Tensor<float, 1, RowMajor>> s_parts;
  std::vector<Tensor<float, 2, RowMajor>> t_parts;
  for (Index i = 0; i < ni(); ++i) {
    auto s = slice(x, i, 0);
    s_parts.push_back(s.sum(Eigen::array<Index, 1>{1}));
    t_parts.push_back(s.shuffle(Eigen::array<Index, 2>{1, 0}));
  }
  EXPECT_TRUE(tensors_equal(sums, stack(s_parts, 0)));
  EXPECT_TRUE(tensors_equal(transposed, stack(t_parts, 0)));
}

TEST_P(Outputs, RankZeroExpression) {
  auto x = make<Tensor<float, 2, RowMajor>>(1, n(), 6);
  auto f = pmap::pmap([](auto v) { return v.sum(); }, opts());
  auto r = f(x);
  EXPECT_TRUE((std::is_same_v<decltype(r), Tensor<float, 1, RowMajor>>));
  std::vector<float> expected;
  for (Index i = 0; i < ni(); ++i) {
    Tensor<float, 0, RowMajor> s = slice(x, i, 0).sum();
    expected.push_back(s());
  }
  EXPECT_TRUE(tensors_equal(r, stack_scalars(expected)));
}

template <class T>
void check_scalar_output(pmap::Options o, int count) {
  SCOPED_TRACE(typeid(T).name());
  // ColMajor input: a scalar output is RowMajor regardless.
  auto x = make<Tensor<T, 2, ColMajor>>(1, count, 2);
  auto f = pmap::pmap([](View<T, 1, ColMajor> v) { return static_cast<T>(v(1)); }, o);
  auto r = f(x);
  EXPECT_TRUE((std::is_same_v<decltype(r), Tensor<T, 1, RowMajor>>));
  std::vector<T> expected;
  for (Index i = 0; i < x.dimension(0); ++i) expected.push_back(x(i, 1));
  EXPECT_TRUE(tensors_equal(r, stack_scalars(expected)));
}

TEST_P(Outputs, ArithmeticScalars) {
  check_scalar_output<float>(opts(), n());
  check_scalar_output<double>(opts(), n());
  check_scalar_output<int32_t>(opts(), n());
  check_scalar_output<int64_t>(opts(), n());
  check_scalar_output<bool>(opts(), n());
}

TEST_P(Outputs, ScalarFromAxisIndex) {
  auto x = make<Tensor<float, 1, RowMajor>>(0, n());
  auto f = pmap::pmap([](pmap::Context& ctx, auto) { return ctx.axis_index(); }, opts());
  auto r = f(x);
  EXPECT_TRUE((std::is_same_v<decltype(r), Tensor<int, 1, RowMajor>>));
  for (int i = 0; i < n(); ++i) EXPECT_EQ(r(i), i);
}

TEST_P(Outputs, TupleOfOutputs) {
  auto x = make<Tensor<float, 2, RowMajor>>(1, n(), 3);
  auto f = pmap::pmap(
      [](auto v) {
        Tensor<int64_t, 1, RowMajor> owned(2);
        owned(0) = static_cast<int64_t>(v(0));
        owned(1) = 7;
        Tensor<float, 0, RowMajor> s = v.sum();
        return std::make_tuple(v * 2.f, static_cast<double>(s()), owned, v);
      },
      opts());
  auto r = f(x);
  using R = decltype(r);
  EXPECT_TRUE((std::is_same_v<R, std::tuple<Tensor<float, 2, RowMajor>, Tensor<double, 1, RowMajor>,
                                             Tensor<int64_t, 2, RowMajor>, Tensor<float, 2, RowMajor>>>));
  Tensor<float, 2, RowMajor> doubled = x * 2.f;
  EXPECT_TRUE(tensors_equal(std::get<0>(r), doubled));
  std::vector<double> sums;
  std::vector<Tensor<int64_t, 1, RowMajor>> owned;
  for (Index i = 0; i < ni(); ++i) {
    Tensor<float, 0, RowMajor> s = slice(x, i, 0).sum();
    sums.push_back(static_cast<double>(s()));
    Tensor<int64_t, 1, RowMajor> o(2);
    o(0) = static_cast<int64_t>(x(i, 0));
    o(1) = 7;
    owned.push_back(o);
  }
  EXPECT_TRUE(tensors_equal(std::get<1>(r), stack_scalars(sums)));
  EXPECT_TRUE(tensors_equal(std::get<2>(r), stack(owned, 0)));
  EXPECT_TRUE(tensors_equal(std::get<3>(r), x));
}

TEST_P(Outputs, VectorOfOutputs) {
  auto x = make<Tensor<float, 2, RowMajor>>(1, n(), 2);
  auto f = pmap::pmap(
      [](auto v) {
        std::vector<Tensor<float, 1, RowMajor>> outs;
        for (int k = 0; k < 3; ++k) outs.push_back(v * static_cast<float>(k + 1));
        return outs;
      },
      opts());
  auto r = f(x);
  EXPECT_TRUE((std::is_same_v<decltype(r), std::vector<Tensor<float, 2, RowMajor>>>));
  ASSERT_EQ(r.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    Tensor<float, 2, RowMajor> expected = x * static_cast<float>(k + 1);
    EXPECT_TRUE(tensors_equal(r[static_cast<std::size_t>(k)], expected)) << "output " << k;
  }
}

TEST_P(Outputs, VectorOfOutputsWithOneOutAxis) {
  auto x = make<Tensor<float, 2, RowMajor>>(1, n(), 2);
  auto f = pmap::pmap(
      [](auto v) {
        return std::vector<Tensor<float, 1, RowMajor>>{Tensor<float, 1, RowMajor>(v), Tensor<float, 1, RowMajor>(v + 1.f)};
      },
      pmap::out_axes(1), opts());
  auto r = f(x);
  ASSERT_EQ(r.size(), 2u);
  Tensor<float, 2, RowMajor> t0 = x.shuffle(Eigen::array<Index, 2>{1, 0});
  Tensor<float, 2, RowMajor> t1 = (x + 1.f).shuffle(Eigen::array<Index, 2>{1, 0});
  EXPECT_TRUE(tensors_equal(r[0], t0));
  EXPECT_TRUE(tensors_equal(r[1], t1));
}

// ---- out_axes ----------------------------------------------------------------------------

TEST_P(Outputs, OutAxesEveryPositionOfARank2Output) {
  auto x = make<Tensor<float, 3, RowMajor>>(1, n(), 2, 3);
  auto fn = [](const Tensor<float, 2, RowMajor>& s) { return Tensor<float, 2, RowMajor>(s * 3.f); };
  std::vector<Tensor<float, 2, RowMajor>> parts;
  for (Index i = 0; i < ni(); ++i) parts.push_back(fn(slice(x, i, 0)));
  for (int d : {0, 1, 2, -1, -2, -3}) {
    const int nd = d < 0 ? d + 3 : d;
    auto f = pmap::pmap([](auto v) { return v * 3.f; }, pmap::out_axes(d), opts());
    auto r = f(x);
    EXPECT_TRUE((std::is_same_v<decltype(r), Tensor<float, 3, RowMajor>>));
    EXPECT_TRUE(tensors_equal(r, stack(parts, nd))) << "out_axes(" << d << ")";
  }
}

TEST_P(Outputs, OutAxesWithInAxes) {
  auto x = make<Tensor<float, 2, RowMajor>>(1, 3, n());
  // in_axes(1) then out_axes(1) is the identity.
  auto f = pmap::pmap([](auto v) { return v; }, pmap::in_axes(1), pmap::out_axes(1), opts());
  auto r = f(x);
  EXPECT_TRUE(tensors_equal(r, x));
  auto g = pmap::pmap([](auto v) { return v; }, pmap::in_axes(-1), pmap::out_axes(-1), opts());
  EXPECT_TRUE(tensors_equal(g(x), x));
}

TEST_P(Outputs, OutAxesPerOutput) {
  auto x = make<Tensor<float, 3, RowMajor>>(1, n(), 2, 3);
  auto f = pmap::pmap([](auto v) { return std::make_tuple(v * 1.f, v + 1.f, v.sum()); },
                      pmap::out_axes(2, -2, 0), opts());
  auto [a, b, c] = f(x);
  std::vector<Tensor<float, 2, RowMajor>> pa;
  std::vector<Tensor<float, 2, RowMajor>> pb;
  std::vector<float> pc;
  for (Index i = 0; i < ni(); ++i) {
    auto s = slice(x, i, 0);
    pa.push_back(s);
    pb.push_back(s + 1.f);
    Tensor<float, 0, RowMajor> t = s.sum();
    pc.push_back(t());
  }
  EXPECT_TRUE(tensors_equal(a, stack(pa, 2)));
  EXPECT_TRUE(tensors_equal(b, stack(pb, 1)));
  EXPECT_TRUE(tensors_equal(c, stack_scalars(pc)));
}

TEST_P(Outputs, OutAxesOnScalarOutput) {
  auto x = make<Tensor<float, 1, RowMajor>>(1, n());
  auto f = pmap::pmap([](auto v) { return v() * 2.f; }, pmap::out_axes(-1), opts());
  Tensor<float, 1, RowMajor> expected = x * 2.f;
  EXPECT_TRUE(tensors_equal(f(x), expected));
}

TEST_P(Outputs, OutAxesNoneReturnsReplicatedValue) {
  auto x = make<Tensor<float, 1, RowMajor>>(1, n());
  auto w = make<Tensor<float, 2, RowMajor>>(2, 2, 3);
  auto f = pmap::pmap([](auto, auto wv) { return wv * 2.f; }, pmap::in_axes(0, pmap::none),
                      pmap::out_axes(pmap::none), opts());
  auto r = f(x, w);
  EXPECT_TRUE((std::is_same_v<decltype(r), Tensor<float, 2, RowMajor>>));
  Tensor<float, 2, RowMajor> expected = w * 2.f;
  EXPECT_TRUE(tensors_equal(r, expected));
}

TEST_P(Outputs, OutAxesNoneOnScalarGivesRankZero) {
  auto x = make<Tensor<float, 1, RowMajor>>(1, n());
  auto f = pmap::pmap([](pmap::Context& ctx, auto) { return static_cast<double>(ctx.axis_size()) * 1.5; },
                      pmap::out_axes(pmap::none), opts());
  auto r = f(x);
  EXPECT_TRUE((std::is_same_v<decltype(r), Tensor<double, 0, RowMajor>>));
  EXPECT_EQ(r(), static_cast<double>(n()) * 1.5);
}

TEST_P(Outputs, OutAxesMappedAndNoneInOneTuple) {
  auto x = make<Tensor<float, 2, RowMajor>>(1, n(), 3);
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) { return std::make_tuple(v + 1.f, ctx.axis_size()); },
      pmap::out_axes(0, pmap::none), opts());
  auto r = f(x);
  EXPECT_TRUE((std::is_same_v<decltype(r), std::tuple<Tensor<float, 2, RowMajor>, Tensor<int, 0, RowMajor>>>));
  Tensor<float, 2, RowMajor> expected = x + 1.f;
  EXPECT_TRUE(tensors_equal(std::get<0>(r), expected));
  EXPECT_EQ(std::get<1>(r)(), n());
}

TEST_P(Outputs, CheckReplicatedOffReturnsDeviceZero) {
  auto x = make<Tensor<float, 2, RowMajor>>(1, n(), 3);
  pmap::Options o = opts();
  o.check_replicated = false;
  auto f = pmap::pmap([](auto v) { return v * 1.f; }, pmap::out_axes(pmap::none), o);
  auto r = f(x);
  EXPECT_TRUE((std::is_same_v<decltype(r), Tensor<float, 1, RowMajor>>));
  EXPECT_TRUE(tensors_equal(r, slice(x, 0, 0)));
}

TEST_P(Outputs, ColMajorOutputs) {
  auto x = make<Tensor<float, 3, ColMajor>>(1, 2, 3, n());
  auto f = pmap::pmap([](auto v) { return v * 2.f; }, pmap::in_axes(-1), opts());
  auto r = f(x);
  EXPECT_TRUE((std::is_same_v<decltype(r), Tensor<float, 3, ColMajor>>));
  std::vector<Tensor<float, 2, ColMajor>> parts;
  for (Index i = 0; i < ni(); ++i) parts.push_back(slice(x, i, 2) * 2.f);
  EXPECT_TRUE(tensors_equal(r, stack(parts, 0)));
  auto g = pmap::pmap([](auto v) { return v * 2.f; }, pmap::in_axes(-1), pmap::out_axes(-1), opts());
  Tensor<float, 3, ColMajor> doubled = x * 2.f;
  EXPECT_TRUE(tensors_equal(g(x), doubled));
}

TEST_P(Outputs, OutputLayoutFollowsTheOutputNotTheInput) {
  // A RowMajor input, a ColMajor owning output.
  auto x = make<Tensor<float, 2, RowMajor>>(1, n(), 3);
  auto f = pmap::pmap(
      [](auto v) {
        Tensor<float, 1, ColMajor> t(3);
        for (Index k = 0; k < 3; ++k) t(k) = v(k) + 1.f;
        return t;
      },
      opts());
  auto r = f(x);
  EXPECT_TRUE((std::is_same_v<decltype(r), Tensor<float, 2, ColMajor>>));
  std::vector<Tensor<float, 1, ColMajor>> parts;
  for (Index i = 0; i < ni(); ++i) {
    Tensor<float, 1, ColMajor> t(3);
    for (Index k = 0; k < 3; ++k) t(k) = x(i, k) + 1.f;
    parts.push_back(t);
  }
  EXPECT_TRUE(tensors_equal(r, stack(parts, 0)));
}

// ---- pmap::eval --------------------------------------------------------------------------

TEST(Eval, OwningTensorOfTheExpression) {
  auto a = make<Tensor<float, 2, RowMajor>>(1, 2, 3);
  auto e = pmap::eval(a * 2.f + a);
  EXPECT_TRUE((std::is_same_v<decltype(e), Tensor<float, 2, RowMajor>>));
  Tensor<float, 2, RowMajor> expected = a * 3.f;
  EXPECT_TRUE(tensors_equal(e, expected));

  auto b = make<Tensor<int32_t, 3, ColMajor>>(2, 2, 2, 2);
  auto eb = pmap::eval(b - 1);
  EXPECT_TRUE((std::is_same_v<decltype(eb), Tensor<int32_t, 3, ColMajor>>));
  Tensor<int32_t, 3, ColMajor> expected_b = b - 1;
  EXPECT_TRUE(tensors_equal(eb, expected_b));

  auto s = pmap::eval(a.sum());
  EXPECT_TRUE((std::is_same_v<decltype(s), Tensor<float, 0, RowMajor>>));
  Tensor<float, 0, RowMajor> expected_s = a.sum();
  EXPECT_EQ(s(), expected_s());
}

TEST_P(Outputs, EvalOfKernelLocalTensor) {
  auto x = make<Tensor<float, 2, RowMajor>>(1, n(), 3);
  auto f = pmap::pmap(
      [](auto v) {
        Tensor<float, 1, RowMajor> local = v * 2.f;
        return pmap::eval(local + v);
      },
      opts());
  Tensor<float, 2, RowMajor> expected = x * 3.f;
  EXPECT_TRUE(tensors_equal(f(x), expected));
}

// ---- into --------------------------------------------------------------------------------

TEST_P(Outputs, IntoSingleOutput) {
  auto x = make<Tensor<float, 2, RowMajor>>(1, n(), 3);
  auto y = make<Tensor<float, 2, RowMajor>>(2, n(), 3);
  auto f = pmap::pmap([](auto a, auto b) { return a * 2.f + b; }, opts());
  Tensor<float, 2, RowMajor> out(n(), 3);
  fill(out, -99.f);
  f.into(out, x, y);
  Tensor<float, 2, RowMajor> expected = x * 2.f + y;
  EXPECT_TRUE(tensors_equal(out, expected));
  // Reused across iterations.
  for (int k = 0; k < 5; ++k) {
    f.into(out, y, x);
    Tensor<float, 2, RowMajor> e2 = y * 2.f + x;
    EXPECT_TRUE(tensors_equal(out, e2));
  }
}

TEST_P(Outputs, IntoTensorMap) {
  auto x = make<Tensor<double, 2, RowMajor>>(1, n(), 3);
  std::vector<double> buffer(static_cast<std::size_t>(n() * 3), -1.0);
  Eigen::TensorMap<Tensor<double, 2, RowMajor>> out(buffer.data(), n(), 3);
  auto f = pmap::pmap([](auto v) { return v + 0.5; }, opts());
  f.into(out, x);
  Tensor<double, 2, RowMajor> expected = x + 0.5;
  EXPECT_TRUE(tensors_equal(out, expected));
  // A temporary TensorMap works as well.
  std::fill(buffer.begin(), buffer.end(), -1.0);
  f.into(Eigen::TensorMap<Tensor<double, 2, RowMajor>>(buffer.data(), n(), 3), x);
  EXPECT_TRUE(tensors_equal(out, expected));
}

TEST_P(Outputs, IntoTupleOfReferences) {
  auto x = make<Tensor<float, 2, RowMajor>>(1, n(), 3);
  auto f = pmap::pmap([](auto v) { return std::make_tuple(v * 2.f, v(0)); }, pmap::out_axes(1, 0), opts());
  Tensor<float, 2, RowMajor> a(3, n());
  Tensor<float, 1, RowMajor> b(n());
  fill(a, -1.f);
  fill(b, -1.f);
  f.into(std::tie(a, b), x);
  Tensor<float, 2, RowMajor> ea = (x * 2.f).shuffle(Eigen::array<Index, 2>{1, 0});
  EXPECT_TRUE(tensors_equal(a, ea));
  std::vector<float> eb;
  for (Index i = 0; i < ni(); ++i) eb.push_back(x(i, 0));
  EXPECT_TRUE(tensors_equal(b, stack_scalars(eb)));
}

TEST_P(Outputs, IntoOutAxesNone) {
  auto x = make<Tensor<float, 1, RowMajor>>(1, n());
  auto w = make<Tensor<float, 1, RowMajor>>(2, 4);
  auto f = pmap::pmap([](auto, auto wv) { return wv + 1.f; }, pmap::in_axes(0, pmap::none),
                      pmap::out_axes(pmap::none), opts());
  Tensor<float, 1, RowMajor> out(4);
  fill(out, -1.f);
  f.into(out, x, w);
  Tensor<float, 1, RowMajor> expected = w + 1.f;
  EXPECT_TRUE(tensors_equal(out, expected));
}

TEST_P(Outputs, IntoWrongShapeIsValueErrorAndWritesNothing) {
  auto x = make<Tensor<float, 2, RowMajor>>(1, n(), 3);
  auto f = pmap::pmap([](auto v) { return v * 2.f; }, opts());
  Tensor<float, 2, RowMajor> out(n() + 1, 3);
  fill(out, -7.f);
  const std::string msg = catch_message<pmap::ValueError>([&] { f.into(out, x); });
  const std::string expected_shape = "(" + std::to_string(n()) + ", 3)";
  const std::string actual_shape = "(" + std::to_string(n() + 1) + ", 3)";
  EXPECT_NE(msg.find(actual_shape), std::string::npos) << msg;
  EXPECT_TRUE(all_equal_to(out, -7.f));

  // Right mapped axis, wrong trailing dimension: found once the devices know their shape.
  Tensor<float, 2, RowMajor> wide(n(), 4);
  fill(wide, -7.f);
  const std::string msg_wide = catch_message<pmap::ValueError>([&] { f.into(wide, x); });
  EXPECT_NE(msg_wide.find(expected_shape), std::string::npos) << msg_wide;
  EXPECT_NE(msg_wide.find("(" + std::to_string(n()) + ", 4)"), std::string::npos) << msg_wide;
  EXPECT_TRUE(all_equal_to(wide, -7.f));

  Tensor<float, 2, RowMajor> transposed(3, n());
  fill(transposed, -7.f);
  if (n() != 3) {
    const std::string msg2 = catch_message<pmap::ValueError>([&] { f.into(transposed, x); });
    EXPECT_NE(msg2.find("(3, " + std::to_string(n()) + ")"), std::string::npos) << msg2;
    EXPECT_TRUE(all_equal_to(transposed, -7.f));
  }
}

TEST_P(Outputs, IntoWrongMappedAxisNamesTheFullExpectedShape) {
  // The expected shape is the one the call would return: (n, 3), not a partial one.
  auto x = make<Tensor<float, 2, RowMajor>>(1, n(), 3);
  auto f = pmap::pmap([](auto v) { return v * 2.f; }, opts());
  Tensor<float, 2, RowMajor> out(n() + 1, 3);
  const std::string msg = catch_message<pmap::ValueError>([&] { f.into(out, x); });
  EXPECT_NE(msg.find("(" + std::to_string(n()) + ", 3)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(" + std::to_string(n() + 1) + ", 3)"), std::string::npos) << msg;
}

TEST_P(Outputs, IntoWrongShapeMessageListsExpectedThenActual) {
  // SPEC 2.2: the ValueError names the output, the expected shape (what the call returns)
  // and the actual shape (the given `out`), in that order.
  auto x = make<Tensor<float, 2, RowMajor>>(1, n(), 3);
  auto f = pmap::pmap([](auto v) { return v * 2.f; }, opts());
  Tensor<float, 2, RowMajor> wide(n(), 4);
  const std::string msg = catch_message<pmap::ValueError>([&] { f.into(wide, x); });
  const auto expected_at = msg.find("(" + std::to_string(n()) + ", 3)");
  const auto actual_at = msg.find("(" + std::to_string(n()) + ", 4)");
  ASSERT_NE(expected_at, std::string::npos) << msg;
  ASSERT_NE(actual_at, std::string::npos) << msg;
  EXPECT_LT(expected_at, actual_at) << msg;
}

TEST_P(Outputs, IntoWrongShapeInTupleWritesNothing) {
  auto x = make<Tensor<float, 2, RowMajor>>(1, n(), 3);
  std::atomic<int> runs{0};
  auto f = pmap::pmap(
      [&runs](auto v) {
        runs.fetch_add(1);
        return std::make_tuple(v * 2.f, v(0));
      },
      opts());
  Tensor<float, 2, RowMajor> a(n(), 3);
  Tensor<float, 1, RowMajor> b(n() + 2);
  fill(a, -7.f);
  fill(b, -7.f);
  const std::string msg = catch_message<pmap::ValueError>([&] { f.into(std::tie(a, b), x); });
  EXPECT_NE(msg.find("(" + std::to_string(n()) + ",)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(" + std::to_string(n() + 2) + ",)"), std::string::npos) << msg;
  EXPECT_TRUE(all_equal_to(a, -7.f));
  EXPECT_TRUE(all_equal_to(b, -7.f));
  // Both shapes are known before any kernel runs.
  EXPECT_EQ(runs.load(), 0);
}

TEST_P(Outputs, IntoWhereDevicesDisagreeIsE12) {
  // Every device writes its place as soon as it returns (no barrier before writing), so when
  // the devices disagree among themselves the call fails with E12 like a plain call; only a
  // shape that every device disagrees with is caught before anything is written (above).
  if (n() < 2) GTEST_SKIP() << "needs two devices";
  auto x = make<Tensor<float, 1, RowMajor>>(1, n());
  const int last = n() - 1;
  auto f = pmap::pmap(
      [last](pmap::Context& ctx, auto v) {
        Tensor<float, 1, RowMajor> t(ctx.axis_index() == last ? 5 : 2);
        t.setConstant(v());
        return t;
      },
      opts());
  Tensor<float, 2, RowMajor> out(n(), 2);
  fill(out, -7.f);
  try {
    f.into(out, x);
    ADD_FAILURE() << "no error";
  } catch (const pmap::DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("(5,)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(2,)"), std::string::npos) << e.what();
  } catch (const pmap::ValueError& e) {
    // The odd device finished first: `out` disagrees with it, and nothing was written.
    EXPECT_NE(std::string(e.what()).find("(" + std::to_string(n()) + ", 5)"), std::string::npos)
        << e.what();
    EXPECT_TRUE(all_equal_to(out, -7.f));
  }
}

TEST_P(Outputs, IntoColMajorWithOutAxis) {
  auto x = make<Tensor<float, 2, ColMajor>>(1, 3, n());
  auto f = pmap::pmap([](auto v) { return v * 2.f; }, pmap::in_axes(1), pmap::out_axes(-1), opts());
  Tensor<float, 2, ColMajor> out(3, n());
  fill(out, -1.f);
  f.into(out, x);
  Tensor<float, 2, ColMajor> expected = x * 2.f;
  EXPECT_TRUE(tensors_equal(out, expected));
}

// ---- outputs with a zero extent -----------------------------------------------------------
// A mapped axis of positive size whose slices are empty: the results are empty tensors of the
// right shape, and `into` accepts targets of exactly that shape.

TEST_P(Outputs, IntoTargetWithAZeroExtentIsAccepted) {
  Tensor<float, 2, RowMajor> x(ni(), 0);
  auto f = pmap::pmap([](auto v) { return v; }, opts());
  Tensor<float, 2, RowMajor> y = f(x);
  EXPECT_EQ(y.dimension(0), ni());
  EXPECT_EQ(y.dimension(1), 0);
  Tensor<float, 2, RowMajor> out(ni(), 0);
  EXPECT_NO_THROW(f.into(out, x));
  EXPECT_EQ(out.dimension(0), ni());
  EXPECT_EQ(out.dimension(1), 0);
  // A target of another shape is still refused.
  Tensor<float, 2, RowMajor> wrong(ni(), 1);
  fill(wrong, -7.f);
  (void)catch_message<pmap::ValueError>([&] { f.into(wrong, x); });
  EXPECT_TRUE(all_equal_to(wrong, -7.f));

  // out_axes none: device 0's (0,) value.
  auto g = pmap::pmap([](auto v) { return v; }, pmap::out_axes(pmap::none), opts());
  Tensor<float, 1, RowMajor> z = g(x);
  EXPECT_EQ(z.dimension(0), 0);
  Tensor<float, 1, RowMajor> out1(0);
  EXPECT_NO_THROW(g.into(out1, x));

  // ColMajor, mapped and stacked along the last axis: (0, n).
  Tensor<double, 2, ColMajor> xc(0, ni());
  auto h = pmap::pmap([](auto v) { return v; }, pmap::in_axes(1), pmap::out_axes(-1), opts());
  Tensor<double, 2, ColMajor> outc(0, ni());
  EXPECT_NO_THROW(h.into(outc, xc));

  // Beside a non-empty output, which is written.
  auto t = pmap::pmap([](auto v) { return std::make_tuple(v, 1.5f); }, opts());
  Tensor<float, 2, RowMajor> empty_out(ni(), 0);
  Tensor<float, 1, RowMajor> scalars(ni());
  fill(scalars, -7.f);
  EXPECT_NO_THROW(t.into(std::tie(empty_out, scalars), x));
  EXPECT_TRUE(all_equal_to(scalars, 1.5f));
}

TEST_P(Outputs, AllGatherOfEmptyPerDeviceTensorsGivesEmptyResults) {
  Tensor<float, 2, RowMajor> x(ni(), 0);
  pmap::Options o = opts();
  o.axis_name = "i";
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        return std::make_tuple(ctx.all_gather(v, "i"), ctx.all_gather(v, "i", 1),
                               ctx.all_gather(v, "i", 0, pmap::tiled));
      },
      o);
  auto [stacked, stacked_last, tiled] = f(x);
  EXPECT_EQ(stacked.dimension(0), ni());
  EXPECT_EQ(stacked.dimension(1), ni());
  EXPECT_EQ(stacked.dimension(2), 0);
  EXPECT_EQ(stacked_last.dimension(0), ni());
  EXPECT_EQ(stacked_last.dimension(1), 0);
  EXPECT_EQ(stacked_last.dimension(2), ni());
  EXPECT_EQ(tiled.dimension(0), ni());
  EXPECT_EQ(tiled.dimension(1), 0);
  // Into a target of the result's shape, and again (the same buffers reused).
  auto g = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.all_gather(v, "i"); }, o);
  Tensor<float, 3, RowMajor> out(ni(), ni(), 0);
  for (int call = 0; call < 3; ++call) EXPECT_NO_THROW(g.into(out, x)) << "call " << call;
}

// ---- E9: the out_axes count is part of the type ------------------------------------------

TEST(OutAxesCount, OneEntryPerOutputOrOneForAll) {
  pmap::Runtime rt({.num_devices = 2, .num_threads = 1});
  using X = Tensor<float, 2, RowMajor>;
  auto pair = [](auto v) { return std::make_tuple(v * 1.f, v(0)); };
  auto one = pmap::pmap(pair, pmap::out_axes(0), on(rt));
  auto two = pmap::pmap(pair, pmap::out_axes(0, pmap::none), on(rt));
  EXPECT_TRUE((std::is_invocable_v<decltype(one)&, X&>));
  EXPECT_TRUE((std::is_invocable_v<decltype(two)&, X&>));
  // Another count does not compile (SPEC 3.2, E9).
  auto three = pmap::pmap(pair, pmap::out_axes(0, 0, 0), on(rt));
  EXPECT_FALSE((std::is_invocable_v<decltype(three)&, X&>));
  auto single = [](auto v) { return v * 1.f; };
  auto single_two = pmap::pmap(single, pmap::out_axes(0, 1), on(rt));
  EXPECT_FALSE((std::is_invocable_v<decltype(single_two)&, X&>));
  auto single_one = pmap::pmap(single, pmap::out_axes(1), on(rt));
  EXPECT_TRUE((std::is_invocable_v<decltype(single_one)&, X&>));
  X x = make<X>(0, 2, 2);
  pmap::Options o = on(rt);
  o.check_replicated = false;
  auto r = pmap::pmap(pair, pmap::out_axes(0, pmap::none), o)(x);
  EXPECT_EQ(std::get<1>(r)(), x(0, 0));
}

// ---- a kernel that returns nothing -------------------------------------------------------
// SPEC 2.2 does not list void; a kernel that only has side effects is accepted and the call
// returns void (as Taskflow / tbb::parallel_for bodies do).

TEST_P(Outputs, VoidKernelIsAcceptedAndCallReturnsVoid) {
  auto x = make<Tensor<float, 1, RowMajor>>(1, n());
  auto seen = slots<float>(n(), -1.f);
  auto f = pmap::pmap([&seen](pmap::Context& ctx, auto v) { seen[static_cast<std::size_t>(ctx.axis_index())] = v(); },
                      opts());
  // Dependent, so that a library rejecting void kernels fails this test instead of the build.
  auto check = [&](auto& m) {
    using M = std::remove_reference_t<decltype(m)>;
    if constexpr (std::is_invocable_v<M&, Tensor<float, 1, RowMajor>&>) {
      EXPECT_TRUE((std::is_void_v<std::invoke_result_t<M&, Tensor<float, 1, RowMajor>&>>));
      invoke_or_fail(m, x);
      for (int i = 0; i < n(); ++i) EXPECT_EQ(seen[static_cast<std::size_t>(i)], x(i));
    } else {
      ADD_FAILURE() << "a void kernel is not invocable";
    }
  };
  check(f);
}

}  // namespace
