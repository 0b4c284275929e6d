/// @file test_grouped.cpp
/// @brief Grouped collectives (axis_index_groups, SPEC 2.3 and 8.5) whose groups take
/// different protocol paths: groups of different sizes, or of one size with different
/// operand shapes, agree within each group but not with each other, so one group may take a
/// path with more barriers than another. Whatever the paths, the collectives after them (over
/// the whole axis) must see every device's own data, and a kernel error raised beside a
/// large grouped collective must reach the caller as is.
///
/// Paths of a collective today (include/pmap/collectives.hpp): inputs of at most 8 KiB per
/// device in a collective over the whole team are staged (one barrier); a reduction of at
/// least 64 KiB per device over a group of two or more is split (three barriers); everything
/// else reads the peers' buffers in place (two barriers). The tests only assert results, so
/// they hold whatever the thresholds become; the sizes are chosen to land on each path.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <typeinfo>
#include <utility>
#include <vector>

#include "collective_util.hpp"

namespace {

using namespace coll_test;

using F1 = Tensor<float, 1>;
using F2 = Tensor<float, 2>;


/// Elements per device that land on each path (float32).
constexpr Index kSmall = 37;      // 148 B: staged over the whole axis, in place in a group
constexpr Index kMedium = 3000;   // 12 KiB: above the staging limit, below the split limit
constexpr Index kLarge = 20000;   // 80 KiB: a split reduction (groups of two or more)

/// What poisoned buffers hold: no collective result of this suite is negative.
constexpr float kPoison = -1000.f;

/// Runs f, which must throw exactly std::runtime_error (not a pmap::DeviceError, which
/// derives from it) with what() == message: the kernel's own exception, rethrown as is.
template <class F>
void expect_kernel_error(F&& f, const std::string& message, const std::string& context) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(typeid(e), typeid(std::runtime_error))
        << context << ": expected the kernel's std::runtime_error, got " << typeid(e).name()
        << " \"" << e.what() << "\"";
    EXPECT_EQ(std::string(e.what()), message) << context;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << context << ": expected std::runtime_error \"" << message << "\", got "
                  << typeid(e).name() << " \"" << e.what() << "\"";
    return;
  } catch (...) {
    ADD_FAILURE() << context << ": expected std::runtime_error, got a non-std exception";
    return;
  }
  ADD_FAILURE() << context << ": expected std::runtime_error \"" << message
                << "\", nothing thrown";
}

// ---- the repros of the issue ---------------------------------------------------------------

TEST(GroupedPaths, SplitPairAndSingletonGroupThenWholeAxisPsum) {
  // Group {0, 1} reduces 128 KiB per device (split), group {2} alone (never split): then a
  // psum over the whole axis. 1 + 1 = 2 on devices 0 and 1, 1 on device 2; 2 + 2 + 1 = 5.
  for (int threads : {3, 1}) {
    pmap::Runtime rt({.num_devices = 3, .num_threads = threads});
    F2 x(3, Index{1} << 15);
    x.setConstant(1.f);
    auto f = pmap::pmap(
        [](pmap::Context& ctx, auto v) {
          Tensor<float, 1, RowMajor> s = ctx.psum(v, "i", {{0, 1}, {2}});
          return ctx.psum(s, "i");
        },
        on_axis(rt));
    for (int call = 0; call < 10; ++call) {
      const std::string where =
          std::to_string(threads) + " threads, call " + std::to_string(call);
      try {
        F2 y = f(x);
        Index bad = y.dimension(0) == 3 && y.dimension(1) == Index{1} << 15 ? 0 : 1;
        for (Index k = 0; bad == 0 && k < y.size(); ++k) bad += y.data()[k] != 5.f;
        EXPECT_EQ(bad, 0) << where << ": shape or elements other than 5";
      } catch (const std::exception& e) {
        ADD_FAILURE() << where << ": threw " << typeid(e).name() << " \"" << e.what() << "\"";
      }
      if (HasFailure()) break;  // one report per runtime shape
    }
  }
}

TEST(GroupedPaths, WholeAxisPsumBetweenGroupedPsumsOfSwappedSizesReadsNoPoison) {
  // Groups {0, 1} and {2, 3} reduce different sizes (128 KiB: split; 64 B: in place), then
  // everybody sums w = i + 1 (62.5 KB, in place) and poisons w as soon as its psum returns,
  // then the groups reduce the swapped sizes. A device released from the whole-axis psum
  // before a peer has read its w hands the peer -1000s: r must be 1 + 2 + 3 + 4 = 10. On odd
  // calls devices 2 and 3 reach the whole-axis psum late, which is when such a device slips
  // through unnoticed (on even calls the devices mostly meet in different collectives).
  pmap::Runtime rt({.num_devices = 4, .num_threads = 4});
  F1 x(4);
  x.setZero();
  const pmap::Groups groups{{0, 1}, {2, 3}};
  constexpr Index kBig = Index{1} << 15;
  int call = 0;
  auto f = pmap::pmap(
      [&groups, &call](pmap::Context& ctx, auto) {
        const int i = ctx.axis_index("i");
        int wrong = 0;
        F1 a(i < 2 ? kBig : 16);
        a.setConstant(1.f);
        const F1 s1 = ctx.psum(a, "i", groups);
        F1 w(16000);
        w.setConstant(static_cast<float>(i + 1));
        if (i >= 2 && call % 2 == 1) std::this_thread::sleep_for(std::chrono::microseconds(50));
        F1 r = ctx.psum(w, "i");
        w.setConstant(-1000.f);
        F1 b(i < 2 ? 16 : kBig);
        b.setConstant(1.f);
        const F1 s2 = ctx.psum(b, "i", groups);
        if (s1.size() != a.size() || s2.size() != b.size()) ++wrong;
        for (Index k = 0; k < s1.size(); ++k) wrong += s1(k) != 2.f;
        for (Index k = 0; k < s2.size(); ++k) wrong += s2(k) != 2.f;
        return std::make_tuple(r, wrong);
      },
      on_axis(rt));
  const int calls = kSanitized ? 40 : 200;
  int wrong_calls = 0;
  int thrown_calls = 0;
  std::string first_wrong, first_thrown;
  for (call = 0; call < calls; ++call) {
    try {
      auto [r, wrong] = f(x);
      bool ok = r.dimension(0) == 4 && r.dimension(1) == 16000;
      for (Index k = 0; ok && k < r.size(); ++k) ok = r.data()[k] == 10.f;
      for (Index p = 0; p < 4; ++p) ok = ok && wrong(p) == 0;
      if (!ok && wrong_calls++ == 0) {
        first_wrong = "call " + std::to_string(call) + ": r(p, 0) =";
        for (Index p = 0; p < 4; ++p) first_wrong += " " + std::to_string(r(p, 0));
        first_wrong += ", wrong grouped elements =";
        for (Index p = 0; p < 4; ++p) first_wrong += " " + std::to_string(wrong(p));
      }
    } catch (const std::exception& e) {
      if (thrown_calls++ == 0)
        first_thrown = "call " + std::to_string(call) + " threw " + typeid(e).name() + " \"" +
                       e.what() + "\"";
    }
  }
  EXPECT_EQ(wrong_calls, 0) << wrong_calls << " of " << calls
                            << " calls returned wrong values; first: " << first_wrong;
  EXPECT_EQ(thrown_calls, 0) << thrown_calls << " of " << calls
                             << " calls threw; first: " << first_thrown;
}

TEST(GroupedFailure, KernelErrorBesideALargeGroupedPsumIsRethrownAsIs) {
  // Device 2 (alone in its group) throws after a delay that varies from call to call, while
  // devices 0 and 1 split a large psum between themselves: every call must end with the
  // kernel's own exception, and the devices of the pair must not touch freed buffers.
  pmap::Runtime rt({.num_devices = 3, .num_threads = 3});
  F1 x(3);
  x.setZero();
  const Index len = kSanitized ? (Index{1} << 20) : (Index{8} << 20);  // 4 / 32 MiB per device
  int delay_us = 0;
  auto f = pmap::pmap(
      [&delay_us, len](pmap::Context& ctx, auto) {
        const int i = ctx.axis_index("i");
        if (i == 2) {
          std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
          throw std::runtime_error("boom");
        }
        F1 a(len);
        a.setConstant(static_cast<float>(i + 1));
        return ctx.psum(a, "i", {{0, 1}, {2}})(0);
      },
      on_axis(rt));
  const int calls = kSanitized ? 20 : 60;
  for (int call = 0; call < calls; ++call) {
    delay_us = (call * 997) % 20000;
    expect_kernel_error([&] { (void)f(x); }, "boom",
                        "call " + std::to_string(call) + " (delay " + std::to_string(delay_us) +
                            " us)");
    if (HasFailure()) break;
  }
  // The runtime still serves the same grouped psum afterwards.
  auto ok = pmap::pmap(
      [len](pmap::Context& ctx, auto) {
        F1 a(len);
        a.setConstant(static_cast<float>(ctx.axis_index("i") + 1));
        return ctx.psum(a, "i", {{0, 1}, {2}})(len - 1);
      },
      on_axis(rt));
  F1 y = ok(x);
  EXPECT_EQ(y(0), 3.f);
  EXPECT_EQ(y(1), 3.f);
  EXPECT_EQ(y(2), 3.f);
}

// ---- every pair of paths, then collectives over the whole axis -----------------------------

enum class Kind { psum, pmax, all_gather, ppermute };

/// One collective of a sequence: its kind, its groups ({} = the whole axis) and the length of
/// every device's operand, one per group (members of a group agree on it).
struct Step {
  std::string name;
  Kind kind = Kind::psum;
  pmap::Groups groups;
  std::vector<Index> lengths;

  int group_index(int p) const {
    for (std::size_t g = 0; g < groups.size(); ++g)
      for (int m : groups[g])
        if (m == p) return static_cast<int>(g);
    return 0;
  }
  std::vector<int> members(int p, int n) const {
    return groups.empty() ? iota(n) : groups[static_cast<std::size_t>(group_index(p))];
  }
  Index length(int p) const { return lengths[static_cast<std::size_t>(group_index(p))]; }
};

/// Exactly representable operand values: device q, element k.
float value(int q, Index k, int seed) {
  return static_cast<float>((q + 1) * 8 + static_cast<int>(k % 7) + seed);
}

/// Lengths alternating between a and b over the groups of `groups`.
std::vector<Index> alternating(const pmap::Groups& groups, Index a, Index b) {
  std::vector<Index> l;
  for (std::size_t g = 0; g < groups.size(); ++g) l.push_back(g % 2 == 0 ? a : b);
  return l;
}

/// The collectives the pairs are made of, on an axis of n devices: each whole-axis path and
/// grouped reductions and gathers over groups of equal and unequal sizes, with one or with
/// different operand shapes per group.
std::vector<Step> leading_steps(int n) {
  std::vector<Step> steps{
      {"psum_whole_staged", Kind::psum, {}, {kSmall}},
      {"psum_whole_in_place", Kind::psum, {}, {kMedium}},
      {"psum_whole_split", Kind::psum, {}, {kLarge}},
  };
  if (n % 2 == 0) {
    pmap::Groups pairs;
    for (int p = 0; p < n; p += 2) pairs.push_back({p, p + 1});
    steps.push_back({"psum_pairs_split", Kind::psum, pairs, alternating(pairs, kLarge, kLarge)});
    steps.push_back(
        {"psum_pairs_in_place", Kind::psum, pairs, alternating(pairs, kMedium, kMedium)});
    if (n >= 4) {
      steps.push_back({"psum_pairs_split_and_in_place", Kind::psum, pairs,
                       alternating(pairs, kLarge, kMedium)});
      steps.push_back({"pmax_pairs_small_and_split", Kind::pmax, pairs,
                       alternating(pairs, kSmall, kLarge)});
      steps.push_back({"all_gather_pairs_large_and_small", Kind::all_gather, pairs,
                       alternating(pairs, kLarge, kSmall)});
    }
  }
  if (n >= 3) {
    pmap::Groups rest_last(2), first_rest(2);
    for (int p = 0; p < n - 1; ++p) rest_last[0].push_back(p);
    rest_last[1].push_back(n - 1);
    first_rest[0].push_back(0);
    for (int p = 1; p < n; ++p) first_rest[1].push_back(p);
    // The group of n - 1 splits, the singleton never does.
    steps.push_back({"psum_rest_and_last_split", Kind::psum, rest_last, {kLarge, kLarge}});
    steps.push_back({"pmax_first_and_rest_split", Kind::pmax, first_rest, {kLarge, kLarge}});
    steps.push_back(
        {"psum_first_in_place_rest_split", Kind::psum, first_rest, {kMedium, kLarge}});
  }
  if (n == 8) {
    const pmap::Groups mixed{{0, 1, 2, 3}, {4, 5}, {6}, {7}};
    steps.push_back(
        {"psum_four_two_one_one", Kind::psum, mixed, {kLarge, kMedium, kLarge, kSmall}});
  }
  return steps;
}

/// Collectives over the whole axis that follow every pair: each path of psum, all_gather and
/// ppermute.
std::vector<Step> trailing_steps() {
  return {
      {"psum_whole_staged", Kind::psum, {}, {kSmall}},
      {"psum_whole_in_place", Kind::psum, {}, {kMedium}},
      {"psum_whole_split", Kind::psum, {}, {kLarge}},
      {"all_gather_whole_staged", Kind::all_gather, {}, {kSmall}},
      {"all_gather_whole_in_place", Kind::all_gather, {}, {kMedium}},
      {"ppermute_whole_staged", Kind::ppermute, {}, {kSmall}},
      {"ppermute_whole_in_place", Kind::ppermute, {}, {kMedium}},
      {"ppermute_whole_large", Kind::ppermute, {}, {kLarge}},
  };
}

/// Runs steps[s] for s in order, `iterations` times, on device p of n: each operand is
/// poisoned as soon as its collective returns, and each result once it has been checked
/// against the serial value, so that a peer still reading either one sees poison. Adds the
/// wrong elements to `wrong` and records the first wrong step (iteration * steps + s).
void run_sequence(pmap::Context& ctx, const std::vector<Step>& steps, int iterations, int& wrong,
                  int& first_bad) {
  const int p = ctx.axis_index("i");
  const int n = ctx.axis_size("i");
  const auto shift = ring(n, 1);
  const int count = static_cast<int>(steps.size());
  for (int it = 0; it < iterations; ++it)
    for (int s = 0; s < count; ++s) {
      const Step& st = steps[static_cast<std::size_t>(s)];
      const int seed = (it * 5 + s * 3) % 11;
      const Index len = st.length(p);
      const std::vector<int> members = st.members(p, n);
      F1 in(len);
      for (Index k = 0; k < len; ++k) in(k) = value(p, k, seed);
      // A different device arrives late on each step.
      if ((it * 7 + s) % n == p) std::this_thread::sleep_for(std::chrono::microseconds(20));
      int bad = 0;
      switch (st.kind) {
        case Kind::psum:
        case Kind::pmax: {
          F1 r = st.kind == Kind::psum ? ctx.psum(in, "i", st.groups) : ctx.pmax(in, "i", st.groups);
          in.setConstant(kPoison);
          int ones = 0;
          int top = 0;
          for (int q : members) {
            ones += q + 1;
            top = std::max(top, q + 1);
          }
          const int m = static_cast<int>(members.size());
          if (r.dimension(0) != len) {
            bad = 1;
          } else {
            for (Index k = 0; k < len; ++k) {
              const int rest = static_cast<int>(k % 7) + seed;
              const float expect = st.kind == Kind::psum ? static_cast<float>(m * rest + 8 * ones)
                                                         : static_cast<float>(8 * top + rest);
              bad += r(k) != expect;
            }
          }
          r.setConstant(kPoison);
          break;
        }
        case Kind::all_gather: {
          F2 r = ctx.all_gather(in, "i", 0, st.groups);
          in.setConstant(kPoison);
          const auto m = static_cast<Index>(members.size());
          if (r.dimension(0) != m || r.dimension(1) != len) {
            bad = 1;
          } else {
            for (Index q = 0; q < m; ++q)
              for (Index k = 0; k < len; ++k)
                bad += r(q, k) != value(members[static_cast<std::size_t>(q)], k, seed);
          }
          r.setConstant(kPoison);
          break;
        }
        case Kind::ppermute: {
          F1 r = ctx.ppermute(in, "i", shift);
          in.setConstant(kPoison);
          const int from = (p + n - 1) % n;
          if (r.dimension(0) != len) {
            bad = 1;
          } else {
            for (Index k = 0; k < len; ++k) bad += r(k) != value(from, k, seed);
          }
          r.setConstant(kPoison);
          break;
        }
      }
      if (bad != 0 && first_bad < 0) first_bad = it * count + s;
      wrong += bad;
    }
}

class GroupedPathPairs : public RuntimeTest {};
INSTANTIATE_TEST_SUITE_P(Runtimes, GroupedPathPairs,
                         testing::Values(RtConfig{3, 1}, RtConfig{3, 3}, RtConfig{4, 2},
                                         RtConfig{4, 4}, RtConfig{8, 2}),
                         config_name);

TEST_P(GroupedPathPairs, EveryPairOfPathsThenWholeAxisCollectivesIsExact) {
  const int N = n();
  const std::vector<Step> leading = leading_steps(N);
  const std::vector<Step> trailing = trailing_steps();
  const int iterations = kSanitized ? 1 : 2;
  F1 x(N);
  x.setZero();
  std::vector<std::string> failures;
  int pairs = 0;
  for (const Step& a : leading)
    for (const Step& b : leading) {
      std::vector<Step> steps{a, b};
      steps.insert(steps.end(), trailing.begin(), trailing.end());
      const std::string pair = a.name + " then " + b.name;
      ++pairs;
      auto f = pmap::pmap(
          [&steps, iterations](pmap::Context& ctx, auto) {
            int wrong = 0;
            int first_bad = -1;
            run_sequence(ctx, steps, iterations, wrong, first_bad);
            return std::make_tuple(wrong, first_bad);
          },
          on_axis(rt()));
      try {
        auto [wrong, first_bad] = f(x);
        int total = 0;
        int first = -1;
        for (Index p = 0; p < N; ++p) {
          total += wrong(p);
          if (first_bad(p) >= 0 && (first < 0 || first_bad(p) < first)) first = first_bad(p);
        }
        if (total != 0) {
          const int count = static_cast<int>(steps.size());
          failures.push_back(pair + ": " + std::to_string(total) +
                             " wrong elements, first in " +
                             steps[static_cast<std::size_t>(first % count)].name +
                             " (step " + std::to_string(first % count) + ", iteration " +
                             std::to_string(first / count) + ")");
        }
      } catch (const std::exception& e) {
        failures.push_back(pair + ": threw " + typeid(e).name() + " \"" + e.what() + "\"");
      }
    }
  std::string report;
  for (std::size_t k = 0; k < failures.size() && k < 12; ++k) report += "\n  " + failures[k];
  if (failures.size() > 12) report += "\n  ...";
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << pairs
                                << " sequences failed:" << report;
}

}  // namespace
