/// @file test_layout.cpp
/// @brief The geometry of the collectives on its own (detail/layout.hpp): arrays split around
/// an axis, box merging and copies, and the boxes of all_to_all against an index-by-index
/// reference, for both layouts, every axis pair, tiled and untiled.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include <pmap/detail/blocks.hpp>
#include <pmap/detail/layout.hpp>

namespace {

using pmap::detail::AllToAllPlan;
using pmap::detail::Box;
using pmap::detail::Shape;

Shape shape(std::initializer_list<std::int64_t> dims) {
  Shape s;
  for (std::int64_t d : dims) s.dims[static_cast<std::size_t>(s.rank++)] = d;
  return s;
}

/// Linear offset of a multi-index in an array of shape s and layout L.
std::int64_t offset(const Shape& s, const std::vector<std::int64_t>& idx, int layout) {
  const auto strides = pmap::detail::strides_of(s, layout);
  std::int64_t o = 0;
  for (int d = 0; d < s.rank; ++d) o += idx[static_cast<std::size_t>(d)] * strides[static_cast<std::size_t>(d)];
  return o;
}

/// Calls f(idx) for every multi-index of s.
template <class F>
void for_each_index(const Shape& s, F&& f) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(s.rank), 0);
  if (s.size() == 0) return;
  for (;;) {
    f(idx);
    int d = s.rank - 1;
    for (; d >= 0; --d) {
      if (++idx[static_cast<std::size_t>(d)] < s.dims[static_cast<std::size_t>(d)]) break;
      idx[static_cast<std::size_t>(d)] = 0;
    }
    if (d < 0) return;
  }
}

TEST(Layout, StridesOfBothLayouts) {
  const Shape s = shape({2, 3, 4});
  EXPECT_EQ(pmap::detail::strides_of(s, Eigen::RowMajor)[0], 12);
  EXPECT_EQ(pmap::detail::strides_of(s, Eigen::RowMajor)[2], 1);
  EXPECT_EQ(pmap::detail::strides_of(s, Eigen::ColMajor)[0], 1);
  EXPECT_EQ(pmap::detail::strides_of(s, Eigen::ColMajor)[2], 6);
}

TEST(Layout, SplitAroundCountsOuterMidInnerInMemoryOrder) {
  const Shape s = shape({2, 3, 4, 5});
  const auto row = pmap::detail::split_around(s, 1, Eigen::RowMajor);
  EXPECT_EQ(row.outer, 2);
  EXPECT_EQ(row.mid, 3);
  EXPECT_EQ(row.inner, 20);
  const auto col = pmap::detail::split_around(s, 1, Eigen::ColMajor);
  EXPECT_EQ(col.outer, 20);
  EXPECT_EQ(col.mid, 3);
  EXPECT_EQ(col.inner, 2);
}

TEST(Layout, MergeBoxJoinsBackToBackDimensionsAndDropsUnits) {
  Box b;  // a whole 4x1x5 array copied into a whole 4x1x5 array: one run of 20
  b.rank = 3;
  b.extent = {4, 1, 5};
  b.src_stride = {5, 5, 1};
  b.dst_stride = {5, 5, 1};
  const Box m = pmap::detail::merge_box(b);
  ASSERT_EQ(m.rank, 1);
  EXPECT_EQ(m.extent[0], 20);
  EXPECT_EQ(m.src_stride[0], 1);
  Box rows;  // 3 rows of 4 out of rows of 6: not mergeable
  rows.rank = 2;
  rows.extent = {3, 4};
  rows.src_stride = {6, 1};
  rows.dst_stride = {4, 1};
  EXPECT_EQ(pmap::detail::merge_box(rows).rank, 2);
}

TEST(Layout, CopyBoxMatchesAnIndexByIndexCopyAndTouchesNothingElse) {
  // A 3x4 box at (1, 2) of a 5x7 source into (0, 1) of a 4x6 destination, ColMajor strides.
  std::vector<int> src(35), dst(24, -1);
  std::iota(src.begin(), src.end(), 0);
  Box b;
  b.rank = 2;  // memory order: the outermost (column stride) first
  b.extent = {4, 3};
  b.src_stride = {5, 1};
  b.dst_stride = {4, 1};
  const int* from = src.data() + 1 + 2 * 5;
  int* to = dst.data() + 0 + 1 * 4;
  pmap::detail::copy_box(to, from, b, false);
  for (int c = 0; c < 6; ++c)
    for (int r = 0; r < 4; ++r) {
      const bool inside = c >= 1 && c < 5 && r < 3;
      const int expected = inside ? src[static_cast<std::size_t>((r + 1) + (c - 1 + 2) * 5)] : -1;
      EXPECT_EQ(dst[static_cast<std::size_t>(r + c * 4)], expected) << "r=" << r << " c=" << c;
    }
  Box empty = b;
  empty.extent[1] = 0;
  std::vector<int> untouched(24, -1);
  pmap::detail::copy_box(untouched.data(), src.data(), empty, false);
  EXPECT_EQ(untouched, std::vector<int>(24, -1));
}

/// all_to_all by its definition, index by index, for member p of n with inputs in[k].
std::vector<int> reference_all_to_all(const std::vector<std::vector<int>>& in, const Shape& s,
                                      int sa, int ca, bool tiled, int p, int layout,
                                      const Shape& out_shape) {
  const int n = static_cast<int>(in.size());
  std::vector<int> out(static_cast<std::size_t>(out_shape.size()));
  const std::int64_t block = s.dims[static_cast<std::size_t>(sa)] / n;
  for_each_index(out_shape, [&](const std::vector<std::int64_t>& o) {
    std::vector<std::int64_t> i;
    std::int64_t k = 0;
    if (tiled) {
      i = o;
      k = o[static_cast<std::size_t>(ca)] / (out_shape.dims[static_cast<std::size_t>(ca)] / n);
      i[static_cast<std::size_t>(ca)] = o[static_cast<std::size_t>(ca)] % (out_shape.dims[static_cast<std::size_t>(ca)] / n);
      i[static_cast<std::size_t>(sa)] += p * block;
    } else {
      k = o[static_cast<std::size_t>(ca)];
      for (int d = 0; d < out_shape.rank; ++d)
        if (d != ca) i.push_back(o[static_cast<std::size_t>(d)]);
      i.insert(i.begin() + sa, p);
    }
    out[static_cast<std::size_t>(offset(out_shape, o, layout))] =
        in[static_cast<std::size_t>(k)][static_cast<std::size_t>(offset(s, i, layout))];
  });
  return out;
}

TEST(Layout, AllToAllPlanMatchesTheDefinitionForEveryAxisPairAndLayout) {
  const int n = 3;
  for (int layout : {int(Eigen::RowMajor), int(Eigen::ColMajor)})
    for (bool tiled : {false, true})
      for (int sa = 0; sa < 3; ++sa)
        for (int ca = 0; ca < 3; ++ca) {
          Shape s = shape({2, 5, 4});
          s.dims[static_cast<std::size_t>(sa)] = tiled ? 2 * n : n;
          std::vector<std::vector<int>> in(n, std::vector<int>(static_cast<std::size_t>(s.size())));
          for (int k = 0; k < n; ++k)
            for (std::size_t j = 0; j < in[static_cast<std::size_t>(k)].size(); ++j)
              in[static_cast<std::size_t>(k)][j] = k * 1000 + static_cast<int>(j);
          for (int p = 0; p < n; ++p) {
            const AllToAllPlan plan = pmap::detail::plan_all_to_all(s, sa, ca, tiled, n, p, layout);
            std::vector<int> out(static_cast<std::size_t>(plan.result.size()), -1);
            for (int k = 0; k < n; ++k)
              pmap::detail::copy_box(out.data() + k * plan.dst_step,
                                     in[static_cast<std::size_t>(k)].data() + plan.src_offset,
                                     plan.box, false);
            EXPECT_EQ(out, reference_all_to_all(in, s, sa, ca, tiled, p, layout, plan.result))
                << "layout=" << layout << " tiled=" << tiled << " sa=" << sa << " ca=" << ca
                << " p=" << p;
          }
        }
}

// ---- shard_map's blocks (blocks.hpp) --------------------------------------------------------

TEST(Blocks, RangesCoverEveryElementOnceAndDifferByAtMostOne) {
  for (std::int64_t s = 0; s <= 23; ++s)
    for (std::int64_t k = 1; k <= 9; ++k) {
      std::int64_t next = 0, lo = s, hi = 0;
      for (std::int64_t b = 0; b < k; ++b) {
        const auto r = pmap::detail::block_range(s, k, b);
        EXPECT_EQ(r.start, next) << s << "/" << k << " block " << b;
        next += r.extent;
        lo = std::min(lo, r.extent);
        hi = std::max(hi, r.extent);
        if (b > 0) {
          EXPECT_LE(r.extent, pmap::detail::block_range(s, k, b - 1).extent) << "larger blocks first";
        }
      }
      EXPECT_EQ(next, s);
      EXPECT_LE(hi - lo, 1);
    }
}

TEST(Blocks, ContiguousExactlyWhenOneRunOfMemory) {
  using pmap::detail::Block;
  for (const int layout : {Eigen::RowMajor, Eigen::ColMajor}) {
    const Shape full = shape({4, 3, 5});
    // Every box of extents (e0, e1, e2) at offsets (1 if partial): contiguous iff its
    // elements' offsets form one run.
    for (std::int64_t e0 = 0; e0 <= 4; ++e0)
      for (std::int64_t e1 = 0; e1 <= 3; ++e1)
        for (std::int64_t e2 = 0; e2 <= 5; ++e2) {
          Block b{full, {e0 < 4 ? 0 : 0, e1 < 3 ? 0 : 0, e2 < 5 ? 0 : 0}, shape({e0, e1, e2})};
          std::vector<std::int64_t> offsets;
          for_each_index(b.extent, [&](const std::vector<std::int64_t>& idx) { offsets.push_back(offset(full, idx, layout)); });
          std::sort(offsets.begin(), offsets.end());
          bool run = true;
          for (std::size_t k = 1; k < offsets.size(); ++k) run = run && offsets[k] == offsets[k - 1] + 1;
          EXPECT_EQ(pmap::detail::block_contiguous(b, layout), run)
              << "layout " << layout << " extents " << e0 << "," << e1 << "," << e2;
        }
  }
}

TEST(Blocks, CopyFromAndIntoABlockRoundTrips) {
  for (const int layout : {Eigen::RowMajor, Eigen::ColMajor}) {
    const Shape full = shape({5, 4, 3});
    std::vector<int> src(static_cast<std::size_t>(full.size()));
    std::iota(src.begin(), src.end(), 0);
    pmap::detail::Block b{full, {1, 2, 0}, shape({3, 2, 3})};
    std::vector<int> dense(static_cast<std::size_t>(b.extent.size()));
    pmap::detail::copy_from_block(dense.data(), src.data(), b, layout);
    std::size_t k = 0;
    for_each_index(b.extent, [&](const std::vector<std::int64_t>& idx) {
      std::vector<std::int64_t> at = idx;
      for (int d = 0; d < 3; ++d) at[static_cast<std::size_t>(d)] += b.start[static_cast<std::size_t>(d)];
      // dense is in the block's own memory order
      EXPECT_EQ(dense[static_cast<std::size_t>(offset(b.extent, idx, layout))], src[static_cast<std::size_t>(offset(full, at, layout))]);
      ++k;
    });
    EXPECT_EQ(k, dense.size());
    std::vector<int> back(src.size(), -1);
    pmap::detail::copy_into_block(back.data(), dense.data(), b, layout, false);
    int written = 0;
    for (std::size_t i = 0; i < back.size(); ++i)
      if (back[i] != -1) {
        EXPECT_EQ(back[i], src[i]);
        ++written;
      }
    EXPECT_EQ(written, 18);
  }
}

}  // namespace
