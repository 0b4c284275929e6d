// pmap-bench's sample_sort workload (group "apps", listed in apps.cpp): 2^22 int32 keys
// sorted by examples/sample_sort.hpp's kernel on a 2-device mesh, uniform and skewed, against
// the same steps in one OpenMP region.

// Before any Eigen include, as in apps.cpp (report/apps.hpp, report/more_baselines.hpp).
#define EIGEN_USE_THREADS
#define EIGEN_DONT_PARALLELIZE

#include "report/apps.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include <omp.h>

#include <pmap/pmap.hpp>

#include "../examples/sample_sort.hpp"
#include "report/workload.hpp"

namespace pmap::report {
namespace {
using Eigen::Index;
}  // namespace

// ---- sample sort -----------------------------------------------------------------------------

namespace {

namespace ss = sample_sort;

/// The keys sorted into `out` by an OpenMP team of d threads: the steps of the pmap kernel
/// (examples/sample_sort.hpp) with a barrier where the kernel has a collective (the samples,
/// then the bucket sizes), and the exchange copying bucket b of every block in place. Like
/// the kernel, each thread allocates its sorted block and the keys it receives per call,
/// the shared tables are the team's; the merge writes into `out` directly (the kernel
/// returns its bucket, which shard_map copies into the caller's result).
void omp_sample_sort(int d, const ss::Keys& keys, ss::Keys& out) {
  const Index n = keys.size();
  std::vector<std::vector<ss::Key>> local(static_cast<std::size_t>(d));
  std::vector<ss::Key> samples(static_cast<std::size_t>(d * ss::kSamples));
  std::vector<Index> table(static_cast<std::size_t>(d * d));  // [k * d + j]: block k, bucket j
#pragma omp parallel num_threads(d)
  {
    const int b = omp_get_thread_num();
    const auto [lo, hi] = ss::block_of(n, d, b);
    auto& mine = local[static_cast<std::size_t>(b)];
    mine.assign(keys.data() + lo, keys.data() + hi);
    std::sort(mine.begin(), mine.end());
    ss::take_samples(mine.data(), hi - lo, samples.data() + b * ss::kSamples);
#pragma omp barrier
    std::vector<ss::Key> all = samples, splitters(static_cast<std::size_t>(d - 1));
    ss::choose_splitters(all.data(), static_cast<Index>(all.size()), d, splitters.data());
    ss::bucket_sizes(mine.data(), hi - lo, splitters.data(), d, table.data() + b * d);
#pragma omp barrier
    auto at = [&](int k, int j) { return table[static_cast<std::size_t>(k * d + j)]; };
    std::vector<Index> sizes(static_cast<std::size_t>(d)), offsets(static_cast<std::size_t>(d));
    Index total = 0, start = 0;  // start: where bucket b begins in out
    for (int k = 0; k < d; ++k) {
      sizes[static_cast<std::size_t>(k)] = at(k, b);
      offsets[static_cast<std::size_t>(k)] = total;
      total += at(k, b);
      for (int j = 0; j < b; ++j) start += at(k, j);
    }
    std::vector<ss::Key> received(static_cast<std::size_t>(total)), scratch;
    for (int k = 0; k < d; ++k) {
      Index first = 0;
      for (int j = 0; j < b; ++j) first += at(k, j);
      std::copy_n(local[static_cast<std::size_t>(k)].data() + first, at(k, b),
                  received.data() + offsets[static_cast<std::size_t>(k)]);
    }
    ss::merge_runs(received.data(), offsets.data(), sizes.data(), d, out.data() + start, scratch);
  }  // the peers read a thread's block until here (the region's barrier)
}

}  // namespace

void sample_sort(Env& env) {
  const int d = 2;
  const int t = env.threads_for(d);
  pmap::Runtime rt({.num_devices = d, .num_threads = t});
  const pmap::Mesh mesh({{"x", d}}, &rt);
  auto f = pmap::shard_map(ss::kernel("x"), mesh, {pmap::P("x")}, {pmap::P("x")});
  const Index n = Index{1} << 22;
  for (const bool skewed : {false, true}) {
    const ss::Keys keys = ss::make_keys(n, skewed, 11);
    ss::Keys out(n), out_omp(n);
    // Once before measuring: both give std::sort's order.
    f.into(out, keys);
    omp_sample_sort(d, keys, out_omp);
    std::vector<ss::Key> want(keys.data(), keys.data() + n);
    std::sort(want.begin(), want.end());
    if (!std::equal(want.begin(), want.end(), out.data()) ||
        !std::equal(want.begin(), want.end(), out_omp.data()))
      throw std::runtime_error("sample_sort: shard_map or omp does not give std::sort's order");

    const std::string size = format("2^22 int32, %s keys, ", skewed ? "skewed" : "uniform") +
                             devices_threads(d, t);
    const auto count = static_cast<double>(n);
    Case cs("sample sort, " + size);
    cs.add("shard_map", repeat([&] { f.into(out, keys); }), 1, count);
    add_omp(cs, "omp", t, repeat([&] { omp_sample_sort(d, keys, out_omp); }), 1, count);
    cs.measure(env.settings);
    env.report->add(compare(cs, "sample_sort", size, "shard_map", "omp", Case::kRate,
                            Target::at_least(0.95), "Mkeys/s", 1e-6));
  }
}

}  // namespace pmap::report
