/// @file common.hpp
/// @brief What the examples share and is not about pmap: the command line (`--name value`
/// flags, each read with its default; a usage message and exit code 2 on anything else), a
/// timer, and the rounding bound that checks a computed matrix product.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <string>

#include <Eigen/Core>

namespace examples {

class Flags {
 public:
  /// Takes argv as `--name value` pairs; `usage` lists the flags ("[--size N] [--steps S]").
  /// `--help` prints the usage and exits.
  Flags(int argc, char** argv, const char* usage) : program_(argv[0]), usage_(usage) {
    for (int i = 1; i < argc; i += 2) {
      if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
        std::printf("usage: %s %s\n", program_, usage_);
        std::exit(0);
      }
      if (std::strncmp(argv[i], "--", 2) != 0) fail(std::string("unexpected '") + argv[i] + "'");
      if (i + 1 >= argc) fail(std::string(argv[i]) + " needs a value");
      values_[argv[i]] = argv[i + 1];
    }
  }

  /// The integer given for `name`, or `fallback`.
  long long integer(const char* name, long long fallback) {
    const auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    char* end = nullptr;
    const long long value = std::strtoll(it->second.c_str(), &end, 10);
    if (end == it->second.c_str() || *end != '\0')
      fail(std::string(name) + " needs an integer, got '" + it->second + "'");
    values_.erase(it);
    return value;
  }
  /// The text given for `name`, or `fallback`.
  std::string text(const char* name, std::string fallback) {
    const auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    std::string value = it->second;
    values_.erase(it);
    return value;
  }
  /// After the last read: a flag that nothing read is a mistake.
  void done() const {
    if (!values_.empty()) fail("unknown flag " + values_.begin()->first);
  }
  /// Ends the program with `why` unless `ok`.
  void require(bool ok, const char* why) const {
    if (!ok) fail(why);
  }
  [[noreturn]] void fail(const std::string& why) const {
    std::fprintf(stderr, "%s: %s\nusage: %s %s\n", program_, why.c_str(), program_, usage_);
    std::exit(2);
  }

 private:
  const char* program_;
  const char* usage_;
  std::map<std::string, std::string> values_;
};

/// Milliseconds `f` takes (reported, never checked).
template <class F>
double milliseconds(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

/// Whether `got` and `want` (`what`, from `program`), two computed values of a matrix product
/// X @ Y of scalar T with inner dimension k, agree as closely as rounding guarantees; else
/// prints the first entry that does not. The bound (Higham, "Accuracy and Stability of
/// Numerical Algorithms", 3.1): a sum of k products evaluated in any order, blocked, fused
/// (FMA) or split into partial sums, is within gamma_m * sum_k |x_ik y_kj| of the exact value,
/// gamma_m = m u / (1 - m u), u = eps / 2, m the longest chain of roundings a term goes
/// through: at most k for one product, at most k + 1 for a product split into b blocks whose
/// partial sums are added (k / b inside a block, b accumulations). Two such values are within
/// twice that. `magnitude` is |X| @ |Y| in double. At k = 1024 the bound is 1.2e-4 of |X||Y|
/// in float32 and 2.3e-13 in float64; the error seen in practice is tens to hundreds of times
/// smaller (it grows like sqrt(k) u), while a missing or misplaced block is off by O(1) of
/// |X||Y| and fails it at any size. `worst_ratio` keeps the largest |got - want| / bound.
template <class T, class Got, class Want>
bool product_within_bound(const char* program, const char* what, const Got& got, const Want& want,
                          const Eigen::MatrixXd& magnitude, Eigen::Index k, double* worst_ratio) {
  const double m = static_cast<double>(k) + 1.0;
  const double u = std::numeric_limits<T>::epsilon() / 2.0;
  const double gamma = m * u / (1.0 - m * u);
  for (Eigen::Index i = 0; i < want.rows(); ++i)
    for (Eigen::Index j = 0; j < want.cols(); ++j) {
      const double diff =
          std::abs(static_cast<double>(got(i, j)) - static_cast<double>(want(i, j)));
      const double bound = 2.0 * gamma * magnitude(i, j);
      *worst_ratio = std::max(*worst_ratio, bound > 0 ? diff / bound : 0.0);
      if (diff > bound) {
        std::fprintf(stderr,
                     "%s: %s: entry (%ld, %ld) is %.9g, the serial product gives %.9g; they "
                     "differ by %.3g, more than rounding allows (%.3g)\n",
                     program, what, static_cast<long>(i), static_cast<long>(j),
                     static_cast<double>(got(i, j)), static_cast<double>(want(i, j)), diff, bound);
        return false;
      }
    }
  return true;
}

}  // namespace examples
