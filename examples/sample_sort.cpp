// A sample sort of N int32 keys over the devices of a one-axis mesh "x": shard_map gives each
// device a block of the keys (N need not divide by the device count: blocks differ by one
// key), and each device
//   1. sorts its block and takes kSamples evenly spaced keys of it;
//   2. gathers every device's samples (all_gather), sorts them and picks d - 1 splitters;
//   3. counts its keys per bucket (bucket j: the keys between splitters j-1 and j);
//   4. sends bucket j to device j with one ragged_all_to_all: rows in per-destination
//      counts, so nothing is padded, whatever the keys;
//   5. merges the d sorted runs it received (Ragged::offsets and ::sizes say where they are).
// Device j's result holds bucket j, sorted, and buckets are in device order, so the output,
// split P("x") (blocks of any size along a split dimension), is the sorted array.
//
// The check: the result against std::sort of the same keys, key for key (exit 1 on a
// mismatch). `--keys skewed` draws 90% of the keys equal to one value, so that one bucket
// holds most of them and the exchange is far from even.
//
//   pmap_sample_sort [--size N] [--keys uniform|skewed] [--seed S] [--devices D] [--threads T]
//
// Defaults: N = 2^22 keys, uniform, seed 7, D = 8 devices on T = 2 threads.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <pmap/pmap.hpp>

#include "common.hpp"
#include "sample_sort.hpp"

namespace {

using sample_sort::Index;
using sample_sort::Key;
using sample_sort::Keys;

/// The sort: a callable taking the [N] keys and returning them sorted.
auto sorter(const pmap::Mesh& mesh) {
  return pmap::shard_map(sample_sort::kernel("x"), mesh, {pmap::P("x")}, {pmap::P("x")});
}

}  // namespace

int main(int argc, char** argv) {
  examples::Flags flags(argc, argv,
                        "[--size N] [--keys uniform|skewed] [--seed S] [--devices D] [--threads T]");
  const auto n = static_cast<Index>(flags.integer("--size", Index{1} << 22));
  const std::string kind = flags.text("--keys", "uniform");
  const auto seed = static_cast<unsigned>(flags.integer("--seed", 7));
  const int devices = static_cast<int>(flags.integer("--devices", 8));
  const int threads = static_cast<int>(flags.integer("--threads", 2));
  flags.done();
  flags.require(n >= 0 && devices >= 1 && threads >= 1 && (kind == "uniform" || kind == "skewed"),
                "need --size >= 0, positive counts and --keys uniform or skewed");

  pmap::Runtime rt({.num_devices = devices, .num_threads = threads});
  const pmap::Mesh mesh({{"x", devices}}, &rt);
  auto sort = sorter(mesh);
  const Keys keys = sample_sort::make_keys(n, kind == "skewed", seed);
  Keys sorted;
  const double ms = examples::milliseconds([&] { sorted = sort(keys); });

  std::vector<Key> want(keys.data(), keys.data() + n);
  std::sort(want.begin(), want.end());
  if (sorted.size() != n) {
    std::fprintf(stderr, "sample_sort: %ld keys in, %ld out\n", static_cast<long>(n),
                 static_cast<long>(sorted.size()));
    return 1;
  }
  for (Index k = 0; k < n; ++k)
    if (sorted(k) != want[static_cast<std::size_t>(k)]) {
      std::fprintf(stderr, "sample_sort: key %ld is %d, std::sort gives %d\n", static_cast<long>(k),
                   sorted(k), want[static_cast<std::size_t>(k)]);
      return 1;
    }
  std::printf("sample_sort: %ld %s int32 keys on %d devices / %d threads in %.1f ms, the same as "
              "std::sort\n",
              static_cast<long>(n), kind.c_str(), devices, threads, ms);
  return 0;
}
