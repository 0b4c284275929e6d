/// @file test_validation.cpp
/// @brief Validation errors of SPEC 5 (E1-E8, E10, E13): type, exact message, no kernel
/// run, nothing written, and the legacy order when several apply.

#include <array>
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
using F1 = Tensor<float, 1, RowMajor>;
using F2 = Tensor<float, 2, RowMajor>;

/// A kernel that accepts anything, counts its runs and returns a scalar.
auto counted(std::atomic<int>& runs) {
  return [&runs](const auto&...) {
    runs.fetch_add(1);
    return 1.f;
  };
}

TEST(ErrorTypes, Hierarchy) {
  EXPECT_TRUE((std::is_base_of_v<std::invalid_argument, pmap::Error>));
  EXPECT_TRUE((std::is_base_of_v<pmap::Error, pmap::ValueError>));
  EXPECT_TRUE((std::is_base_of_v<pmap::Error, pmap::TypeError>));
  EXPECT_TRUE((std::is_base_of_v<pmap::Error, pmap::NameError>));
  EXPECT_TRUE((std::is_base_of_v<std::runtime_error, pmap::DeviceError>));
  EXPECT_FALSE((std::is_base_of_v<pmap::Error, pmap::DeviceError>));
}

class Validation : public RuntimeTest {
 protected:
  pmap::Options named(std::string name) const {
    pmap::Options o = opts();
    o.name = std::move(name);
    return o;
  }
  pmap::Options sized(std::int64_t size) const {
    pmap::Options o = opts();
    o.axis_size = size;
    return o;
  }
  std::atomic<int> runs_{0};
};
PMAP_TEST_INSTANTIATE(Validation);

// ---- E1 ----------------------------------------------------------------------------------

TEST_P(Validation, E1EmptyDevicesRaisedByPmap) {
  const std::string msg = "'devices' argument to pmap must be non-empty, or None.";
  pmap::Options o = opts();
  o.devices = std::vector<pmap::Device>{};
  expect_validation_error<pmap::ValueError>([&] { (void)pmap::pmap(counted(runs_), o); }, msg);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), pmap::in_axes(0), o); }, msg);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), pmap::out_axes(0), o); }, msg);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), pmap::in_axes(0), pmap::out_axes(0), o); }, msg);
  EXPECT_EQ(runs_.load(), 0);
}

// ---- E2 ----------------------------------------------------------------------------------

TEST_P(Validation, E2NoArguments) {
  auto f = pmap::pmap(counted(runs_), opts());
  expect_validation_error<pmap::ValueError>(
      [&] { invoke_or_fail(f); },
      "pmap wrapped function must be passed at least one argument containing an array, got none.");
  auto g = pmap::pmap(counted(runs_), named("my_fn"));
  expect_validation_error<pmap::ValueError>(
      [&] { invoke_or_fail(g); },
      "my_fn wrapped function must be passed at least one argument containing an array, got none.");
  EXPECT_EQ(runs_.load(), 0);
}

// ---- E3 ----------------------------------------------------------------------------------

std::string e3(const std::string& name, int d, int at_least, int rank, const std::string& shape) {
  return name + " was requested to map its argument along axis " + std::to_string(d) +
         ", which implies that its rank should be at least " + std::to_string(at_least) +
         ", but is only " + std::to_string(rank) + " (its shape is " + shape + ")";
}

TEST_P(Validation, E3RankTooSmall) {
  F1 v = make<F1>(0, 3);
  F2 m = make<F2>(0, 10, 4);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), pmap::in_axes(1), opts())(v); },
      e3("pmap", 1, 2, 1, "(3,)"));
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), pmap::in_axes(2), opts())(m); },
      e3("pmap", 2, 3, 2, "(10, 4)"));
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), pmap::in_axes(5), named("my_fn"))(m); },
      e3("my_fn", 5, 6, 2, "(10, 4)"));
  EXPECT_EQ(runs_.load(), 0);
}

TEST_P(Validation, E3NegativeAxis) {
  F1 v = make<F1>(0, 3);
  F2 m = make<F2>(0, 10, 4);
  Tensor<double, 3, ColMajor> t = make<Tensor<double, 3, ColMajor>>(0, 2, 3, 4);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), pmap::in_axes(-2), opts())(v); },
      e3("pmap", -2, 2, 1, "(3,)"));
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), pmap::in_axes(-3), opts())(m); },
      e3("pmap", -3, 3, 2, "(10, 4)"));
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), pmap::in_axes(-4), opts())(t); },
      e3("pmap", -4, 4, 3, "(2, 3, 4)"));
  EXPECT_EQ(runs_.load(), 0);
}

TEST_P(Validation, E3ScalarWithIntAxis) {
  // SPEC 3.1: an int for a non-tensor argument is E3 (rank 0).
  F1 v = make<F1>(0, n());
  float s = 2.f;
  auto f = pmap::pmap(counted(runs_), pmap::in_axes(0, 0), opts());
  expect_validation_error<pmap::ValueError>([&] { invoke_or_fail(f, v, s); },
                                            e3("pmap", 0, 1, 0, "()"));
  auto g = pmap::pmap(counted(runs_), pmap::in_axes(0), named("g"));
  expect_validation_error<pmap::ValueError>([&] { invoke_or_fail(g, v, s); },
                                            e3("g", 0, 1, 0, "()"));
  EXPECT_EQ(runs_.load(), 0);
}

TEST_P(Validation, E3LeafInsideAContainer) {
  std::tuple<F2, F1> t{make<F2>(0, 3, n()), make<F1>(1, 5)};
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), pmap::in_axes(1), opts())(t); },
      e3("pmap", 1, 2, 1, "(5,)"));
  EXPECT_EQ(runs_.load(), 0);
}

// ---- E4 / E4b ----------------------------------------------------------------------------

TEST_P(Validation, E4AllInAxesNone) {
  F1 v = make<F1>(0, n());
  F2 m = make<F2>(0, n(), 2);
  auto f = pmap::pmap(counted(runs_), pmap::in_axes(pmap::none), opts());
  expect_validation_error<pmap::ValueError>([&] { invoke_or_fail(f, v); },
                                            "pmap must have at least one non-None value in in_axes");
  auto g = pmap::pmap(counted(runs_), pmap::in_axes(pmap::none, pmap::none), named("my_fn"));
  expect_validation_error<pmap::ValueError>([&] { invoke_or_fail(g, v, m); },
                                            "my_fn must have at least one non-None value in in_axes");
  EXPECT_EQ(runs_.load(), 0);
}

TEST_P(Validation, E4bNoMappedLeaf) {
  const std::string msg = "pmap requires at least one argument with a mapped axis.";
  std::vector<F2> empty;
  std::array<F2, 0> none_array{};
  float s = 1.f;
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), opts())(empty); }, msg);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), pmap::in_axes(0), opts())(empty); }, msg);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), pmap::in_axes(1, pmap::none), opts())(empty, s); }, msg);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), opts())(none_array, empty); }, msg);
  EXPECT_EQ(runs_.load(), 0);
}

// ---- E5 ----------------------------------------------------------------------------------

const std::string kE5Head = "pmap got inconsistent sizes for array axes to be mapped:\n";

TEST_P(Validation, E5SpecExample) {
  F2 a = make<F2>(0, 10, 4);
  F2 b = make<F2>(0, 10, 2);
  F1 c = make<F1>(0, 10);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), pmap::in_axes(0, 1, 0), opts())(a, b, c); },
      kE5Head +
          "  * most axes (2 of them) had size 10, e.g. axis 0 of args[0] of type float32[10,4];\n"
          "  * one axis had size 2: axis 1 of args[1] of type float32[10,2]");
  EXPECT_EQ(runs_.load(), 0);
}

TEST_P(Validation, E5OneAxisEachInOrderOfAppearance) {
  F1 a = make<F1>(0, 3);
  F1 b = make<F1>(0, 4);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), opts())(a, b); },
      kE5Head +
          "  * one axis had size 3: axis 0 of args[0] of type float32[3];\n"
          "  * one axis had size 4: axis 0 of args[1] of type float32[4]");
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), opts())(b, a); },
      kE5Head +
          "  * one axis had size 4: axis 0 of args[0] of type float32[4];\n"
          "  * one axis had size 3: axis 0 of args[1] of type float32[3]");
  EXPECT_EQ(runs_.load(), 0);
}

TEST_P(Validation, E5MostSomeAndOne) {
  F1 s2 = make<F1>(0, 2);
  F1 s5 = make<F1>(0, 5);
  F1 s7 = make<F1>(0, 7);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), opts())(s2, s5, s5, s2, s5, s7); },
      kE5Head +
          "  * most axes (3 of them) had size 5, e.g. axis 0 of args[1] of type float32[5];\n"
          "  * some axes (2 of them) had size 2, e.g. axis 0 of args[0] of type float32[2];\n"
          "  * one axis had size 7: axis 0 of args[5] of type float32[7]");
  EXPECT_EQ(runs_.load(), 0);
}

TEST_P(Validation, E5TiedCountsByFirstAppearance) {
  F1 s2 = make<F1>(0, 2);
  F1 s5 = make<F1>(0, 5);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), opts())(s2, s5, s5, s2); },
      kE5Head +
          "  * most axes (2 of them) had size 2, e.g. axis 0 of args[0] of type float32[2];\n"
          "  * some axes (2 of them) had size 5, e.g. axis 0 of args[1] of type float32[5]");
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), opts())(s5, s2, s2, s5); },
      kE5Head +
          "  * most axes (2 of them) had size 5, e.g. axis 0 of args[0] of type float32[5];\n"
          "  * some axes (2 of them) had size 2, e.g. axis 0 of args[1] of type float32[2]");
  EXPECT_EQ(runs_.load(), 0);
}

TEST_P(Validation, E5LeavesInsideContainers) {
  F2 a = make<F2>(0, 4, 3);
  std::vector<F1> v{make<F1>(0, 5), make<F1>(1, 5)};
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), opts())(a, v); },
      kE5Head +
          "  * most axes (2 of them) had size 5, e.g. axis 0 of args[1][0] of type float32[5];\n"
          "  * one axis had size 4: axis 0 of args[0] of type float32[4,3]");

  std::tuple<Tensor<double, 1, RowMajor>, std::vector<Tensor<int32_t, 2, RowMajor>>> t{
      make<Tensor<double, 1, RowMajor>>(0, 6),
      {make<Tensor<int32_t, 2, RowMajor>>(0, 6, 2), make<Tensor<int32_t, 2, RowMajor>>(0, 3, 2)}};
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), opts())(t); },
      kE5Head +
          "  * most axes (2 of them) had size 6, e.g. axis 0 of args[0][0] of type float64[6];\n"
          "  * one axis had size 3: axis 0 of args[0][1][1] of type int32[3,2]");
  EXPECT_EQ(runs_.load(), 0);
}

TEST_P(Validation, E5DtypesAndBroadcastArgumentsKeepTheirIndex) {
  Tensor<int64_t, 1, RowMajor> i3 = make<Tensor<int64_t, 1, RowMajor>>(0, 3);
  Tensor<bool, 2, ColMajor> b4 = make<Tensor<bool, 2, ColMajor>>(0, 4, 2);
  float s = 1.f;
  F1 w = make<F1>(0, 9);
  // args[0] is a broadcast scalar, args[2] a broadcast tensor: neither is listed, both count.
  expect_validation_error<pmap::ValueError>(
      [&] {
        (void)pmap::pmap(counted(runs_), pmap::in_axes(pmap::none, 0, pmap::none, 0), opts())(s, i3, w, b4);
      },
      kE5Head +
          "  * one axis had size 3: axis 0 of args[1] of type int64[3];\n"
          "  * one axis had size 4: axis 0 of args[3] of type bool[4,2]");
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), opts())(s, i3, b4); },
      kE5Head +
          "  * one axis had size 3: axis 0 of args[1] of type int64[3];\n"
          "  * one axis had size 4: axis 0 of args[2] of type bool[4,2]");
  EXPECT_EQ(runs_.load(), 0);
}

// ---- E6 ----------------------------------------------------------------------------------

TEST_P(Validation, E6AxisSizeMismatch) {
  F2 x = make<F2>(0, 4, 2);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), sized(8))(x); },
      "Specified axis_size 8 doesn't match received axis_size 4.");
  F1 y = make<F1>(0, n());
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), sized(n() + 1))(y); },
      "Specified axis_size " + std::to_string(n() + 1) + " doesn't match received axis_size " +
          std::to_string(n()) + ".");
  EXPECT_EQ(runs_.load(), 0);
}

TEST_P(Validation, AxisSizeMatchingRuns) {
  F1 y = make<F1>(0, n());
  auto r = pmap::pmap(counted(runs_), sized(n()))(y);
  EXPECT_EQ(r.dimension(0), ni());
  EXPECT_EQ(runs_.load(), n());
}

// ---- E7 / E8 -----------------------------------------------------------------------------

TEST_P(Validation, E7MoreThanDeviceCount) {
  F1 x = make<F1>(0, n() + 1);
  const std::string req = std::to_string(n() + 1);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), opts())(x); },
      "compiling computation that requires " + req + " logical devices, but only " +
          std::to_string(n()) + " devices are available (num_replicas=" + req + ")");
  F2 big = make<F2>(0, 3, 100);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), pmap::in_axes(1), opts())(big); },
      "compiling computation that requires 100 logical devices, but only " + std::to_string(n()) +
          " devices are available (num_replicas=100)");
  EXPECT_EQ(runs_.load(), 0);
}

TEST_P(Validation, E8DevicesSizeMismatch) {
  if (n() < 2) GTEST_SKIP() << "needs two devices";
  pmap::Options o = opts();
  o.devices = std::vector<pmap::Device>{rt().devices()[1]};
  F1 x = make<F1>(0, 2);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), o)(x); },
      "Leading axis size of input to pmapped function must equal the number of local devices "
      "passed to pmap. Got axis_size=2, num_local_devices=1.");
  o.devices = std::vector<pmap::Device>(rt().devices().begin(), rt().devices().end());
  F1 y = make<F1>(0, n() - 1);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), o)(y); },
      "Leading axis size of input to pmapped function must equal the number of local devices "
      "passed to pmap. Got axis_size=" +
          std::to_string(n() - 1) + ", num_local_devices=" + std::to_string(n()) + ".");
  EXPECT_EQ(runs_.load(), 0);
}

// ---- a mapped axis of size 0 -------------------------------------------------------------
// No position, no device: a ValueError naming the empty axis, before any kernel runs.

std::string empty_axis_message(const std::string& name, const std::string& where) {
  return name + " cannot map an axis of size 0: " + where +
         " is empty, and a pmap needs one device per position";
}

TEST_P(Validation, EmptyMappedAxisIsValueErrorNamingTheAxis) {
  F2 x(0, 3);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), opts())(x); },
      "pmap cannot map an axis of size 0: axis 0 of args[0] of type float32[0,3] is empty, and "
      "a pmap needs one device per position");
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), named("step"))(x); },
      empty_axis_message("step", "axis 0 of args[0] of type float32[0,3]"));
  F2 y(3, 0);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), pmap::in_axes(1), opts())(y); },
      empty_axis_message("pmap", "axis 1 of args[0] of type float32[3,0]"));
  // After a broadcast argument, and with another dtype.
  Tensor<std::int32_t, 1> z(0);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), pmap::in_axes(pmap::none, 0), opts())(2.f, z); },
      empty_axis_message("pmap", "axis 0 of args[1] of type int32[0]"));
  // A leaf inside a container is named as in E5.
  std::vector<F1> leaves{F1(0)};
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), opts())(leaves); },
      empty_axis_message("pmap", "axis 0 of args[0][0] of type float32[0]"));
  EXPECT_EQ(runs_.load(), 0);
  // The runtime still serves calls.
  F1 ok = make<F1>(0, n());
  EXPECT_EQ(pmap::pmap(counted(runs_), opts())(ok).dimension(0), ni());
  EXPECT_EQ(runs_.load(), n());
}

TEST_P(Validation, EmptyMappedAxisWithIntoWritesNothing) {
  F2 x(0, 3);
  const std::string msg = empty_axis_message("pmap", "axis 0 of args[0] of type float32[0,3]");
  auto identity = [this](auto v) {
    runs_.fetch_add(1);
    return v;
  };
  // The target the call would return, (0, 3): nothing to write, and still an error.
  F2 out(0, 3);
  expect_validation_error<pmap::ValueError>([&] { pmap::pmap(identity, opts()).into(out, x); }, msg);
  // out_axes none: device 0's value would be a (3,) tensor, and there is no device 0.
  F1 replicated(3);
  fill(replicated, -5.f);
  auto g = pmap::pmap(identity, pmap::out_axes(pmap::none), opts());
  expect_validation_error<pmap::ValueError>([&] { g.into(replicated, x); }, msg);
  EXPECT_TRUE(all_equal_to(replicated, -5.f));
  // A tuple with a broadcast output beside it.
  Tensor<float, 0, RowMajor> scalar;
  scalar() = -5.f;
  auto h = pmap::pmap(
      [this](auto v, const auto& w) {
        runs_.fetch_add(1);
        return std::make_tuple(v, w(0));
      },
      pmap::in_axes(0, pmap::none), pmap::out_axes(0, pmap::none), opts());
  F1 w = make<F1>(3, 4);
  F2 mapped_out(0, 3);
  expect_validation_error<pmap::ValueError>([&] { h.into(std::tie(mapped_out, scalar), x, w); },
                                            msg);
  EXPECT_EQ(scalar(), -5.f);
  EXPECT_EQ(runs_.load(), 0);
  // The same Mapped still serves a call with positions to map.
  F2 y(n(), 3);
  fill(y, 2.f);
  g.into(replicated, y);
  EXPECT_TRUE(all_equal_to(replicated, 2.f));
  EXPECT_EQ(runs_.load(), n());
}

// ---- E10 ---------------------------------------------------------------------------------

void expect_e10(const std::string& msg, int axis, int rank) {
  EXPECT_EQ(msg.rfind("pmap out_axes", 0), 0u) << msg;
  EXPECT_NE(msg.find(std::to_string(axis)), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(rank)), std::string::npos) << msg;
}

TEST_P(Validation, E10OutAxisOutOfRange) {
  F2 x = make<F2>(0, n(), 3);
  auto vec = [&](auto v) {
    runs_.fetch_add(1);
    return v * 1.f;
  };
  auto scalar = [&](auto v) {
    runs_.fetch_add(1);
    return v(0);
  };
  // Rank-1 output: valid out_axes are [-2, 1].
  expect_e10(catch_message<pmap::ValueError>([&] { (void)pmap::pmap(vec, pmap::out_axes(2), opts())(x); }), 2, 1);
  expect_e10(catch_message<pmap::ValueError>([&] { (void)pmap::pmap(vec, pmap::out_axes(-3), opts())(x); }), -3, 1);
  // Rank-0 output: valid out_axes are [-1, 0].
  expect_e10(catch_message<pmap::ValueError>([&] { (void)pmap::pmap(scalar, pmap::out_axes(1), opts())(x); }), 1, 0);
  expect_e10(catch_message<pmap::ValueError>([&] { (void)pmap::pmap(scalar, pmap::out_axes(-2), opts())(x); }), -2, 0);
  // Per output: only the second is out of range.
  auto pair = [&](auto v) {
    runs_.fetch_add(1);
    return std::make_tuple(v * 1.f, v * 2.f);
  };
  expect_e10(catch_message<pmap::ValueError>([&] { (void)pmap::pmap(pair, pmap::out_axes(1, 7), opts())(x); }), 7, 1);
  EXPECT_EQ(runs_.load(), 0);
  // The edges are valid.
  EXPECT_NO_THROW((void)pmap::pmap(vec, pmap::out_axes(-2), opts())(x));
  EXPECT_NO_THROW((void)pmap::pmap(vec, pmap::out_axes(1), opts())(x));
}

// ---- E13 ---------------------------------------------------------------------------------

TEST_P(Validation, E13ReplicatedOutputsDiffer) {
  F1 x = make<F1>(0, n());
  auto by_index = [](pmap::Context& ctx, auto) { return static_cast<float>(ctx.axis_index()); };
  auto f = pmap::pmap(by_index, pmap::out_axes(pmap::none), opts());
  if (n() < 2) {
    auto r = f(x);
    EXPECT_EQ(r(), 0.f);
    return;
  }
  expect_validation_error<pmap::ValueError>(
      [&] { (void)f(x); },
      "pmap out_axes=None requires output 0 to be equal on every device, but device 1 differs "
      "from device 0");
}

TEST_P(Validation, E13NamesOutputAndFirstDifferingDevice) {
  if (n() < 2) GTEST_SKIP() << "needs two devices";
  F2 x = make<F2>(0, n(), 3);
  const int last = n() - 1;
  auto k = [last](pmap::Context& ctx, auto v) {
    Tensor<float, 1, RowMajor> t(3);
    t.setZero();
    if (ctx.axis_index() == last) t(2) = 1.f;
    return std::make_tuple(v * 1.f, t);
  };
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(k, pmap::out_axes(0, pmap::none), opts())(x); },
      "pmap out_axes=None requires output 1 to be equal on every device, but device " +
          std::to_string(last) + " differs from device 0");
  // Without the check, device 0's value is returned.
  pmap::Options o = opts();
  o.check_replicated = false;
  auto [a, b] = pmap::pmap(k, pmap::out_axes(0, pmap::none), o)(x);
  EXPECT_TRUE(tensors_equal(a, x));
  EXPECT_EQ(b(2), 0.f);
}

TEST_P(Validation, E13WithIntoWritesNothing) {
  if (n() < 2) GTEST_SKIP() << "needs two devices";
  F1 x = make<F1>(0, n());
  auto f = pmap::pmap([](pmap::Context& ctx, auto) { return static_cast<float>(ctx.axis_index() == 1); },
                      pmap::out_axes(pmap::none), opts());
  Tensor<float, 0, RowMajor> out;
  out() = -5.f;
  expect_validation_error<pmap::ValueError>(
      [&] { f.into(out, x); },
      "pmap out_axes=None requires output 0 to be equal on every device, but device 1 differs "
      "from device 0");
  EXPECT_EQ(out(), -5.f);
}

// ---- into(): nothing is written when validation fails --------------------------------------

TEST_P(Validation, FailedValidationWritesNothingIntoOut) {
  F1 out(n());
  fill(out, -5.f);
  auto f = pmap::pmap(counted(runs_), opts());
  F1 a = make<F1>(0, n());
  F1 b = make<F1>(0, n() + 1);

  // E5
  (void)catch_message<pmap::ValueError>([&] { f.into(out, a, b); });
  // E7
  (void)catch_message<pmap::ValueError>([&] { f.into(out, b); });
  // E3
  (void)catch_message<pmap::ValueError>([&] { pmap::pmap(counted(runs_), pmap::in_axes(0, 1), opts()).into(out, a, a); });
  // E6
  (void)catch_message<pmap::ValueError>([&] { pmap::pmap(counted(runs_), sized(n() + 3)).into(out, a); });
  // E4b
  std::vector<F1> empty;
  (void)catch_message<pmap::ValueError>([&] { f.into(out, empty); });
  EXPECT_TRUE(all_equal_to(out, -5.f));
  EXPECT_EQ(runs_.load(), 0);
}

// ---- legacy order: the first error in E2, E3, E4/E4b, E5, E6, E7/E8 wins ----------------

TEST_P(Validation, OrderE2BeforeE6) {
  auto f = pmap::pmap(counted(runs_), sized(3));
  expect_validation_error<pmap::ValueError>(
      [&] { invoke_or_fail(f); },
      "pmap wrapped function must be passed at least one argument containing an array, got none.");
}

TEST_P(Validation, OrderE3BeforeE5AndE7) {
  F1 a = make<F1>(0, n() + 1);
  F1 b = make<F1>(0, 3);
  F1 c = make<F1>(0, n() + 4);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), pmap::in_axes(0, 1, 0), sized(50))(a, b, c); },
      e3("pmap", 1, 2, 1, "(3,)"));
  EXPECT_EQ(runs_.load(), 0);
}

TEST_P(Validation, OrderE4BeforeE6) {
  F1 a = make<F1>(0, 2);
  auto f = pmap::pmap(counted(runs_), pmap::in_axes(pmap::none), sized(5));
  expect_validation_error<pmap::ValueError>([&] { invoke_or_fail(f, a); },
                                            "pmap must have at least one non-None value in in_axes");
}

TEST_P(Validation, OrderE4bBeforeE6) {
  std::vector<F1> empty;
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), sized(5))(empty); },
      "pmap requires at least one argument with a mapped axis.");
}

TEST_P(Validation, OrderE5BeforeE6AndE7) {
  F1 a = make<F1>(0, n() + 1);
  F1 b = make<F1>(0, n() + 2);
  const std::string sa = std::to_string(n() + 1);
  const std::string sb = std::to_string(n() + 2);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), sized(n() + 1))(a, b); },
      kE5Head + "  * one axis had size " + sa + ": axis 0 of args[0] of type float32[" + sa +
          "];\n  * one axis had size " + sb + ": axis 0 of args[1] of type float32[" + sb + "]");
  EXPECT_EQ(runs_.load(), 0);
}

TEST_P(Validation, OrderE6BeforeE7) {
  F1 a = make<F1>(0, n() + 1);
  expect_validation_error<pmap::ValueError>(
      [&] { (void)pmap::pmap(counted(runs_), sized(n() + 5))(a); },
      "Specified axis_size " + std::to_string(n() + 5) + " doesn't match received axis_size " +
          std::to_string(n() + 1) + ".");
}

TEST_P(Validation, OrderE6BeforeE8) {
  pmap::Options o = sized(7);
  o.devices = std::vector<pmap::Device>{rt().devices()[0]};
  F1 a = make<F1>(0, 2);
  expect_validation_error<pmap::ValueError>([&] { (void)pmap::pmap(counted(runs_), o)(a); },
                                            "Specified axis_size 7 doesn't match received axis_size 2.");
  EXPECT_EQ(runs_.load(), 0);
}

}  // namespace
