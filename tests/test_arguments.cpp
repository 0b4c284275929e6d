/// @file test_arguments.cpp
/// @brief What the kernel receives (SPEC 2.1), in_axes (SPEC 3.1), the Context axis
/// queries and the devices option (SPEC 3.4).

#include <algorithm>
#include <array>
#include <atomic>
#include <complex>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "test_util.hpp"

namespace {

using namespace pmap_test;

template <class T, int R, int L = ColMajor>
using Tensor = Eigen::Tensor<T, R, L>;

/// Serial reference of a one-argument map: stacks fn(x[i] along d) at axis 0.
template <class T, int R, int L, class F>
auto serial_map(const Tensor<T, R, L>& x, int d, F fn) {
  using Out = decltype(fn(slice(x, 0, d)));
  std::vector<Out> parts;
  for (Index i = 0; i < x.dimension(d); ++i) parts.push_back(fn(slice(x, i, d)));
  return stack(parts, 0);
}

/// Per-device record, indexed by axis index (each device writes only its own slot).
template <class T>
std::vector<T> slots(int count, T init) {
  return std::vector<T>(static_cast<std::size_t>(count), init);
}

class Arguments : public RuntimeTest {};
PMAP_TEST_INSTANTIATE(Arguments);

// ---- the view types ----------------------------------------------------------------------

TEST_P(Arguments, RowMajorTensorAxis0GivesRankMinusOneConstView) {
  auto x = make<Tensor<float, 2, RowMajor>>(1, n(), 3);
  // A non-generic kernel only compiles when the parameter type is exactly right.
  auto f = pmap::pmap([](View<float, 1, RowMajor> v) { return v * 2.f; }, opts());
  auto r = f(x);
  EXPECT_TRUE((std::is_same_v<decltype(r), Tensor<float, 2, RowMajor>>));
  Tensor<float, 2, RowMajor> expected = x * 2.f;
  EXPECT_TRUE(tensors_equal(r, expected));
}

TEST_P(Arguments, ColMajorTensorGivesColMajorView) {
  auto x = make<Tensor<double, 3, ColMajor>>(2, n(), 2, 3);
  auto f = pmap::pmap([](View<double, 2, ColMajor> v) { return v + 1.0; }, opts());
  auto r = f(x);
  EXPECT_TRUE((std::is_same_v<decltype(r), Tensor<double, 3, ColMajor>>));
  auto expected =
      serial_map(x, 0, [](const Tensor<double, 2>& s) { return Tensor<double, 2>(s + 1.0); });
  EXPECT_TRUE(tensors_equal(r, expected));
}

TEST_P(Arguments, GenericKernelSeesExactViewType) {
  std::atomic<bool> ok{true};
  auto f = pmap::pmap(
      [&ok](auto v) {
        if (!std::is_same_v<decltype(v), View<int32_t, 2, RowMajor>>) ok = false;
        return v;
      },
      opts());
  auto x = make<Tensor<int32_t, 3, RowMajor>>(0, n(), 2, 2);
  auto r = f(x);
  EXPECT_TRUE(ok.load());
  EXPECT_TRUE(tensors_equal(r, x));
}

TEST_P(Arguments, ConstTensorArgument) {
  const Tensor<float, 2, RowMajor> x = make<Tensor<float, 2, RowMajor>>(3, n(), 4);
  auto f = pmap::pmap([](View<float, 1, RowMajor> v) { return v - 1.f; }, opts());
  Tensor<float, 2, RowMajor> expected = x - 1.f;
  EXPECT_TRUE(tensors_equal(f(x), expected));
}

TEST_P(Arguments, TemporaryTensorArgument) {
  auto f = pmap::pmap([](View<float, 1, RowMajor> v) { return v * 3.f; }, opts());
  auto r = f(make<Tensor<float, 2, RowMajor>>(1, n(), 2));
  Tensor<float, 2, RowMajor> expected = make<Tensor<float, 2, RowMajor>>(1, n(), 2) * 3.f;
  EXPECT_TRUE(tensors_equal(r, expected));
}

TEST_P(Arguments, TensorMapArguments) {
  std::vector<float> buffer(static_cast<std::size_t>(n() * 5));
  for (std::size_t k = 0; k < buffer.size(); ++k) buffer[k] = static_cast<float>(k) * 0.5f;
  Eigen::TensorMap<Tensor<float, 2, RowMajor>> m(buffer.data(), n(), 5);
  Eigen::TensorMap<const Tensor<float, 2, RowMajor>> cm(buffer.data(), n(), 5);
  const Eigen::TensorMap<Tensor<float, 2, RowMajor>> const_m(buffer.data(), n(), 5);

  auto ptrs = slots<const float*>(n(), nullptr);
  auto f = pmap::pmap(
      [&ptrs](pmap::Context& ctx, View<float, 1, RowMajor> a, View<float, 1, RowMajor> b,
              View<float, 1, RowMajor> c) {
        ptrs[static_cast<std::size_t>(ctx.axis_index())] = a.data();
        return a + b + c;
      },
      opts());
  auto r = f(m, cm, const_m);
  Tensor<float, 2, RowMajor> expected = m * 3.f;
  EXPECT_TRUE(tensors_equal(r, expected));
  for (int i = 0; i < n(); ++i) EXPECT_EQ(ptrs[static_cast<std::size_t>(i)], buffer.data() + 5 * i);
}

TEST_P(Arguments, ColMajorTensorMapArgument) {
  std::vector<int64_t> buffer(static_cast<std::size_t>(n() * 3));
  for (std::size_t k = 0; k < buffer.size(); ++k) buffer[k] = static_cast<int64_t>(k * 7);
  Eigen::TensorMap<Tensor<int64_t, 2, ColMajor>> m(buffer.data(), 3, n());
  auto f = pmap::pmap([](View<int64_t, 1, ColMajor> v) { return v * int64_t{2}; },
                      pmap::in_axes(1), opts());
  auto r = f(m);
  EXPECT_TRUE((std::is_same_v<decltype(r), Tensor<int64_t, 2, ColMajor>>));
  Tensor<int64_t, 2, ColMajor> x = m;
  auto expected =
      serial_map(x, 1, [](const Tensor<int64_t, 1>& s) { return Tensor<int64_t, 1>(s * int64_t{2}); });
  EXPECT_TRUE(tensors_equal(r, expected));
}

// ---- zero copy and staging ---------------------------------------------------------------

TEST_P(Arguments, RowMajorAxis0SlicesAreZeroCopy) {
  auto x = make<Tensor<float, 3, RowMajor>>(0, n(), 2, 3);
  auto ptrs = slots<const float*>(n(), nullptr);
  auto f = pmap::pmap(
      [&ptrs](pmap::Context& ctx, auto v) {
        ptrs[static_cast<std::size_t>(ctx.axis_index())] = v.data();
        return v;
      },
      opts());
  auto r = f(x);
  EXPECT_TRUE(tensors_equal(r, x));
  for (int i = 0; i < n(); ++i) {
    EXPECT_TRUE(points_inside(ptrs[static_cast<std::size_t>(i)], x.data(), x.size()));
    EXPECT_EQ(ptrs[static_cast<std::size_t>(i)], x.data() + 6 * i);
  }
}

TEST_P(Arguments, ColMajorLastAxisSlicesAreZeroCopy) {
  auto x = make<Tensor<float, 3, ColMajor>>(0, 2, 3, n());
  auto ptrs = slots<const float*>(n(), nullptr);
  auto f = pmap::pmap(
      [&ptrs](pmap::Context& ctx, auto v) {
        ptrs[static_cast<std::size_t>(ctx.axis_index())] = v.data();
        return v;
      },
      pmap::in_axes(-1), opts());
  auto r = f(x);
  auto expected = serial_map(x, 2, [](const Tensor<float, 2>& s) { return s; });
  EXPECT_TRUE(tensors_equal(r, expected));
  for (int i = 0; i < n(); ++i) EXPECT_EQ(ptrs[static_cast<std::size_t>(i)], x.data() + 6 * i);
}

TEST_P(Arguments, SlicesWithOnlyUnitDimensionsOutsideAreZeroCopy) {
  // Axis 1 of a RowMajor [1, n, 4] and of a ColMajor [4, n, 1]: one run of memory each, as
  // the leading-axis slices are; empty slices ([n, 0]) are views of the empty tensor.
  auto xr = make<Tensor<float, 3, RowMajor>>(3, 1, n(), 4);
  auto xc = make<Tensor<float, 3, ColMajor>>(4, 4, n(), 1);
  Tensor<float, 2, RowMajor> empty(n(), 0);
  auto pr = slots<const float*>(n(), nullptr), pc = pr;
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, View<float, 2, RowMajor> a, View<float, 2, ColMajor> b,
          View<float, 1, RowMajor> e) {
        const auto me = static_cast<std::size_t>(ctx.axis_index());
        pr[me] = a.data();
        pc[me] = b.data();
        EXPECT_EQ(e.size(), 0);
        return std::make_tuple(a * 1.f, b * 1.f);
      },
      pmap::in_axes(1, 1, 0), opts());
  auto [ra, rb] = f(xr, xc, empty);
  EXPECT_TRUE(tensors_equal(ra, serial_map(xr, 1, [](const Tensor<float, 2, RowMajor>& s) { return s; })));
  EXPECT_TRUE(tensors_equal(rb, serial_map(xc, 1, [](const Tensor<float, 2>& s) { return s; })));
  for (int i = 0; i < n(); ++i) {
    EXPECT_EQ(pr[static_cast<std::size_t>(i)], xr.data() + 4 * i);
    EXPECT_EQ(pc[static_cast<std::size_t>(i)], xc.data() + 4 * i);
  }
}

TEST_P(Arguments, NonContiguousSlicesAreGatheredCorrectly) {
  // Axis 1 of a RowMajor and axis 0 of a ColMajor tensor are strided: staged copies.
  auto xr = make<Tensor<float, 3, RowMajor>>(1, 3, n(), 2);
  auto xc = make<Tensor<float, 3, ColMajor>>(2, n(), 3, 2);
  auto f = pmap::pmap(
      [](View<float, 2, RowMajor> a, View<float, 2, ColMajor> b) {
        return std::make_tuple(a * 1.f, b * 1.f);
      },
      pmap::in_axes(1, 0), opts());
  auto [ra, rb] = f(xr, xc);
  EXPECT_TRUE(tensors_equal(ra, serial_map(xr, 1, [](const Tensor<float, 2, RowMajor>& s) { return s; })));
  EXPECT_TRUE(tensors_equal(rb, serial_map(xc, 0, [](const Tensor<float, 2>& s) { return s; })));
}

TEST_P(Arguments, InputIsNotModified) {
  auto x = make<Tensor<float, 2, RowMajor>>(4, 3, n());
  const Tensor<float, 2, RowMajor> copy = x;
  auto f = pmap::pmap([](auto v) { return v * 2.f; }, pmap::in_axes(1), opts());
  (void)f(x);
  EXPECT_TRUE(tensors_equal(x, copy));
}

// ---- in_axes -----------------------------------------------------------------------------

TEST_P(Arguments, EveryAxisOfARank3Tensor) {
  auto x = make<Tensor<float, 3, RowMajor>>(5, n(), n(), n());
  auto f_copy = [](const Tensor<float, 2, RowMajor>& s) { return s; };
  for (int d : {0, 1, 2, -1, -2, -3}) {
    const int nd = d < 0 ? d + 3 : d;
    auto f = pmap::pmap([](auto v) { return v; }, pmap::in_axes(d), opts());
    EXPECT_TRUE(tensors_equal(f(x), serial_map(x, nd, f_copy))) << "in_axes(" << d << ")";
  }
}

TEST_P(Arguments, OneEntryPerArgumentMixingAxes) {
  auto a = make<Tensor<float, 2, RowMajor>>(1, n(), 3);      // axis 0
  auto b = make<Tensor<float, 2, RowMajor>>(2, 3, n());      // axis 1
  auto c = make<Tensor<float, 3, ColMajor>>(3, 3, 1, n());   // last axis, as -1
  auto d = make<Tensor<float, 1, RowMajor>>(4, 3);           // broadcast
  auto f = pmap::pmap(
      [](View<float, 1, RowMajor> va, View<float, 1, RowMajor> vb, View<float, 2, ColMajor> vc,
         View<float, 1, RowMajor> vd) {
        Eigen::Tensor<float, 0, RowMajor> s = va.sum() + vb.sum() + vd.sum();
        Eigen::Tensor<float, 0, ColMajor> t = vc.sum();
        return s() * 2.f + t();
      },
      pmap::in_axes(0, 1, -1, pmap::none), opts());
  auto r = f(a, b, c, d);
  EXPECT_TRUE((std::is_same_v<decltype(r), Tensor<float, 1, RowMajor>>));
  std::vector<float> expected;
  for (Index i = 0; i < ni(); ++i) {
    Tensor<float, 0, RowMajor> s = slice(a, i, 0).sum() + slice(b, i, 1).sum() + d.sum();
    Tensor<float, 0, ColMajor> t = slice(c, i, 2).sum();
    expected.push_back(s() * 2.f + t());
  }
  EXPECT_TRUE(tensors_equal(r, stack_scalars(expected)));
}

TEST_P(Arguments, OneEntryAppliesToEveryArgument) {
  auto a = make<Tensor<float, 2, RowMajor>>(1, 2, n());
  auto b = make<Tensor<float, 3, RowMajor>>(2, 2, n(), 2);
  auto f = pmap::pmap(
      [](View<float, 1, RowMajor> va, View<float, 2, RowMajor> vb) {
        return std::make_tuple(va * 1.f, vb * 1.f);
      },
      pmap::in_axes(1), opts());
  auto [ra, rb] = f(a, b);
  EXPECT_TRUE(tensors_equal(ra, serial_map(a, 1, [](const Tensor<float, 1, RowMajor>& s) { return s; })));
  EXPECT_TRUE(tensors_equal(rb, serial_map(b, 1, [](const Tensor<float, 2, RowMajor>& s) { return s; })));
}

TEST_P(Arguments, NoneBroadcastsTheWholeTensorWithoutCopy) {
  auto x = make<Tensor<float, 1, RowMajor>>(1, n());
  auto w = make<Tensor<float, 2, RowMajor>>(2, 2, 3);
  auto ptrs = slots<const float*>(n(), nullptr);
  std::atomic<bool> ok{true};
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, auto xi, auto wv) {
        if (!std::is_same_v<decltype(wv), View<float, 2, RowMajor>>) ok = false;
        if (!std::is_same_v<decltype(xi), View<float, 0, RowMajor>>) ok = false;
        ptrs[static_cast<std::size_t>(ctx.axis_index())] = wv.data();
        return wv * xi();
      },
      pmap::in_axes(0, pmap::none), opts());
  auto r = f(x, w);
  EXPECT_TRUE(ok.load());
  std::vector<Tensor<float, 2, RowMajor>> parts;
  for (Index i = 0; i < ni(); ++i) parts.push_back(w * x(i));
  EXPECT_TRUE(tensors_equal(r, stack(parts, 0)));
  for (auto* p : ptrs) EXPECT_EQ(p, w.data());
}

struct Params {
  float scale;
  int offset;
};

struct Scale {
  float k;
  float operator()(float v) const { return v * k; }
};

TEST_P(Arguments, DefaultSpecBroadcastsNonTensorsByConstReference) {
  auto x = make<Tensor<float, 1, RowMajor>>(0, n());
  const float s = 2.5f;
  const Params p{3.f, 4};
  const Scale fn{0.5f};
  const std::string label = "label";
  auto s_ptrs = slots<const void*>(n(), nullptr);
  auto p_ptrs = slots<const void*>(n(), nullptr);
  auto fn_ptrs = slots<const void*>(n(), nullptr);
  auto str_ptrs = slots<const void*>(n(), nullptr);
  std::atomic<bool> ok{true};
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, auto xi, auto&& sv, auto&& pv, auto&& fv, auto&& str) {
        if (!std::is_same_v<decltype(sv), const float&>) ok = false;
        if (!std::is_same_v<decltype(pv), const Params&>) ok = false;
        if (!std::is_same_v<decltype(fv), const Scale&>) ok = false;
        if (!std::is_same_v<decltype(str), const std::string&>) ok = false;
        const auto i = static_cast<std::size_t>(ctx.axis_index());
        s_ptrs[i] = &sv;
        p_ptrs[i] = &pv;
        fn_ptrs[i] = &fv;
        str_ptrs[i] = &str;
        return fv(xi() * sv * pv.scale + static_cast<float>(pv.offset)) +
               static_cast<float>(str.size());
      },
      opts());
  auto r = f(x, s, p, fn, label);
  EXPECT_TRUE(ok.load());
  std::vector<float> expected;
  for (Index i = 0; i < ni(); ++i) expected.push_back(fn(x(i) * s * p.scale + 4.f) + 5.f);
  EXPECT_TRUE(tensors_equal(r, stack_scalars(expected)));
  for (int i = 0; i < n(); ++i) {
    const auto k = static_cast<std::size_t>(i);
    EXPECT_EQ(s_ptrs[k], &s);
    EXPECT_EQ(p_ptrs[k], &p);
    EXPECT_EQ(fn_ptrs[k], &fn);
    EXPECT_EQ(str_ptrs[k], &label);
  }
}

TEST_P(Arguments, NonConstScalarsAreStillBroadcastByConstReference) {
  auto x = make<Tensor<double, 1, RowMajor>>(0, n());
  double s = 1.5;
  auto ptrs = slots<const double*>(n(), nullptr);
  auto f = pmap::pmap(
      [&ptrs](pmap::Context& ctx, auto xi, const double& sv) {
        ptrs[static_cast<std::size_t>(ctx.axis_index())] = &sv;
        return xi() + sv;
      },
      pmap::in_axes(0, pmap::none), opts());
  auto r = f(x, s);
  Tensor<double, 1, RowMajor> expected = x + s;
  EXPECT_TRUE(tensors_equal(r, expected));
  for (auto* p : ptrs) EXPECT_EQ(p, &s);
}

TEST_P(Arguments, VectorOfScalarsIsBroadcastNotMapped) {
  auto x = make<Tensor<float, 1, RowMajor>>(0, n());
  const std::vector<float> weights{1.f, 2.f, 3.f};
  auto ptrs = slots<const void*>(n(), nullptr);
  auto f = pmap::pmap(
      [&ptrs](pmap::Context& ctx, auto xi, const std::vector<float>& w) {
        ptrs[static_cast<std::size_t>(ctx.axis_index())] = &w;
        return xi() * w[2];
      },
      opts());
  auto r = f(x, weights);
  Tensor<float, 1, RowMajor> expected = x * 3.f;
  EXPECT_TRUE(tensors_equal(r, expected));
  for (auto* p : ptrs) EXPECT_EQ(p, &weights);
}

// ---- containers --------------------------------------------------------------------------

TEST_P(Arguments, VectorOfTensors) {
  std::vector<Tensor<float, 2, RowMajor>> xs{make<Tensor<float, 2, RowMajor>>(1, n(), 2),
                                             make<Tensor<float, 2, RowMajor>>(2, n(), 2),
                                             make<Tensor<float, 2, RowMajor>>(3, n(), 2)};
  std::atomic<bool> ok{true};
  auto f = pmap::pmap(
      [&ok](const auto& v) {
        if (!std::is_same_v<std::remove_cvref_t<decltype(v)>, std::vector<View<float, 1, RowMajor>>>)
          ok = false;
        Tensor<float, 1, RowMajor> acc = v[0] * 1.f;
        for (std::size_t k = 1; k < v.size(); ++k) acc += v[k] * static_cast<float>(k + 1);
        return acc;
      },
      opts());
  auto r = f(xs);
  EXPECT_TRUE(ok.load());
  Tensor<float, 2, RowMajor> expected = xs[0] + xs[1] * 2.f + xs[2] * 3.f;
  EXPECT_TRUE(tensors_equal(r, expected));
}

TEST_P(Arguments, VectorOfTensorsLeavesAreZeroCopy) {
  std::vector<Tensor<float, 2, RowMajor>> xs{make<Tensor<float, 2, RowMajor>>(1, n(), 2),
                                             make<Tensor<float, 2, RowMajor>>(2, n(), 2)};
  auto p0 = slots<const float*>(n(), nullptr);
  auto p1 = slots<const float*>(n(), nullptr);
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, const std::vector<View<float, 1, RowMajor>>& v) {
        p0[static_cast<std::size_t>(ctx.axis_index())] = v[0].data();
        p1[static_cast<std::size_t>(ctx.axis_index())] = v[1].data();
        return v[0] + v[1];
      },
      opts());
  (void)f(xs);
  for (int i = 0; i < n(); ++i) {
    EXPECT_EQ(p0[static_cast<std::size_t>(i)], xs[0].data() + 2 * i);
    EXPECT_EQ(p1[static_cast<std::size_t>(i)], xs[1].data() + 2 * i);
  }
}

TEST_P(Arguments, ArrayOfTensorsWithInAxis1) {
  std::array<Tensor<int32_t, 2, RowMajor>, 2> xs{make<Tensor<int32_t, 2, RowMajor>>(1, 3, n()),
                                                 make<Tensor<int32_t, 2, RowMajor>>(2, 3, n())};
  auto f = pmap::pmap(
      [](const std::array<View<int32_t, 1, RowMajor>, 2>& v) { return v[0] - v[1]; },
      pmap::in_axes(1), opts());
  auto r = f(xs);
  Tensor<int32_t, 2, RowMajor> diff = xs[0] - xs[1];
  EXPECT_TRUE(tensors_equal(r, serial_map(diff, 1, [](const Tensor<int32_t, 1, RowMajor>& s) { return s; })));
}

TEST_P(Arguments, TupleOfMixedTensors) {
  std::tuple<Tensor<float, 2, RowMajor>, Tensor<double, 3, ColMajor>> xs{
      make<Tensor<float, 2, RowMajor>>(1, n(), 3), make<Tensor<double, 3, ColMajor>>(2, n(), 2, 2)};
  auto f = pmap::pmap(
      [](const std::tuple<View<float, 1, RowMajor>, View<double, 2, ColMajor>>& t) {
        Tensor<float, 0, RowMajor> a = std::get<0>(t).sum();
        Tensor<double, 0, ColMajor> b = std::get<1>(t).sum();
        return static_cast<double>(a()) + b();
      },
      opts());
  auto r = f(xs);
  std::vector<double> expected;
  for (Index i = 0; i < ni(); ++i) {
    Tensor<float, 0, RowMajor> a = slice(std::get<0>(xs), i, 0).sum();
    Tensor<double, 0, ColMajor> b = slice(std::get<1>(xs), i, 0).sum();
    expected.push_back(static_cast<double>(a()) + b());
  }
  EXPECT_TRUE(tensors_equal(r, stack_scalars(expected)));
}

TEST_P(Arguments, NestedContainers) {
  using Pair = std::array<Tensor<float, 2, RowMajor>, 2>;
  std::vector<Pair> xs;
  for (int k = 0; k < 3; ++k)
    xs.push_back(Pair{make<Tensor<float, 2, RowMajor>>(k, n(), 2), make<Tensor<float, 2, RowMajor>>(10 + k, n(), 2)});
  std::tuple<std::vector<Tensor<float, 1, RowMajor>>, Tensor<float, 1, RowMajor>> tv{
      {make<Tensor<float, 1, RowMajor>>(20, n())}, make<Tensor<float, 1, RowMajor>>(21, n())};
  std::atomic<bool> ok{true};
  auto f = pmap::pmap(
      [&ok](const auto& v, const auto& t) {
        using V = std::vector<std::array<View<float, 1, RowMajor>, 2>>;
        using T = std::tuple<std::vector<View<float, 0, RowMajor>>, View<float, 0, RowMajor>>;
        if (!std::is_same_v<std::remove_cvref_t<decltype(v)>, V>) ok = false;
        if (!std::is_same_v<std::remove_cvref_t<decltype(t)>, T>) ok = false;
        Tensor<float, 1, RowMajor> acc(2);
        acc.setZero();
        for (const auto& pair : v) acc += pair[0] * pair[1];
        acc = acc + std::get<0>(t)[0]() + std::get<1>(t)();
        return acc;
      },
      opts());
  auto r = f(xs, tv);
  EXPECT_TRUE(ok.load());
  std::vector<Tensor<float, 1, RowMajor>> parts;
  for (Index i = 0; i < ni(); ++i) {
    Tensor<float, 1, RowMajor> acc(2);
    acc.setZero();
    for (const auto& pair : xs) acc += slice(pair[0], i, 0) * slice(pair[1], i, 0);
    parts.push_back(acc + std::get<0>(tv)[0](i) + std::get<1>(tv)(i));
  }
  EXPECT_TRUE(tensors_equal(r, stack(parts, 0)));
}

TEST_P(Arguments, ContainerBroadcastWithNone) {
  auto x = make<Tensor<float, 1, RowMajor>>(0, n());
  std::vector<Tensor<float, 2, RowMajor>> ws{make<Tensor<float, 2, RowMajor>>(1, 2, 2),
                                             make<Tensor<float, 2, RowMajor>>(2, 2, 2)};
  auto ptrs = slots<const float*>(n(), nullptr);
  auto f = pmap::pmap(
      [&ptrs](pmap::Context& ctx, View<float, 0, RowMajor> xi,
              const std::vector<View<float, 2, RowMajor>>& w) {
        ptrs[static_cast<std::size_t>(ctx.axis_index())] = w[1].data();
        return (w[0] + w[1]) * xi();
      },
      pmap::in_axes(0, pmap::none), opts());
  auto r = f(x, ws);
  std::vector<Tensor<float, 2, RowMajor>> parts;
  for (Index i = 0; i < ni(); ++i) parts.push_back((ws[0] + ws[1]) * x(i));
  EXPECT_TRUE(tensors_equal(r, stack(parts, 0)));
  for (auto* p : ptrs) EXPECT_EQ(p, ws[1].data());
}

// ---- scalar types ------------------------------------------------------------------------

template <class T>
void check_scalar_type(pmap::Options o, int count) {
  SCOPED_TRACE(typeid(T).name());
  auto x = make<Tensor<T, 2, RowMajor>>(1, count, 3);
  auto xc = make<Tensor<T, 2, ColMajor>>(2, 3, count);
  const T b = value_at<T>(5, 1);
  auto b_ptrs = slots<const T*>(count, nullptr);
  auto f = pmap::pmap(
      [&b_ptrs](pmap::Context& ctx, View<T, 1, RowMajor> v, View<T, 1, ColMajor> w, const T& bv) {
        b_ptrs[static_cast<std::size_t>(ctx.axis_index())] = &bv;
        return std::make_tuple(v, w);
      },
      pmap::in_axes(0, 1, pmap::none), o);
  auto [rv, rw] = f(x, xc, b);
  EXPECT_TRUE((std::is_same_v<decltype(rv), Tensor<T, 2, RowMajor>>));
  EXPECT_TRUE((std::is_same_v<decltype(rw), Tensor<T, 2, ColMajor>>));
  EXPECT_TRUE(tensors_equal(rv, x));
  EXPECT_TRUE(tensors_equal(rw, serial_map(xc, 1, [](const Tensor<T, 1>& s) { return s; })));
  for (auto* p : b_ptrs) EXPECT_EQ(p, &b);
}

TEST_P(Arguments, ScalarTypes) {
  check_scalar_type<float>(opts(), n());
  check_scalar_type<double>(opts(), n());
  check_scalar_type<int32_t>(opts(), n());
  check_scalar_type<int64_t>(opts(), n());
  check_scalar_type<bool>(opts(), n());
  check_scalar_type<std::complex<float>>(opts(), n());
}

TEST_P(Arguments, ComplexArithmetic) {
  auto x = make<Tensor<std::complex<float>, 2, RowMajor>>(1, n(), 2);
  const std::complex<float> k{0.f, 1.f};
  auto f = pmap::pmap([k](View<std::complex<float>, 1, RowMajor> v) { return v * k; }, opts());
  Tensor<std::complex<float>, 2, RowMajor> expected = x * k;
  EXPECT_TRUE(tensors_equal(f(x), expected));
}

// ---- kernel forms ------------------------------------------------------------------------

float free_kernel(View<float, 1, RowMajor> v) {
  Tensor<float, 0, RowMajor> s = v.sum();
  return s();
}

struct FunctorKernel {
  float k;
  auto operator()(View<float, 1, RowMajor> v) const { return v * k; }
};

struct ContextFunctor {
  float operator()(pmap::Context& ctx, View<float, 1, RowMajor> v) const {
    return v(0) + static_cast<float>(ctx.axis_index());
  }
};

TEST_P(Arguments, KernelForms) {
  auto x = make<Tensor<float, 2, RowMajor>>(1, n(), 3);
  std::vector<float> sums;
  std::vector<float> firsts;
  for (Index i = 0; i < ni(); ++i) {
    sums.push_back(free_kernel(View<float, 1, RowMajor>(x.data() + 3 * i, 3)));
    firsts.push_back(x(i, 0) + static_cast<float>(i));
  }
  Tensor<float, 2, RowMajor> doubled = x * 2.f;

  EXPECT_TRUE(tensors_equal(pmap::pmap(&free_kernel, opts())(x), stack_scalars(sums)));
  EXPECT_TRUE(tensors_equal(pmap::pmap(free_kernel, opts())(x), stack_scalars(sums)));
  EXPECT_TRUE(tensors_equal(pmap::pmap(FunctorKernel{2.f}, opts())(x), doubled));
  const FunctorKernel fk{2.f};
  EXPECT_TRUE(tensors_equal(pmap::pmap(fk, opts())(x), doubled));
  std::function<float(View<float, 1, RowMajor>)> sf = free_kernel;
  EXPECT_TRUE(tensors_equal(pmap::pmap(sf, opts())(x), stack_scalars(sums)));
  EXPECT_TRUE(tensors_equal(pmap::pmap(ContextFunctor{}, opts())(x), stack_scalars(firsts)));
  auto with_ctx = [](pmap::Context& ctx, auto v) { return v(0) + static_cast<float>(ctx.axis_index()); };
  EXPECT_TRUE(tensors_equal(pmap::pmap(with_ctx, opts())(x), stack_scalars(firsts)));
  auto without_ctx = [](auto v) { return v * 2.f; };
  EXPECT_TRUE(tensors_equal(pmap::pmap(without_ctx, opts())(x), doubled));
}

TEST_P(Arguments, MappedIsReusableAndCopyable) {
  auto x = make<Tensor<float, 1, RowMajor>>(1, n());
  auto f = pmap::pmap([](auto v) { return v() + 1.f; }, opts());
  auto g = f;
  Tensor<float, 1, RowMajor> expected = x + 1.f;
  EXPECT_TRUE(tensors_equal(f(x), expected));
  EXPECT_TRUE(tensors_equal(g(x), expected));
  EXPECT_TRUE(tensors_equal(f(x), expected));
}

// ---- Context -----------------------------------------------------------------------------

TEST_P(Arguments, ContextAxisQueries) {
  auto x = make<Tensor<float, 1, RowMajor>>(0, n());
  auto index = slots<int>(n(), -1);
  auto size = slots<int>(n(), -1);
  auto devs = slots<pmap::Device>(n(), pmap::Device{-1, -1});
  auto f = pmap::pmap(
      [&](pmap::Context& ctx, auto v) {
        const auto i = static_cast<std::size_t>(ctx.axis_index());
        index[i] = ctx.axis_index();
        size[i] = ctx.axis_size();
        devs[i] = ctx.device();
        return v() * 0.f + static_cast<float>(ctx.axis_index());
      },
      opts());
  auto r = f(x);
  for (int i = 0; i < n(); ++i) {
    const auto k = static_cast<std::size_t>(i);
    EXPECT_EQ(index[k], i);
    EXPECT_EQ(size[k], n());
    EXPECT_EQ(devs[k], rt().devices()[k]);
    EXPECT_EQ(r(i), static_cast<float>(i));
  }
}

TEST_P(Arguments, ContextNamedAxis) {
  auto x = make<Tensor<float, 1, RowMajor>>(0, n());
  std::atomic<int> bad{0};
  pmap::Options o = opts();
  o.axis_name = "i";
  auto f = pmap::pmap(
      [&bad](pmap::Context& ctx, auto v) {
        if (ctx.axis_index("i") != ctx.axis_index()) bad.fetch_add(1);
        if (ctx.axis_size("i") != ctx.axis_size()) bad.fetch_add(1);
        if (ctx.axis_index(std::string("i")) != ctx.axis_index()) bad.fetch_add(1);
        if (ctx.axis_index(std::string_view("i")) != ctx.axis_index()) bad.fetch_add(1);
        if (ctx.axis_index({"i"}) != ctx.axis_index()) bad.fetch_add(1);
        return v() + static_cast<float>(ctx.axis_index("i") * 10 + ctx.axis_size("i"));
      },
      o);
  auto r = f(x);
  EXPECT_EQ(bad.load(), 0);
  for (int i = 0; i < n(); ++i) EXPECT_EQ(r(i), x(i) + static_cast<float>(i * 10 + n()));
}

TEST_P(Arguments, AxisSizeFollowsTheBatchNotTheDeviceCount) {
  for (int count = 1; count <= n(); ++count) {
    auto x = make<Tensor<float, 1, RowMajor>>(0, count);
    auto f = pmap::pmap([](pmap::Context& ctx, auto v) { return v() * 0.f + static_cast<float>(ctx.axis_size()); },
                        opts());
    auto r = f(x);
    for (int i = 0; i < count; ++i) EXPECT_EQ(r(i), static_cast<float>(count));
  }
}

// ---- devices -----------------------------------------------------------------------------

TEST_P(Arguments, DevicesOptionKeepsOrder) {
  std::vector<pmap::Device> order(rt().devices().rbegin(), rt().devices().rend());
  auto x = make<Tensor<float, 2, RowMajor>>(3, n(), 2);
  auto seen = slots<pmap::Device>(n(), pmap::Device{-1, -1});
  pmap::Options o = opts();
  o.devices = order;
  auto f = pmap::pmap(
      [&seen](pmap::Context& ctx, auto v) {
        seen[static_cast<std::size_t>(ctx.axis_index())] = ctx.device();
        return v * 2.f;
      },
      o);
  auto r = f(x);
  Tensor<float, 2, RowMajor> expected = x * 2.f;
  EXPECT_TRUE(tensors_equal(r, expected));
  for (int i = 0; i < n(); ++i) EXPECT_EQ(seen[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(i)]);
}

TEST_P(Arguments, DevicesOptionSubset) {
  // Every other device, starting from the last one.
  std::vector<pmap::Device> subset;
  for (int k = n() - 1; k >= 0; k -= 2) subset.push_back(rt().devices()[static_cast<std::size_t>(k)]);
  const int count = static_cast<int>(subset.size());
  auto x = make<Tensor<float, 1, RowMajor>>(3, count);
  auto seen = slots<pmap::Device>(count, pmap::Device{-1, -1});
  pmap::Options o = opts();
  o.devices = subset;
  auto f = pmap::pmap(
      [&seen](pmap::Context& ctx, auto v) {
        seen[static_cast<std::size_t>(ctx.axis_index())] = ctx.device();
        return v() + static_cast<float>(ctx.axis_size());
      },
      o);
  auto r = f(x);
  Tensor<float, 1, RowMajor> expected = x + static_cast<float>(count);
  EXPECT_TRUE(tensors_equal(r, expected));
  EXPECT_EQ(seen, subset);
}

TEST_P(Arguments, DevicesOptionRejectsForeignDevices) {
  auto x = make<Tensor<float, 1, RowMajor>>(0, 1);
  pmap::Options o = opts();
  o.devices = std::vector<pmap::Device>{pmap::Device{n() + 3, 0}};
  std::atomic<int> runs{0};
  auto kernel = [&runs](auto v) {
    runs.fetch_add(1);
    return v();
  };
  (void)catch_message<pmap::ValueError>([&] { (void)pmap::pmap(kernel, o)(x); });
  o.devices = std::vector<pmap::Device>{pmap::Device{0, 1}};  // another process
  (void)catch_message<pmap::ValueError>([&] { (void)pmap::pmap(kernel, o)(x); });
  EXPECT_EQ(runs.load(), 0);
}

TEST_P(Arguments, DevicesOptionRejectsDuplicates) {
  auto x = make<Tensor<float, 1, RowMajor>>(0, 2);
  pmap::Options o = opts();
  o.devices = std::vector<pmap::Device>{rt().devices()[0], rt().devices()[0]};
  std::atomic<int> runs{0};
  auto kernel = [&runs](auto v) {
    runs.fetch_add(1);
    return v();
  };
  (void)catch_message<pmap::ValueError>([&] { (void)pmap::pmap(kernel, o)(x); });
  EXPECT_EQ(runs.load(), 0);
}

// ---- E9: the in_axes count is part of the type -------------------------------------------

TEST(InAxesCount, WrongCountIsNotInvocable) {
  pmap::Runtime rt({.num_devices = 2, .num_threads = 1});
  using X = Tensor<float, 2, RowMajor>;
  auto k = [](const auto&...) { return 1.f; };

  auto two = pmap::pmap(k, pmap::in_axes(0, pmap::none), on(rt));
  using Two = decltype(two);
  EXPECT_TRUE((std::is_invocable_v<Two&, X&, float&>));
  EXPECT_FALSE((std::is_invocable_v<Two&, X&>));
  EXPECT_FALSE((std::is_invocable_v<Two&, X&, float&, X&>));

  auto three = pmap::pmap(k, pmap::in_axes(0, 1, -1), on(rt));
  using Three = decltype(three);
  EXPECT_TRUE((std::is_invocable_v<Three&, X&, X&, X&>));
  EXPECT_FALSE((std::is_invocable_v<Three&, X&, X&>));
  EXPECT_FALSE((std::is_invocable_v<Three&, X&, X&, X&, X&>));

  // One entry applies to every argument; no spec maps every tensor at 0.
  auto one = pmap::pmap(k, pmap::in_axes(0), on(rt));
  EXPECT_TRUE((std::is_invocable_v<decltype(one)&, X&>));
  EXPECT_TRUE((std::is_invocable_v<decltype(one)&, X&, X&>));
  EXPECT_TRUE((std::is_invocable_v<decltype(one)&, X&, X&, X&>));
  auto dflt = pmap::pmap(k, on(rt));
  EXPECT_TRUE((std::is_invocable_v<decltype(dflt)&, X&>));
  EXPECT_TRUE((std::is_invocable_v<decltype(dflt)&, X&, float&, X&>));

  // The valid ones run.
  X x = make<X>(0, 2, 2);
  float s = 1.f;
  auto r = two(x, s);
  EXPECT_EQ(r.dimension(0), 2);
  auto r3 = three(x, x, x);
  EXPECT_EQ(r3.dimension(0), 2);
}

}  // namespace
