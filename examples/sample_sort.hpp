/// @file sample_sort.hpp
/// @brief The per-block steps of a sample sort, shared by examples/sample_sort.cpp and by
/// pmap-bench's sample_sort row and its OpenMP baseline (bench/apps.cpp), so that both sides
/// of the comparison run the same code on the same bytes:
///
///   1. each block sorts its keys and takes kSamples evenly spaced ones (take_samples);
///   2. every block sorts the samples of all blocks and picks d - 1 splitters at equal
///      distances (choose_splitters): bucket j holds the keys in [splitter j-1, splitter j);
///   3. each block counts its keys per bucket (bucket_sizes), the send sizes of the
///      exchange that moves bucket j to block j;
///   4. each block merges the d sorted runs it received (merge_runs);
/// and kernel(), the shard_map kernel that runs them on a device, with an all_gather of the
/// samples between 1 and 2 and a ragged_all_to_all of the buckets between 3 and 4.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <pmap/pmap.hpp>

namespace sample_sort {

using Key = std::int32_t;
using Keys = Eigen::Tensor<Key, 1, Eigen::RowMajor>;
using Eigen::Index;

/// Samples per block: enough that the buckets of uniform keys differ by a few percent.
inline constexpr Index kSamples = 128;

/// kSamples keys of the sorted block [keys, keys + n), evenly spaced; an empty block gives
/// the largest key, which only ever moves splitters up (every bucket stays valid).
inline void take_samples(const Key* keys, Index n, Key* samples) {
  for (Index s = 0; s < kSamples; ++s)
    samples[s] = n == 0 ? std::numeric_limits<Key>::max() : keys[(s * n) / kSamples];
}

/// d - 1 splitters from the `count` samples of every block, which it sorts.
inline void choose_splitters(Key* samples, Index count, int d, Key* splitters) {
  std::sort(samples, samples + count);
  for (int j = 1; j < d; ++j) splitters[j - 1] = samples[(j * count) / d];
}

/// sizes[j]: the keys of the sorted block [keys, keys + n) in bucket j (d buckets).
inline void bucket_sizes(const Key* keys, Index n, const Key* splitters, int d, Index* sizes) {
  const Key* from = keys;
  for (int j = 0; j < d; ++j) {
    const Key* to = j + 1 < d ? std::lower_bound(from, keys + n, splitters[j]) : keys + n;
    sizes[j] = to - from;
    from = to;
  }
}

/// Merges the d sorted runs of `in` (run j: sizes[j] keys from offsets[j]) into `out`;
/// `scratch` holds as many keys as `in` (runs are merged pairwise, log2 d rounds).
inline void merge_runs(const Key* in, const Index* offsets, const Index* sizes, int d, Key* out,
                       std::vector<Key>& scratch) {
  Index total = 0;
  for (int j = 0; j < d; ++j) total += sizes[j];
  std::vector<std::pair<Index, Index>> runs;  // [begin, end) in the current buffer
  for (int j = 0; j < d; ++j) runs.emplace_back(offsets[j], offsets[j] + sizes[j]);
  if (d == 1) {
    std::copy_n(in, total, out);
    return;
  }
  const Key* from = in;
  // The rounds alternate between scratch and out, so that the last one writes out.
  int rounds = 0;
  for (std::size_t r = runs.size(); r > 1; r = (r + 1) / 2) ++rounds;
  if (rounds > 1) scratch.resize(static_cast<std::size_t>(total));
  Key* to = rounds % 2 == 1 ? out : scratch.data();
  while (runs.size() > 1) {
    std::vector<std::pair<Index, Index>> next;
    for (std::size_t k = 0; k < runs.size(); k += 2) {
      const auto [b0, e0] = runs[k];
      if (k + 1 == runs.size()) {
        std::copy(from + b0, from + e0, to + b0);
        next.emplace_back(b0, e0);
        continue;
      }
      const auto [b1, e1] = runs[k + 1];
      std::merge(from + b0, from + e0, from + b1, from + e1, to + b0);
      next.emplace_back(b0, e1);
    }
    runs = std::move(next);
    from = to;
    to = to == out ? scratch.data() : out;
  }
}

/// n keys drawn from `seed`: uniform over int32, or (skewed) 90% of them one hot key, so that
/// one bucket holds most of them.
inline Keys make_keys(Index n, bool skewed, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<Key> any(std::numeric_limits<Key>::min(), std::numeric_limits<Key>::max());
  std::bernoulli_distribution hot(0.9);
  Keys keys(n);
  for (Index k = 0; k < n; ++k) keys(k) = skewed && hot(gen) ? Key{12345} : any(gen);
  return keys;
}

/// The block of dimension `n` that block b of d gets (shard_map's uneven blocks, SPEC 9).
inline std::pair<Index, Index> block_of(Index n, int d, int b) {
  const Index base = n / d, extra = n % d;
  const Index begin = b * base + std::min<Index>(b, extra);
  return {begin, begin + base + (b < extra ? 1 : 0)};
}

/// The kernel over a block of keys, for a mesh axis named `axis`: returns the block's bucket,
/// sorted (device j's result is bucket j, so the blocks in device order are the sorted keys).
inline auto kernel(std::string axis) {
  return [axis = std::move(axis)](pmap::Context& ctx, const auto& block) {
    const int d = ctx.axis_size(axis);
    Keys local = block;  // the block is a view of the caller's keys: sort a copy
    std::sort(local.data(), local.data() + local.size());

    Keys samples(kSamples);
    take_samples(local.data(), local.size(), samples.data());
    auto all = ctx.all_gather(samples, axis, 0, pmap::tiled);
    std::vector<Key> splitters(static_cast<std::size_t>(d - 1));
    choose_splitters(all.data(), all.size(), d, splitters.data());

    std::vector<Index> send(static_cast<std::size_t>(d));
    bucket_sizes(local.data(), local.size(), splitters.data(), d, send.data());
    auto got = ctx.ragged_all_to_all(local, axis, send);

    Keys sorted(got.data.size());
    std::vector<Key> scratch;
    merge_runs(got.data.data(), got.offsets.data(), got.sizes.data(), d, sorted.data(), scratch);
    // The received keys' storage is this device's next exchange's (in a loop of sorts of
    // similar keys, the next ragged_all_to_all writes there instead of in fresh pages).
    ctx.donate(std::move(got.data));
    return sorted;
  };
}

}  // namespace sample_sort
