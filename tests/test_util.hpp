/// @file test_util.hpp
/// @brief Shared helpers of the pmap test suites: the runtimes every device test runs
/// on, deterministic tensors, serial references and exception checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <complex>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <pmap/pmap.hpp>
#include <unsupported/Eigen/CXX11/Tensor>

namespace pmap_test {

// ---- sanitizer builds ----------------------------------------------------------------------
// ASan + UBSan and TSan builds run about ten times slower (devices on their fibers, as in
// release): stress tests use fewer repetitions and smaller operands there.
#if defined(__SANITIZE_THREAD__)
#define PMAP_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PMAP_TEST_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define PMAP_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PMAP_TEST_ASAN 1
#endif
#endif
#if defined(PMAP_TEST_TSAN)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#if defined(PMAP_TEST_TSAN) || defined(PMAP_TEST_ASAN)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

using Eigen::ColMajor;
using Eigen::Index;
using Eigen::RowMajor;

/// A view as the kernel receives it (SPEC 2.1).
template <class T, int R, int L = ColMajor>
using View = Eigen::TensorMap<const Eigen::Tensor<T, R, L>>;

// ---- runtimes ----------------------------------------------------------------------------

/// One runtime shape every device test runs on.
struct RtConfig {
  int devices;
  int threads;
};

inline void PrintTo(const RtConfig& c, std::ostream* os) {
  *os << "{devices=" << c.devices << ", threads=" << c.threads << "}";
}

/// Under the sanitizers, without {1, 1}: one device on one thread never switches fibers nor
/// exchanges a byte, and the release run covers it; CI's time goes to the shapes that do.
inline std::vector<RtConfig> runtime_configs() {
  if constexpr (kSanitized) return {{2, 1}, {2, 2}, {8, 1}, {8, 2}};
  return {{1, 1}, {2, 1}, {2, 2}, {8, 1}, {8, 2}};
}

inline std::string config_name(const testing::TestParamInfo<RtConfig>& info) {
  return "d" + std::to_string(info.param.devices) + "t" + std::to_string(info.param.threads);
}

/// Fixture owning a fresh Runtime of the parameter's shape.
class RuntimeTest : public testing::TestWithParam<RtConfig> {
 protected:
  void SetUp() override {
    rt_ = std::make_unique<pmap::Runtime>(
        pmap::RuntimeConfig{.num_devices = GetParam().devices, .num_threads = GetParam().threads});
  }

  pmap::Runtime& rt() { return *rt_; }
  /// Number of devices of the runtime: the default axis size of a test.
  int n() const { return GetParam().devices; }
  Index ni() const { return static_cast<Index>(GetParam().devices); }
  /// Options running on this fixture's runtime.
  pmap::Options opts() const {
    pmap::Options o;
    o.runtime = rt_.get();
    return o;
  }

  std::unique_ptr<pmap::Runtime> rt_;
};

/// Options running on rt (designated initializers of a partial Options trip GCC 12's
/// -Wmissing-field-initializers).
inline pmap::Options on(pmap::Runtime& rt, std::string name = "pmap") {
  pmap::Options o;
  o.runtime = &rt;
  o.name = std::move(name);
  return o;
}

#define PMAP_TEST_INSTANTIATE(Suite)                                                      \
  INSTANTIATE_TEST_SUITE_P(Runtimes, Suite, testing::ValuesIn(pmap_test::runtime_configs()), \
                           pmap_test::config_name)

// ---- deterministic values ----------------------------------------------------------------

/// Exactly representable values, so that reassociated or fused arithmetic compares equal.
template <class T>
T value_at(Index k, int seed) {
  if constexpr (std::is_same_v<T, bool>) {
    return (k + seed) % 3 == 0;
  } else if constexpr (std::is_same_v<T, std::complex<float>>) {
    return {static_cast<float>((k % 61) * 0.5 + seed), static_cast<float>(-(k % 13) * 0.25)};
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>((k % 97) * 0.25 + seed);
  } else {
    return static_cast<T>((k % 101) * 3 + seed);
  }
}

/// Sets storage position k of t to value_at(k, seed).
template <class TensorT>
void fill_values(TensorT& t, int seed) {
  for (Index k = 0; k < t.size(); ++k) t.data()[k] = value_at<typename TensorT::Scalar>(k, seed);
}

/// A tensor of the given dimensions holding value_at(k, seed) at storage position k.
template <class TensorT, class... D>
TensorT make(int seed, D... dims) {
  TensorT t(static_cast<Index>(dims)...);
  fill_values(t, seed);
  return t;
}

/// make() with the dimensions given as an array (for shapes computed at run time).
template <class TensorT, std::size_t R>
TensorT make_dims(int seed, const std::array<Index, R>& dims) {
  TensorT t(dims);
  fill_values(t, seed);
  return t;
}

template <class TensorT>
void fill(TensorT& t, typename TensorT::Scalar v) {
  for (Index k = 0; k < t.size(); ++k) t.data()[k] = v;
}

template <class TensorT>
bool all_equal_to(const TensorT& t, typename TensorT::Scalar v) {
  for (Index k = 0; k < t.size(); ++k)
    if (!(t.data()[k] == v)) return false;
  return true;
}

/// An owning copy of slice i of x along axis d (the serial reference of a mapped argument).
template <class T, int R, int L>
Eigen::Tensor<T, R - 1, L> slice(const Eigen::Tensor<T, R, L>& x, Index i, int d) {
  Eigen::Tensor<T, R - 1, L> s = x.chip(i, d);
  return s;
}

/// Stacks parts (all of one shape) along a new axis d.
template <class T, int R, int L>
Eigen::Tensor<T, R + 1, L> stack(const std::vector<Eigen::Tensor<T, R, L>>& parts, int d) {
  std::array<Index, R + 1> dims{};
  const auto& first = parts.at(0).dimensions();
  for (int k = 0, j = 0; k < R + 1; ++k) {
    dims[static_cast<std::size_t>(k)] =
        k == d ? static_cast<Index>(parts.size()) : first[static_cast<std::size_t>(j++)];
  }
  Eigen::Tensor<T, R + 1, L> out(dims);
  for (std::size_t i = 0; i < parts.size(); ++i) out.chip(static_cast<Index>(i), d) = parts[i];
  return out;
}

/// Stacks scalars into a rank-1 RowMajor tensor (the result of a scalar output).
template <class T>
Eigen::Tensor<T, 1, RowMajor> stack_scalars(const std::vector<T>& parts) {
  Eigen::Tensor<T, 1, RowMajor> out(static_cast<Index>(parts.size()));
  for (std::size_t i = 0; i < parts.size(); ++i) out(static_cast<Index>(i)) = parts[i];
  return out;
}

// ---- comparisons -------------------------------------------------------------------------

template <class D>
std::string dims_string(const D& d, int rank) {
  std::ostringstream s;
  s << "(";
  for (int k = 0; k < rank; ++k) s << (k ? ", " : "") << d[static_cast<std::size_t>(k)];
  if (rank == 1) s << ",";
  s << ")";
  return s.str();
}

template <class T>
std::string value_string(const T& v) {
  std::ostringstream s;
  if constexpr (std::is_same_v<T, bool>) s << (v ? "true" : "false");
  else if constexpr (sizeof(T) == 1) s << static_cast<int>(v);
  else s << v;
  return s.str();
}

/// How tensors_equal compares elements.
enum class Compare {
  exact,  ///< operator==
  near,   ///< floating point within a relative 1e-5 (float) / 1e-12 (double); others exact
};

/// Whether element a matches expected element b under `how`.
template <class T>
bool elements_match(const T& a, const T& b, [[maybe_unused]] Compare how) {
  if constexpr (std::is_floating_point_v<T>) {
    if (how == Compare::near) {
      const T tol = std::is_same_v<T, float> ? T(1e-5) : T(1e-12);
      return std::abs(a - b) <= tol * std::max(T(1), std::abs(b));
    }
  }
  return a == b;
}

/// Same rank, scalar, dimensions and elements (compared by index, so layouts may differ);
/// elements compared exactly unless `how` says otherwise.
template <class A, class B>
testing::AssertionResult tensors_equal(const A& actual, const B& expected,
                                       Compare how = Compare::exact) {
  using TA = std::remove_cvref_t<typename A::Scalar>;
  using TB = std::remove_cvref_t<typename B::Scalar>;
  constexpr int RA = A::NumDimensions;
  constexpr int RB = B::NumDimensions;
  if constexpr (RA != RB) {
    return testing::AssertionFailure() << "rank " << RA << " != expected rank " << RB;
  } else if constexpr (!std::is_same_v<TA, TB>) {
    return testing::AssertionFailure() << "scalar type " << typeid(TA).name()
                                       << " != expected " << typeid(TB).name();
  } else {
    constexpr int R = RA;
    for (int k = 0; k < R; ++k) {
      if (actual.dimension(k) != expected.dimension(k)) {
        return testing::AssertionFailure()
               << "shape " << dims_string(actual.dimensions(), R) << " != expected "
               << dims_string(expected.dimensions(), R);
      }
    }
    Index total = 1;
    for (int k = 0; k < R; ++k) total *= expected.dimension(k);
    std::array<Index, static_cast<std::size_t>(R == 0 ? 1 : R)> idx{};
    for (Index flat = 0; flat < total; ++flat) {
      Index rem = flat;
      for (int k = R - 1; k >= 0; --k) {
        idx[static_cast<std::size_t>(k)] = rem % expected.dimension(k);
        rem /= expected.dimension(k);
      }
      TA a{};
      TA b{};
      if constexpr (R == 0) {
        a = actual();
        b = expected();
      } else {
        std::array<Index, static_cast<std::size_t>(R)> at{};
        for (int k = 0; k < R; ++k) at[static_cast<std::size_t>(k)] = idx[static_cast<std::size_t>(k)];
        a = actual(at);
        b = expected(at);
      }
      if (!elements_match(a, b, how)) {
        return testing::AssertionFailure()
               << "element " << dims_string(idx, R) << ": " << value_string(a) << " != expected "
               << value_string(b);
      }
    }
    return testing::AssertionSuccess();
  }
}

/// tensors_equal with floating point elements within a relative 1e-5 (float) / 1e-12
/// (double): for results whose reduction order may differ from the serial reference's.
template <class A, class B>
testing::AssertionResult tensors_near(const A& actual, const B& expected) {
  return tensors_equal(actual, expected, Compare::near);
}

/// Whether [p, p + len) lies inside [base, base + size).
template <class T>
bool points_inside(const T* p, const T* base, Index size) {
  std::less_equal<const T*> le;
  std::less<const T*> lt;
  return le(base, p) && lt(p, base + size);
}

// ---- exceptions --------------------------------------------------------------------------

/// Thrown by invoke_or_fail when a call that SPEC.md says compiles does not.
struct NotInvocable : std::exception {
  const char* what() const noexcept override { return "the call does not compile"; }
};

/// Calls m(args...) when that compiles; otherwise records a failure (the call should have
/// compiled and failed at run time) and throws NotInvocable.
template <class M, class... A>
void invoke_or_fail(M& m, A&&... args) {
  if constexpr (std::is_invocable_v<M&, A...>) {
    if constexpr (std::is_void_v<std::invoke_result_t<M&, A...>>) {
      m(std::forward<A>(args)...);
    } else {
      (void)m(std::forward<A>(args)...);
    }
  } else {
    ADD_FAILURE() << "SPEC says this call compiles and fails at run time, but it does not compile";
    throw NotInvocable{};
  }
}

/// Runs f, which must throw exactly E (or a subclass) with what() == message. Returns the
/// message seen ("" when none).
template <class E, class F>
std::string expect_throw_msg(F&& f, std::string_view message) {
  try {
    f();
  } catch (const E& e) {
    EXPECT_EQ(std::string(e.what()), std::string(message));
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected " << typeid(E).name() << " \"" << message << "\", got "
                  << typeid(e).name() << " \"" << e.what() << "\"";
    return e.what();
  } catch (...) {
    ADD_FAILURE() << "expected " << typeid(E).name() << ", got a non-std exception";
    return "";
  }
  ADD_FAILURE() << "expected " << typeid(E).name() << " \"" << message << "\", nothing thrown";
  return "";
}

/// Runs f, which must throw a pmap validation error of type E (deriving from pmap::Error and
/// std::invalid_argument) with exactly the given message.
template <class E, class F>
void expect_validation_error(F&& f, std::string_view message) {
  try {
    f();
  } catch (const E& e) {
    EXPECT_EQ(std::string(e.what()), std::string(message));
    EXPECT_NE(dynamic_cast<const pmap::Error*>(&e), nullptr) << "does not derive from pmap::Error";
    EXPECT_NE(dynamic_cast<const std::invalid_argument*>(&e), nullptr)
        << "does not derive from std::invalid_argument";
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected " << typeid(E).name() << " \"" << message << "\", got "
                  << typeid(e).name() << " \"" << e.what() << "\"";
    return;
  } catch (...) {
    ADD_FAILURE() << "expected " << typeid(E).name() << ", got a non-std exception";
    return;
  }
  ADD_FAILURE() << "expected " << typeid(E).name() << " \"" << message << "\", nothing thrown";
}

/// Runs f, which must throw E; returns what() for further checks ("" when it did not).
template <class E, class F>
std::string catch_message(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected " << typeid(E).name() << ", got " << typeid(e).name() << " \""
                  << e.what() << "\"";
    return "";
  } catch (...) {
    ADD_FAILURE() << "expected " << typeid(E).name() << ", got a non-std exception";
    return "";
  }
  ADD_FAILURE() << "expected " << typeid(E).name() << ", nothing thrown";
  return "";
}

}  // namespace pmap_test
