/// @file shape.hpp
/// @brief Shapes as the library carries them (a rank and int64 extents, no allocation), and
/// the shape arithmetic of mapping: an axis inserted or removed, Eigen's DSizes of a Shape.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <unsupported/Eigen/CXX11/Tensor>

namespace pmap::detail {

/// Shapes are carried as a rank plus int64 extents (no allocation).
inline constexpr int kMaxRank = 16;
struct Shape {
  int rank = 0;
  std::array<std::int64_t, kMaxRank> dims{};
  std::int64_t size() const {
    std::int64_t s = 1;
    for (int i = 0; i < rank; ++i) s *= dims[static_cast<std::size_t>(i)];
    return s;
  }
  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.rank != b.rank) return false;
    for (int i = 0; i < a.rank; ++i)
      if (a.dims[static_cast<std::size_t>(i)] != b.dims[static_cast<std::size_t>(i)]) return false;
    return true;
  }
};

/// "(10, 4)", "(3,)", "()".
std::string format_shape(const Shape& s);
/// "float32[10,4]".
std::string format_typed_shape(const char* dtype, const Shape& s);

template <class Dims>
Shape shape_of_dims(const Dims& d, int rank) {
  Shape s;
  s.rank = rank;
  for (int i = 0; i < rank; ++i) s.dims[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(d[i]);
  return s;
}

template <class T, int R, int L>
Eigen::DSizes<Eigen::DenseIndex, R> dsizes(const Shape& s) {
  Eigen::DSizes<Eigen::DenseIndex, R> d;
  for (int a = 0; a < R; ++a) d[a] = static_cast<Eigen::DenseIndex>(s.dims[static_cast<std::size_t>(a)]);
  return d;
}

/// `axis` normalised against `ndim` dimensions (negatives count from the end); a ValueError
/// `axis {axis} is out of bounds for array of dimension {ndim}` otherwise.
int canonical_axis(int axis, int ndim);

inline Shape insert_axis(const Shape& s, int axis, std::int64_t n) {
  Shape out;
  out.rank = s.rank + 1;
  for (int a = 0, b = 0; a < out.rank; ++a)
    out.dims[static_cast<std::size_t>(a)] = a == axis ? n : s.dims[static_cast<std::size_t>(b++)];
  return out;
}

inline Shape remove_axis(const Shape& s, int axis) {
  Shape out;
  out.rank = s.rank - 1;
  for (int a = 0, b = 0; a < s.rank; ++a)
    if (a != axis) out.dims[static_cast<std::size_t>(b++)] = s.dims[static_cast<std::size_t>(a)];
  return out;
}

}  // namespace pmap::detail
