/// @file test_random.cpp
/// @brief A randomized differential test of the collective engine: seeded random programs
/// (a launch, a device count, a thread count and a sequence of collectives over random axes,
/// groups and operand sizes) run by pmap and by a serial model of the same semantics
/// (SPEC 2.3, 3.5, 8.5, 9), compared exactly.
///
/// A program runs as a flat pmap over "i", as a pmap over "i" whose kernel calls a pmap over
/// "j" (nesting), or as a shard_map over the mesh {"i": a, "j": b}. Each step of a two-axis
/// program names "i", "j", {"i", "j"}, {"j", "i"} or {} (the innermost), with groups over the
/// indices along those names; the devices that meet (a step's teams) are derived over flat
/// device indices, and the model works on teams only.
///
/// Every device holds a 1-D state. A step builds the device's operand from its state
/// (deterministically, with a length the step fixes for the device's team), runs one
/// collective, poisons the operand as soon as the collective returns and the result as soon
/// as it has become the new state, so that a peer that reads either one too late hands
/// somebody a wrong value. The kernel returns a fixed-size summary per device: the final
/// state's size and sum and a checksum of the state after every step, so that a failure
/// names the first step and device that differ from the model. Each device also records its
/// checksums outside the call as it goes, so that a call that ends in an error still says
/// whether some state was already wrong before it. Each program runs 2-3 calls on one Mapped.
///
/// Operand sizes land on each protocol path of include/pmap/collectives.hpp: at most 8 KiB
/// per device (staged, whole-axis collectives), up to 64 KiB (in place) and 64 KiB or more
/// (split reductions, teams of two or more); a grouped reduction gives its teams different
/// sizes, most often one team split and another not, so that the teams take paths with
/// different numbers of barriers and the collectives after them must still line up. Values
/// are small integers (exact in float32 in any order of summation). A step sometimes repeats
/// the previous collective with new data: a device that lost count of the barriers then meets
/// peers whose signatures match, and reads data that is not there yet instead of failing the
/// agreement check. A late device sleeps or yields before its collective.
///
/// Heavy TESTs run few programs with large operands; the Bulk TESTs run 2,000 short programs
/// of mostly small operands. Reproducing a failure: the message prints the program's seed and
/// the whole program; a program is a function of its seed and of its TEST's GenConfig only. A
/// program that hangs is printed by a watchdog, which then aborts the binary.

#include <algorithm>
#include <array>
#include <iterator>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "collective_util.hpp"
#include "watchdog.hpp"

namespace {

using namespace coll_test;


/// Elements (4 bytes each) per device of each size class.
constexpr Index kSmallMax = 2048;                         // 8 KiB: staged over the whole axis
constexpr Index kMediumMax = 16383;                       // < 64 KiB: in place
constexpr Index kLargeMin = 16384;                        // 64 KiB: split (reductions)
constexpr Index kLargeMax = kSanitized ? 17000 : 30000;   // up to 117 KiB

/// What poisoned buffers hold: far outside the values of any correct state (|v| < 10^5).
constexpr int kPoison = -12345;

/// How long one program may run before the watchdog reports it as hung and aborts.
constexpr auto kHangLimit = std::chrono::seconds(kSanitized ? 60 : 20);

// ---- programs ------------------------------------------------------------------------------

enum class Kind { psum, pmax, pmin, pmean, all_gather, all_gather_tiled, ppermute, psum_scatter, all_to_all, ragged };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::psum: return "psum";
    case Kind::pmax: return "pmax";
    case Kind::pmin: return "pmin";
    case Kind::pmean: return "pmean";
    case Kind::all_gather: return "all_gather";
    case Kind::all_gather_tiled: return "all_gather(tiled)";
    case Kind::ppermute: return "ppermute";
    case Kind::psum_scatter: return "psum_scatter(tiled)";
    case Kind::all_to_all: return "all_to_all(tiled)";
    case Kind::ragged: return "ragged_all_to_all";
  }
  return "?";
}

bool is_reduction(Kind k) {
  return k == Kind::psum || k == Kind::pmax || k == Kind::pmin || k == Kind::pmean;
}

/// Which axes a step's collective names. A flat program has one axis, "i" (size n); nested
/// and shard_map programs have two, "i" (size a, outer) and "j" (size b, inner), and a device's
/// flat index is i * b + j.
enum class Over { i, j, ij, ji };

const char* over_name(Over o) {
  switch (o) {
    case Over::i: return "i";
    case Over::j: return "j";
    case Over::ij: return "{i,j}";
    case Over::ji: return "{j,i}";
  }
  return "?";
}

/// How a program runs: pmap over "i"; pmap over "i" whose kernel calls a pmap over "j", or a
/// shard_map over the inner mesh {"j": b}; or shard_map over the mesh {"i": a, "j": b} with
/// one element per device.
enum class Launch { flat, nested, nested_mesh, sharded };

const char* launch_name(Launch l) {
  return l == Launch::flat ? "pmap" : l == Launch::nested ? "nested pmap"
         : l == Launch::nested_mesh ? "shard_map nested in a pmap" : "shard_map";
}

/// The axes of a program: a x b devices (b = 1 for a flat program).
struct Geometry {
  int a = 1;
  int b = 1;

  int devices() const { return a * b; }
  /// The size of the axis (or flattened axes) `o`.
  int size(Over o) const { return o == Over::i ? a : o == Over::j ? b : a * b; }
  /// Device p's index along `o` (axis_index of those names).
  int coord(int p, Over o) const {
    switch (o) {
      case Over::i: return p / b;
      case Over::j: return p % b;
      case Over::ij: return p;
      case Over::ji: return (p % b) * a + p / b;
    }
    return 0;
  }
  /// The flat index of the device at index `idx` along `o` that shares p's other coordinates.
  int flat(int p, Over o, int idx) const {
    switch (o) {
      case Over::i: return idx * b + p % b;
      case Over::j: return (p / b) * b + idx;
      case Over::ij: return idx;
      case Over::ji: return (idx % a) * b + idx / a;
    }
    return 0;
  }
};

enum class Delay { none, yield, sleep };

/// How a step's collective is called (SPEC 11): blocking; started and waited for after the
/// late device's delay; or started twice on the same operand, the later one waited first and
/// both results compared.
enum class Start { blocking, started, twice };

/// One collective of a program.
struct Step {
  Kind kind = Kind::psum;
  Over over = Over::i;
  bool innermost = false;                 ///< names its axis as {} (the innermost axis)
  pmap::Groups groups;                    ///< over the indices along `over`; {} = whole axis
  std::vector<std::pair<int, int>> perm;  ///< ppermute's (source, destination) along `over`
  bool donate = false;                    ///< reductions: the operand is moved in
  bool tree = false;  ///< reductions: the operand is the first of two equal leaves of a tuple
  int late = -1;                          ///< a device that arrives late (-1: none)
  Delay delay = Delay::none;              ///< how it is late
  Start start = Start::blocking;          ///< blocking or started (SPEC 11)

  // Derived over flat device indices by derive():
  pmap::Groups teams;                     ///< the devices that meet, in the collective's order
  std::vector<Index> lengths;             ///< operand length per team
  std::vector<int> team_of;               ///< device -> index of its team
  std::vector<int> position;              ///< device -> its position in its team
  std::vector<int> source;                ///< ppermute: device -> the device it receives from (-1)

  int group_size(int p) const { return static_cast<int>(members(p).size()); }
  Index length(int p) const { return lengths[static_cast<std::size_t>(team_of[static_cast<std::size_t>(p)])]; }
  const std::vector<int>& members(int p) const {
    return teams[static_cast<std::size_t>(team_of[static_cast<std::size_t>(p)])];
  }
};

/// Fills in teams, team_of, position and source from over, groups and perm.
void derive(Step& st, const Geometry& geo) {
  const int n = geo.devices();
  const int m = geo.size(st.over);
  const pmap::Groups whole = {iota(m)};
  const pmap::Groups& axis_groups = st.groups.empty() ? whole : st.groups;
  std::map<std::vector<int>, int> index;
  st.teams.clear();
  st.team_of.assign(static_cast<std::size_t>(n), 0);
  st.position.assign(static_cast<std::size_t>(n), 0);
  st.source.assign(static_cast<std::size_t>(n), -1);
  for (int p = 0; p < n; ++p) {
    const int c = geo.coord(p, st.over);
    for (const std::vector<int>& g : axis_groups) {
      const auto at = std::find(g.begin(), g.end(), c);
      if (at == g.end()) continue;
      std::vector<int> team;
      for (int idx : g) team.push_back(geo.flat(p, st.over, idx));
      const auto [it, fresh] = index.emplace(team, static_cast<int>(st.teams.size()));
      if (fresh) st.teams.push_back(team);
      st.team_of[static_cast<std::size_t>(p)] = it->second;
      st.position[static_cast<std::size_t>(p)] = static_cast<int>(at - g.begin());
    }
    for (const auto& [src, dst] : st.perm)
      if (dst == c) st.source[static_cast<std::size_t>(p)] = geo.flat(p, st.over, src);
  }
}

/// How one device departs from the program at one step (Program::odd_step): another operand
/// shape, no collective at all, another collective, other ppermute pairs. The call must then
/// raise E14 (pmap::DeviceError), whether a peer reads that device there or not.
enum class Deviation { none, shape, skip, kind, parameters };

const char* deviation_name(Deviation d) {
  switch (d) {
    case Deviation::none: return "none";
    case Deviation::shape: return "another shape";
    case Deviation::skip: return "skips it";
    case Deviation::kind: return "another collective";
    case Deviation::parameters: return "other pairs";
  }
  return "?";
}

struct Program {
  std::uint64_t seed = 0;
  Launch launch = Launch::flat;
  Geometry geo;
  int n = 1;  ///< geo.devices()
  int threads = 1;
  bool integers = false;  ///< int32 states (else float32)
  int calls = 2;
  std::vector<Step> steps;
  Deviation deviation = Deviation::none;
  int odd_step = -1;
  int odd_device = -1;

  std::string describe() const;
};

std::string groups_string(const pmap::Groups& groups) {
  std::ostringstream s;
  s << "{";
  for (std::size_t g = 0; g < groups.size(); ++g) {
    s << (g ? ", " : "") << "{";
    for (std::size_t k = 0; k < groups[g].size(); ++k) s << (k ? "," : "") << groups[g][k];
    s << "}";
  }
  s << "}";
  return s.str();
}

std::string Program::describe() const {
  std::ostringstream s;
  s << "program seed=" << seed << " " << launch_name(launch) << " n=" << n;
  if (launch != Launch::flat) s << " (i=" << geo.a << " x j=" << geo.b << ")";
  s << " threads=" << threads << " dtype=" << (integers ? "int32" : "float32")
    << " calls=" << calls << " steps:";
  for (std::size_t k = 0; k < steps.size(); ++k) {
    const Step& st = steps[k];
    s << "\n    " << k << ": " << kind_name(st.kind) << " over "
      << (st.innermost ? "{} (innermost)" : over_name(st.over));
    if (st.kind == Kind::ppermute) {
      s << " perm={";
      for (std::size_t j = 0; j < st.perm.size(); ++j)
        s << (j ? "," : "") << "(" << st.perm[j].first << "," << st.perm[j].second << ")";
      s << "}";
    } else {
      s << " groups=" << (st.groups.empty() ? std::string("whole axis") : groups_string(st.groups));
    }
    s << " lengths per team={";
    for (std::size_t j = 0; j < st.lengths.size(); ++j) s << (j ? "," : "") << st.lengths[j];
    s << "}";
    if (st.donate) s << " donated";
    if (st.tree) s << " as a tree";
    if (st.late >= 0) s << " late=" << st.late << (st.delay == Delay::yield ? " (yields)" : " (sleeps)");
    if (st.start == Start::started) s << " started";
    if (st.start == Start::twice) s << " started twice (the later waited first)";
    if (static_cast<int>(k) == odd_step)
      s << " DEVICE " << odd_device << " DEPARTS: " << deviation_name(deviation);
  }
  return s.str();
}

/// What the generator draws: launches, device and thread counts, step kinds and sizes.
struct GenConfig {
  int min_n = 1;
  int max_n = 8;
  int max_threads = 3;
  bool grouped_focus = false;  ///< mostly grouped reductions and whole-axis collectives
  double nested = 0;           ///< share of nested pmap programs
  double sharded = 0;          ///< share of shard_map programs
  /// Weights of operand sizes: up to 64 elements, up to 8 KiB, up to 64 KiB, 64 KiB and more.
  std::array<double, 4> sizes = {0.35, 0.65, 1, 1};
  double mixed = 0.8;          ///< chance that a grouped step gives one team a large operand
  int max_steps = 12;          ///< at most kMaxSteps
  double yields = 0;           ///< share of late devices that yield instead of sleeping
  double disagree = 0;         ///< share of programs (of 2+ devices) with a departing device
};

using Rng = std::mt19937_64;

int uniform(Rng& rng, int lo, int hi) {  // [lo, hi]
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}
Index uniform_index(Rng& rng, Index lo, Index hi) {
  return std::uniform_int_distribution<Index>(lo, hi)(rng);
}
bool chance(Rng& rng, double p) { return std::bernoulli_distribution(p)(rng); }

enum class SizeClass { tiny, small, medium, large };

/// A length of the class, a multiple of `multiple` (which divides psum_scatter / all_to_all
/// operands into their group's blocks).
Index draw_length(Rng& rng, SizeClass c, Index multiple) {
  Index lo = 1, hi = kSmallMax;
  if (c == SizeClass::tiny) {
    hi = 64;
  } else if (c == SizeClass::medium) {
    lo = kSmallMax + 1;
    hi = kMediumMax;
  } else if (c == SizeClass::large) {
    lo = kLargeMin;
    hi = kLargeMax;
  }
  Index len = uniform_index(rng, lo, hi) / multiple * multiple;
  if (len < lo) len += multiple;
  return len;
}

SizeClass draw_class(Rng& rng, const GenConfig& cfg) {
  std::discrete_distribution<int> pick(cfg.sizes.begin(), cfg.sizes.end());
  return static_cast<SizeClass>(pick(rng));
}

/// A random partition of [0, n) into groups of possibly unequal sizes, members shuffled.
pmap::Groups random_partition(Rng& rng, int n) {
  std::vector<int> order = iota(n);
  std::shuffle(order.begin(), order.end(), rng);
  const int count = n == 1 ? 1 : uniform(rng, 2, n);
  std::vector<int> cuts(static_cast<std::size_t>(n - 1));
  for (int k = 0; k < n - 1; ++k) cuts[static_cast<std::size_t>(k)] = k + 1;
  std::shuffle(cuts.begin(), cuts.end(), rng);
  cuts.resize(static_cast<std::size_t>(count - 1));
  std::sort(cuts.begin(), cuts.end());
  cuts.push_back(n);
  pmap::Groups groups;
  int begin = 0;
  for (int end : cuts) {
    groups.emplace_back(order.begin() + begin, order.begin() + end);
    begin = end;
  }
  return groups;
}

/// A random partition of [0, n) into groups of one size (a divisor of n), members shuffled.
pmap::Groups equal_partition(Rng& rng, int n) {
  std::vector<int> divisors;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) divisors.push_back(d);
  const int size = divisors[static_cast<std::size_t>(uniform(rng, 0, static_cast<int>(divisors.size()) - 1))];
  std::vector<int> order = iota(n);
  std::shuffle(order.begin(), order.end(), rng);
  pmap::Groups groups;
  for (int b = 0; b < n; b += size) groups.emplace_back(order.begin() + b, order.begin() + b + size);
  return groups;
}

/// Operand lengths per team: classes drawn per team, and most often (cfg.mixed) one team
/// large and another not, so that one team splits while another does not.
std::vector<Index> team_lengths(Rng& rng, const pmap::Groups& teams, bool equal_multiple,
                                const GenConfig& cfg) {
  std::vector<SizeClass> classes;
  for (std::size_t g = 0; g < teams.size(); ++g) classes.push_back(draw_class(rng, cfg));
  if (teams.size() >= 2 && chance(rng, cfg.mixed)) {
    // Prefer a team of two or more for the large one: a singleton never splits.
    std::vector<int> multi;
    for (std::size_t g = 0; g < teams.size(); ++g)
      if (teams[g].size() >= 2) multi.push_back(static_cast<int>(g));
    const int big = multi.empty() ? uniform(rng, 0, static_cast<int>(teams.size()) - 1)
                                  : multi[static_cast<std::size_t>(uniform(rng, 0, static_cast<int>(multi.size()) - 1))];
    int other = uniform(rng, 0, static_cast<int>(teams.size()) - 2);
    if (other >= big) ++other;
    classes[static_cast<std::size_t>(big)] = SizeClass::large;
    classes[static_cast<std::size_t>(other)] = chance(rng, 0.5) ? SizeClass::small : SizeClass::medium;
  }
  std::vector<Index> lengths;
  for (std::size_t g = 0; g < teams.size(); ++g)
    lengths.push_back(draw_length(rng, classes[g],
                                  equal_multiple ? static_cast<Index>(teams[g].size()) : 1));
  return lengths;
}

/// The program's launch and axes: a flat pmap of n devices, or a x b devices of a nested pmap
/// or a shard_map (either axis may be 1).
void draw_launch(Rng& rng, Program& prog, const GenConfig& cfg) {
  const double r = std::uniform_real_distribution<double>(0, 1)(rng);
  prog.launch = r < cfg.nested ? Launch::nested : r < cfg.nested + cfg.sharded ? Launch::sharded : Launch::flat;
  if (prog.launch == Launch::nested && chance(rng, 0.4)) prog.launch = Launch::nested_mesh;
  const int n = uniform(rng, cfg.min_n, cfg.max_n);
  if (prog.launch == Launch::flat) {
    prog.geo = {n, 1};
  } else {
    std::vector<int> divisors;
    for (int d = 1; d <= n; ++d)
      if (n % d == 0) divisors.push_back(d);
    const int b = divisors[static_cast<std::size_t>(uniform(rng, 0, static_cast<int>(divisors.size()) - 1))];
    prog.geo = {n / b, b};
  }
  prog.n = prog.geo.devices();
}

/// One device departs from the program at one step, most often a ppermute's (whose devices
/// wait for their source alone: the case that only the end of the call can find). The device
/// shares that step's group with another one: a group of one may call what it likes.
void draw_deviation(Rng& rng, Program& prog) {
  std::vector<int> permutes, others;
  for (std::size_t k = 0; k < prog.steps.size(); ++k) {
    const Step& st = prog.steps[k];
    bool shared = false;
    for (int p = 0; p < prog.n; ++p) shared = shared || st.group_size(p) >= 2;
    // A ragged_all_to_all's members may send any number of rows: a longer operand is no
    // departure there.
    if (shared && st.kind != Kind::ragged)
      (st.kind == Kind::ppermute ? permutes : others).push_back(static_cast<int>(k));
  }
  if (permutes.empty() && others.empty()) return;
  const std::vector<int>& from =
      !permutes.empty() && (others.empty() || chance(rng, 0.7)) ? permutes : others;
  prog.odd_step = from[static_cast<std::size_t>(uniform(rng, 0, static_cast<int>(from.size()) - 1))];
  const Step& st = prog.steps[static_cast<std::size_t>(prog.odd_step)];
  std::vector<int> candidates;
  for (int p = 0; p < prog.n; ++p)
    if (st.group_size(p) >= 2) candidates.push_back(p);
  prog.odd_device =
      candidates[static_cast<std::size_t>(uniform(rng, 0, static_cast<int>(candidates.size()) - 1))];
  const int r = uniform(rng, 0, st.kind == Kind::ppermute ? 3 : 2);
  prog.deviation = r == 0 ? Deviation::shape : r == 1 ? Deviation::skip
                 : r == 2 ? Deviation::kind : Deviation::parameters;
}

Program generate(std::uint64_t seed, const GenConfig& cfg) {
  Rng rng(seed);
  Program prog;
  prog.seed = seed;
  draw_launch(rng, prog, cfg);
  prog.threads = uniform(rng, 1, cfg.max_threads);
  prog.integers = chance(rng, 0.35);
  prog.calls = uniform(rng, 2, 3);
  const int n = prog.n;
  const Geometry& geo = prog.geo;
  const int count = uniform(rng, std::min(4, cfg.max_steps), cfg.max_steps);

  // Weights of the step kinds: grouped reductions, whole-axis reductions, gathers, ...
  enum Pick { grouped_reduce, whole_psum, whole_pmax, one_shuffled_group, gather_whole,
              gather_grouped, permute, scatter_whole, scatter_grouped, a2a_whole, a2a_grouped,
              ragged_whole, ragged_grouped, picks };
  std::vector<double> weights(picks, 0.0);
  if (cfg.grouped_focus) {
    weights[grouped_reduce] = 50;
    weights[whole_psum] = 20;
    weights[whole_pmax] = 5;
    weights[gather_whole] = 8;
    weights[permute] = 12;
    weights[scatter_whole] = 5;
  } else {
    weights[grouped_reduce] = 28;
    weights[whole_psum] = 12;
    weights[whole_pmax] = 6;
    weights[one_shuffled_group] = 3;
    weights[gather_whole] = 8;
    weights[gather_grouped] = 6;
    weights[permute] = 11;
    weights[scatter_whole] = 8;
    weights[scatter_grouped] = 3;
    weights[a2a_whole] = 8;
    weights[a2a_grouped] = 3;
    weights[ragged_whole] = 5;
    weights[ragged_grouped] = 3;
  }
  std::discrete_distribution<int> pick(weights.begin(), weights.end());
  auto lateness = [&](Step& st) {
    st.late = chance(rng, 0.3) ? uniform(rng, 0, n - 1) : -1;
    st.delay = st.late < 0 ? Delay::none : chance(rng, cfg.yields) ? Delay::yield : Delay::sleep;
    const int r = uniform(rng, 0, 9);
    st.start = r < 6 ? Start::blocking : r < 8 ? Start::started : Start::twice;
  };

  for (int s = 0; s < count; ++s) {
    Step st;
    // Sometimes the previous collective again (new data): a device that has lost count of
    // the barriers then meets peers whose signature matches, and reads what is not there yet.
    if (s > 0 && chance(rng, 0.2)) {
      st = prog.steps.back();
      st.donate = is_reduction(st.kind) && chance(rng, 0.3);
      st.tree = is_reduction(st.kind) && chance(rng, 0.25);
      lateness(st);
      prog.steps.push_back(std::move(st));
      continue;
    }
    // The axes: a flat program has one; a two-axis program most often names both.
    if (prog.launch != Launch::flat) {
      const int r = uniform(rng, 0, 9);
      st.over = r < 3 ? Over::i : r < 6 ? Over::j : r < 9 ? Over::ij : Over::ji;
    }
    st.innermost = (st.over == (prog.launch == Launch::flat ? Over::i : Over::j)) && chance(rng, 0.3);
    const int m = geo.size(st.over);
    bool multiple = false;  // operands split into one block per team member
    const int what = pick(rng);
    switch (what) {
      case grouped_reduce: {
        const int r = uniform(rng, 0, 9);
        st.kind = r < 5 ? Kind::psum : r < 7 ? Kind::pmax : r < 8 ? Kind::pmin : Kind::pmean;
        st.groups = random_partition(rng, m);
        break;
      }
      case whole_psum:
      case whole_pmax:
        st.kind = what == whole_psum ? Kind::psum : Kind::pmax;
        break;
      case one_shuffled_group:  // the whole axis as one explicit group, in another order
        st.kind = chance(rng, 0.5) ? Kind::psum : Kind::pmin;
        st.groups = {iota(m)};
        std::shuffle(st.groups[0].begin(), st.groups[0].end(), rng);
        break;
      case gather_whole:
        st.kind = chance(rng, 0.5) ? Kind::all_gather : Kind::all_gather_tiled;
        break;
      case gather_grouped:
        st.kind = chance(rng, 0.5) ? Kind::all_gather : Kind::all_gather_tiled;
        st.groups = equal_partition(rng, m);
        break;
      case permute: {
        st.kind = Kind::ppermute;
        std::vector<int> destinations = iota(m);
        std::shuffle(destinations.begin(), destinations.end(), rng);
        const double keep = uniform(rng, 0, 2) == 0 ? 1.0 : 0.6;
        std::size_t next = 0;
        for (int src = 0; src < m; ++src)
          if (chance(rng, keep)) st.perm.emplace_back(src, destinations[next++]);
        std::shuffle(st.perm.begin(), st.perm.end(), rng);
        break;
      }
      case scatter_whole:
      case a2a_whole:
        st.kind = what == scatter_whole ? Kind::psum_scatter : Kind::all_to_all;
        multiple = true;
        break;
      case scatter_grouped:
      case a2a_grouped:
        st.kind = what == scatter_grouped ? Kind::psum_scatter : Kind::all_to_all;
        st.groups = equal_partition(rng, m);
        multiple = true;
        break;
      case ragged_whole:
        st.kind = Kind::ragged;
        break;
      case ragged_grouped:
        st.kind = Kind::ragged;
        st.groups = equal_partition(rng, m);
        break;
      default:
        break;
    }
    derive(st, geo);
    // ppermute's teams are the devices that share the other axes: one length each.
    st.lengths = team_lengths(rng, st.teams, multiple, cfg);
    st.donate = is_reduction(st.kind) && chance(rng, 0.3);
    st.tree = is_reduction(st.kind) && chance(rng, 0.25);
    lateness(st);
    prog.steps.push_back(std::move(st));
  }
  if (n >= 2 && chance(rng, cfg.disagree)) draw_deviation(rng, prog);
  return prog;
}

// ---- what kernel and model share: operands, states, checksums -------------------------------

/// Summary entries: final size, final sum, then a checksum of the state after each step.
constexpr int kMaxSteps = 12;
constexpr Index kSummary = 2 + kMaxSteps;

std::int64_t wrap(std::int64_t v) { return ((v % 1999) + 1999) % 1999 - 999; }  // [-999, 999]

/// A value as an integer (garbage floats read as a sentinel, not as undefined behaviour).
template <class U>
std::int64_t to_i64(U v) {
  if constexpr (std::is_floating_point_v<U>) {
    if (!(v > -1e15 && v < 1e15)) return 777777777;
    return static_cast<std::int64_t>(v);
  } else {
    return static_cast<std::int64_t>(v);
  }
}

/// op[0, len) from state[0, size): every state element contributes (folded modulo len), kept
/// in [-999, 999], times `mult` (pmean's group size, so that its result is an integer).
template <class T>
void fill_operand(const T* state, Index size, T* op, Index len, std::int64_t salt, int mult) {
  for (Index k = 0; k < len; ++k) {
    std::int64_t v = salt + (k * 7) % 23 + (size > 0 ? to_i64(state[k % size]) * 3 : 0);
    for (Index j = k + len; j < size; j += len) v += to_i64(state[j]);
    op[k] = static_cast<T>(wrap(v) * mult);
  }
}

std::int64_t step_salt(int step, int call) { return 131 * step + 17 * call + 5; }

/// ragged_all_to_all at step `step`: the rows device p sends to each of the g members of its
/// group, out of its len; uneven, some zero, summing to len.
std::vector<Index> ragged_sizes(Index len, int g, int p, std::size_t step) {
  std::vector<Index> weight(static_cast<std::size_t>(g)), sizes(static_cast<std::size_t>(g), 0);
  Index total = 0;
  for (int j = 0; j < g; ++j)
    total += weight[static_cast<std::size_t>(j)] = (p * 7 + j * 3 + static_cast<Index>(step) * 5) % 4;
  if (total == 0) {
    sizes[static_cast<std::size_t>(p % g)] = len;
    return sizes;
  }
  Index given = 0;
  std::size_t last = 0;
  for (std::size_t j = 0; j < sizes.size(); ++j) {
    given += sizes[j] = len * weight[j] / total;
    if (weight[j] > 0) last = j;
  }
  sizes[last] += len - given;
  return sizes;
}

/// An order-dependent checksum of a state; a non-integral value (garbage) hashes unlike any
/// integer.
template <class T>
std::int64_t checksum(const T* v, Index size) {
  std::uint64_t h = 0x9e3779b97f4a7c15ULL ^ static_cast<std::uint64_t>(size);
  for (Index k = 0; k < size; ++k) {
    std::uint64_t x;
    if constexpr (std::is_floating_point_v<T>) {
      const std::int64_t i = to_i64(v[k]);
      x = static_cast<T>(i) == v[k] ? static_cast<std::uint64_t>(i) : 0x5555000000000000ULL ^ static_cast<std::uint64_t>(i);
    } else {
      x = static_cast<std::uint64_t>(static_cast<std::int64_t>(v[k]));
    }
    h = (h ^ x) * 0x100000001b3ULL + static_cast<std::uint64_t>(k);
  }
  return static_cast<std::int64_t>(h);
}

template <class T>
std::int64_t sum_of(const T* v, Index size) {
  std::int64_t s = 0;
  for (Index k = 0; k < size; ++k) s += to_i64(v[k]);
  return s;
}

/// The initial state of device p in call `call`, from the value it receives (call * 100 + p).
template <class T>
std::vector<T> initial_state(int value, int p) {
  std::vector<T> s(static_cast<std::size_t>(1 + (p * 5 + value) % 7));
  for (std::size_t k = 0; k < s.size(); ++k)
    s[k] = static_cast<T>(wrap(value * 31 + static_cast<std::int64_t>(k) * 7 + p));
  return s;
}

// ---- the kernel ----------------------------------------------------------------------------

template <class T>
using T1 = Tensor<T, 1>;
using Summary = Tensor<std::int64_t, 1>;

/// The names a step passes to its collective.
pmap::AxisNames axis_names(const Step& st) {
  if (st.innermost) return {};
  switch (st.over) {
    case Over::i: return "i";
    case Over::j: return "j";
    case Over::ij: return {"i", "j"};
    case Over::ji: return {"j", "i"};
  }
  return {};
}

/// Device p's flat index.
int flat_index(pmap::Context& ctx, const Program& prog) {
  return prog.launch == Launch::flat ? ctx.axis_index("i") : ctx.axis_index({"i", "j"});
}

/// A collective's tensor: itself, or a ragged_all_to_all's rows.
template <class R>
auto& data_of(R& r) {
  if constexpr (requires { r.offsets; })
    return r.data;
  else
    return r;
}

/// Two results hold the same values (the same shapes).
template <class A, class B>
bool same_values(const A& a, const B& b) {
  if (a.size() != b.size()) return false;
  for (Index k = 0; k < a.size(); ++k)
    if (!(a.data()[k] == b.data()[k])) return false;
  return true;
}

template <class T>
Summary run_device(pmap::Context& ctx, const Program& prog, int value, int call,
                   std::vector<std::int64_t>& trace) {
  const int p = flat_index(ctx, prog);
  Summary out(kSummary);
  out.setZero();
  const std::vector<T> init = initial_state<T>(value, p);
  T1<T> state(static_cast<Index>(init.size()));
  std::copy(init.begin(), init.end(), state.data());
  const T poison = static_cast<T>(kPoison);

  for (std::size_t s = 0; s < prog.steps.size(); ++s) {
    const Step& st = prog.steps[s];
    const Deviation departs =
        static_cast<int>(s) == prog.odd_step && p == prog.odd_device ? prog.deviation : Deviation::none;
    if (departs == Deviation::skip) continue;
    const bool blocks = st.kind == Kind::psum_scatter || st.kind == Kind::all_to_all;
    const Index len = st.length(p) + (departs != Deviation::shape ? 0 : blocks ? st.group_size(p) : 1);
    const int mult = st.kind == Kind::pmean ? st.group_size(p) : 1;
    T1<T> op(len);
    fill_operand(state.data(), state.size(), op.data(), len,
                 step_salt(static_cast<int>(s), call), mult);
    auto be_late = [&] {
      if (st.late != p) return;
      if (st.delay == Delay::yield) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(30));
      }
    };
    if (st.start == Start::blocking) be_late();  // a started step is late between start and wait
    const pmap::AxisNames axes = axis_names(st);
    // The result becomes the state; then it is poisoned too (a peer may read it in place).
    auto take = [&](auto& r) {
      using R = typename std::remove_reference_t<decltype(r)>::Scalar;
      state.resize(r.size());
      for (Index k = 0; k < r.size(); ++k) {
        if constexpr (std::is_same_v<R, T>) {
          state.data()[k] = r.data()[k];
        } else {
          state.data()[k] = static_cast<T>(to_i64(r.data()[k]));
        }
      }
      r.setConstant(static_cast<R>(kPoison));
      out(2 + static_cast<Index>(s)) = checksum(state.data(), state.size());
      trace[s] = out(2 + static_cast<Index>(s));
    };
    // The step's collective, blocking or started (Step::start): `blocking(x)` and
    // `started(x)` call it on operand x; the operand is poisoned once every result is in.
    auto run = [&](auto blocking, auto started) {
      if (st.start == Start::blocking) {
        auto r = blocking(op);
        op.setConstant(poison);
        take(data_of(r));
        return;
      }
      auto first = started(op);
      auto r = [&] {
        if (st.start == Start::started) {
          be_late();
          return first.wait();
        }
        auto second = started(op);
        be_late();
        auto later = second.wait();
        auto r1 = first.wait();
        using R = typename std::remove_reference_t<decltype(data_of(r1))>::Scalar;
        if (!same_values(data_of(r1), data_of(later))) data_of(r1).setConstant(R(1));  // not the model's
        return r1;
      }();
      op.setConstant(poison);
      take(data_of(r));
    };
    // A tree step: the operand and a copy as the leaves of a tuple, lent or donated, blocking
    // or started; the result is the first leaf's, which the second must equal.
    auto reduce_tree = [&](auto blocking, auto started) {
      auto tree = std::make_tuple(op, T1<T>(op));
      auto leaves = [&](auto& r) -> auto& {
        auto& first = std::get<0>(r);
        using R = typename std::remove_reference_t<decltype(first)>::Scalar;
        if (!same_values(first, std::get<1>(r))) first.setConstant(R(1));  // not the model's
        std::get<0>(tree).setConstant(poison);
        std::get<1>(tree).setConstant(poison);
        return first;
      };
      if (st.start == Start::blocking) {
        auto r = st.donate ? blocking(std::move(tree)) : blocking(tree);
        take(leaves(r));
        return;
      }
      auto h = st.donate ? started(std::move(tree)) : started(tree);
      be_late();
      auto r = h.wait();
      take(leaves(r));
    };
    auto reduce = [&](auto blocking, auto started) {
      if (st.tree) return reduce_tree(blocking, started);
      if (!st.donate) return run(blocking, started);
      if (st.start == Start::blocking) {
        auto r = blocking(std::move(op));
        take(r);
        return;
      }
      auto h = started(std::move(op));  // donated to the started collective
      be_late();
      auto r = h.wait();
      take(r);
    };
    if (departs == Deviation::kind || departs == Deviation::parameters) {
      using Pairs = std::vector<std::pair<int, int>>;
      T1<T> r = departs == Deviation::parameters
                    ? ctx.ppermute(op, axes, st.perm.empty() ? Pairs{{0, 0}} : Pairs{})
                : st.kind == Kind::ppermute ? ctx.pbroadcast(op, axes, 0)
                                            : ctx.ppermute(op, axes, Pairs{});
      take(r);
      continue;
    }
    switch (st.kind) {
      case Kind::psum:
        reduce([&](auto&& x) { return ctx.psum(std::forward<decltype(x)>(x), axes, st.groups); },
               [&](auto&& x) { return ctx.psum_start(std::forward<decltype(x)>(x), axes, st.groups); });
        break;
      case Kind::pmax:
        reduce([&](auto&& x) { return ctx.pmax(std::forward<decltype(x)>(x), axes, st.groups); },
               [&](auto&& x) { return ctx.pmax_start(std::forward<decltype(x)>(x), axes, st.groups); });
        break;
      case Kind::pmin:
        reduce([&](auto&& x) { return ctx.pmin(std::forward<decltype(x)>(x), axes, st.groups); },
               [&](auto&& x) { return ctx.pmin_start(std::forward<decltype(x)>(x), axes, st.groups); });
        break;
      case Kind::pmean:
        reduce([&](auto&& x) { return ctx.pmean(std::forward<decltype(x)>(x), axes, st.groups); },
               [&](auto&& x) { return ctx.pmean_start(std::forward<decltype(x)>(x), axes, st.groups); });
        break;
      case Kind::all_gather:
        run([&](const T1<T>& x) -> Tensor<T, 2> { return ctx.all_gather(x, axes, 0, st.groups); },
            [&](const T1<T>& x) { return ctx.all_gather_start(x, axes, 0, st.groups); });
        break;
      case Kind::all_gather_tiled:
        run([&](const T1<T>& x) -> T1<T> { return ctx.all_gather(x, axes, 0, pmap::tiled, st.groups); },
            [&](const T1<T>& x) { return ctx.all_gather_start(x, axes, 0, pmap::tiled, st.groups); });
        break;
      case Kind::ppermute:
        run([&](const T1<T>& x) -> T1<T> { return ctx.ppermute(x, axes, st.perm); },
            [&](const T1<T>& x) { return ctx.ppermute_start(x, axes, st.perm); });
        break;
      case Kind::psum_scatter:
        run([&](const T1<T>& x) -> T1<T> { return ctx.psum_scatter(x, axes, 0, pmap::tiled, st.groups); },
            [&](const T1<T>& x) { return ctx.psum_scatter_start(x, axes, 0, pmap::tiled, st.groups); });
        break;
      case Kind::all_to_all:
        run([&](const T1<T>& x) -> T1<T> { return ctx.all_to_all(x, axes, 0, 0, pmap::tiled, st.groups); },
            [&](const T1<T>& x) { return ctx.all_to_all_start(x, axes, 0, 0, pmap::tiled, st.groups); });
        break;
      case Kind::ragged: {
        const std::vector<Index> sizes = ragged_sizes(len, st.group_size(p), p, s);
        run([&](const T1<T>& x) { return ctx.ragged_all_to_all(x, axes, sizes, st.groups); },
            [&](const T1<T>& x) { return ctx.ragged_all_to_all_start(x, axes, sizes, st.groups); });
        break;
      }
    }
  }
  out(0) = state.size();
  out(1) = sum_of(state.data(), state.size());
  return out;
}

// ---- the serial model ----------------------------------------------------------------------

/// The summaries every device should return from call `call` (device p receives call*100+p).
template <class T>
std::vector<std::vector<std::int64_t>> model(const Program& prog, int call) {
  const int n = prog.n;
  const auto un = static_cast<std::size_t>(n);
  std::vector<std::vector<std::int64_t>> out(un, std::vector<std::int64_t>(kSummary, 0));
  std::vector<std::vector<T>> state(un);
  for (int p = 0; p < n; ++p) state[static_cast<std::size_t>(p)] = initial_state<T>(call * 100 + p, p);

  for (std::size_t s = 0; s < prog.steps.size(); ++s) {
    const Step& st = prog.steps[s];
    std::vector<std::vector<std::int64_t>> op(un);
    for (int p = 0; p < n; ++p) {
      const auto up = static_cast<std::size_t>(p);
      std::vector<T> o(static_cast<std::size_t>(st.length(p)));
      fill_operand(state[up].data(), static_cast<Index>(state[up].size()), o.data(),
                   st.length(p), step_salt(static_cast<int>(s), call),
                   st.kind == Kind::pmean ? st.group_size(p) : 1);
      op[up].assign(o.begin(), o.end());
    }
    std::vector<std::vector<std::int64_t>> next(un);
    for (int p = 0; p < n; ++p) {
      const auto up = static_cast<std::size_t>(p);
      const std::vector<int> members = st.members(p);
      const auto g = static_cast<std::int64_t>(members.size());
      const auto pos = static_cast<std::int64_t>(st.position[up]);
      const auto len = static_cast<std::int64_t>(st.length(p));
      auto& r = next[up];
      auto of = [&](int m) -> const std::vector<std::int64_t>& { return op[static_cast<std::size_t>(m)]; };
      switch (st.kind) {
        case Kind::psum:
        case Kind::pmax:
        case Kind::pmin:
        case Kind::pmean:
          r = of(members[0]);
          for (std::size_t m = 1; m < members.size(); ++m)
            for (std::size_t k = 0; k < r.size(); ++k) {
              const std::int64_t v = of(members[m])[k];
              r[k] = st.kind == Kind::pmax ? std::max(r[k], v)
                     : st.kind == Kind::pmin ? std::min(r[k], v)
                                             : r[k] + v;
            }
          if (st.kind == Kind::pmean)
            for (auto& v : r) v /= g;  // exact: every operand is a multiple of g
          break;
        case Kind::all_gather:
        case Kind::all_gather_tiled:
          for (int m : members) r.insert(r.end(), of(m).begin(), of(m).end());
          break;
        case Kind::ppermute:
          r.assign(static_cast<std::size_t>(len), 0);
          if (st.source[up] >= 0) r = of(st.source[up]);
          break;
        case Kind::psum_scatter: {
          const std::int64_t block = len / g;
          r.assign(static_cast<std::size_t>(block), 0);
          for (int m : members)
            for (std::int64_t k = 0; k < block; ++k)
              r[static_cast<std::size_t>(k)] += of(m)[static_cast<std::size_t>(pos * block + k)];
          break;
        }
        case Kind::all_to_all: {
          const std::int64_t block = len / g;
          for (int m : members)
            r.insert(r.end(), of(m).begin() + pos * block, of(m).begin() + (pos + 1) * block);
          break;
        }
        case Kind::ragged:  // member m's chunk for this position, in member order
          for (int m : members) {
            const std::vector<Index> sizes = ragged_sizes(st.length(m), static_cast<int>(g), m, s);
            Index first = 0;
            for (std::int64_t j = 0; j < pos; ++j) first += sizes[static_cast<std::size_t>(j)];
            r.insert(r.end(), of(m).begin() + first,
                     of(m).begin() + first + sizes[static_cast<std::size_t>(pos)]);
          }
          break;
      }
    }
    for (int p = 0; p < n; ++p) {
      const auto up = static_cast<std::size_t>(p);
      state[up].assign(next[up].size(), T{});
      for (std::size_t k = 0; k < next[up].size(); ++k) state[up][k] = static_cast<T>(next[up][k]);
      out[up][2 + s] = checksum(state[up].data(), static_cast<Index>(state[up].size()));
    }
  }
  for (int p = 0; p < n; ++p) {
    const auto up = static_cast<std::size_t>(p);
    out[up][0] = static_cast<std::int64_t>(state[up].size());
    out[up][1] = sum_of(state[up].data(), static_cast<Index>(state[up].size()));
  }
  return out;
}

// ---- running programs ----------------------------------------------------------------------

/// What the programs of one TEST exercised (checked, so that the generator cannot silently
/// stop reaching a path).
struct Coverage {
  int programs = 0;
  int steps = 0;
  int staged = 0;         ///< whole-axis collectives of at most 8 KiB per device
  int in_place = 0;       ///< collectives read in place (not staged, not split)
  int split = 0;          ///< reductions of >= 64 KiB per device over 2+ members
  int mixed_groups = 0;   ///< reductions whose teams take different paths
  int threads_below_devices = 0;
  int nested = 0;         ///< nested pmap programs
  int nested_mesh = 0;    ///< shard_map nested in a pmap
  int sharded = 0;        ///< shard_map programs
  int two_axes = 0;       ///< steps of two-axis programs that name both axes
  int one_of_two = 0;     ///< steps of two-axis programs that name one axis
  int innermost = 0;      ///< steps that name {}
  int yields = 0;         ///< steps whose late device yields
  int disagreements = 0;  ///< programs with a departing device
  int unread = 0;         ///< of them, at a ppermute step
  int ragged = 0;         ///< ragged_all_to_all steps
  int started = 0;        ///< steps started and waited (SPEC 11)
  int twice = 0;          ///< of them, started twice, the later waited first
};

/// The path device p's group takes in step st (0 staged, 1 in place, 2 split).
int path_of(const Step& st, int p, int axis_size, bool integers) {
  const Index bytes = st.length(p) * 4;
  const Index acc = st.kind == Kind::pmean && integers ? 8 : 4;
  const int members = st.group_size(p);
  if (st.kind == Kind::ragged) return 1;  // always read in place
  if (members == axis_size && members > 1 && bytes <= 8 * 1024) return 0;
  if (is_reduction(st.kind) && members > 1 && st.length(p) * acc >= 64 * 1024) return 2;
  return 1;
}

void tally(Coverage& cov, const Program& prog) {
  ++cov.programs;
  if (prog.threads < prog.n) ++cov.threads_below_devices;
  cov.nested += prog.launch == Launch::nested;
  cov.nested_mesh += prog.launch == Launch::nested_mesh;
  cov.sharded += prog.launch == Launch::sharded;
  if (prog.deviation != Deviation::none) {
    ++cov.disagreements;
    cov.unread += prog.steps[static_cast<std::size_t>(prog.odd_step)].kind == Kind::ppermute;
  }
  for (const Step& st : prog.steps) {
    ++cov.steps;
    cov.ragged += st.kind == Kind::ragged;
    cov.started += st.start != Start::blocking;
    cov.twice += st.start == Start::twice;
    std::vector<int> seen(3, 0);
    for (int p = 0; p < prog.n; ++p)
      seen[static_cast<std::size_t>(path_of(st, p, prog.geo.size(st.over), prog.integers))] = 1;
    cov.staged += seen[0];
    cov.in_place += seen[1];
    cov.split += seen[2];
    if (is_reduction(st.kind) && st.teams.size() >= 2 && seen[0] + seen[1] + seen[2] >= 2)
      ++cov.mixed_groups;
    if (prog.launch != Launch::flat) {
      const bool both = st.over == Over::ij || st.over == Over::ji;
      cov.two_axes += both;
      cov.one_of_two += !both;
    }
    cov.innermost += st.innermost;
    cov.yields += st.delay == Delay::yield;
  }
}

/// Checksums a device records after each step (outside the pmap call, so that they survive a
/// DeviceError); kUnset where it did not get that far.
using Trace = std::vector<std::vector<std::int64_t>>;
constexpr std::int64_t kUnset = INT64_MIN;

/// The model's summaries: want[p][2 + s] is device p's checksum after step s.
using Want = std::vector<std::vector<std::int64_t>>;

/// The first step (and its devices) whose recorded checksum differs from the model; "" when
/// none. at(p, s) gives device p's checksum after step s, or kUnset.
template <class At>
std::string first_difference(const Program& prog, const Want& want, At at) {
  const int steps = static_cast<int>(prog.steps.size());
  for (int s = 0; s < steps; ++s) {
    std::string bad;
    for (int q = 0; q < prog.n; ++q) {
      const std::int64_t v = at(q, s);
      if (v != kUnset && v != want[static_cast<std::size_t>(q)][static_cast<std::size_t>(2 + s)])
        bad += (bad.empty() ? "" : ",") + std::to_string(q);
    }
    if (!bad.empty())
      return "the state after step " + std::to_string(s) + " (" +
             kind_name(prog.steps[static_cast<std::size_t>(s)].kind) +
             ") differs from the model on device(s) " + bad;
  }
  return "";
}

/// The returned summaries against the model's; "" when equal.
std::string compare(const Program& prog, const Want& want, const Tensor<std::int64_t, 2>& got) {
  if (got.dimension(0) != prog.n || got.dimension(1) != kSummary)
    return "result shape (" + std::to_string(got.dimension(0)) + ", " +
           std::to_string(got.dimension(1)) + ")";
  std::string diff = first_difference(prog, want, [&](int p, int s) { return got(p, 2 + s); });
  if (!diff.empty()) return diff;
  for (int p = 0; p < prog.n; ++p)
    for (int k = 0; k < 2; ++k)
      if (got(p, k) != want[static_cast<std::size_t>(p)][static_cast<std::size_t>(k)])
        return std::string(k == 0 ? "final size" : "final sum") + " on device " +
               std::to_string(p) + ": " + std::to_string(got(p, k)) + " != model " +
               std::to_string(want[static_cast<std::size_t>(p)][static_cast<std::size_t>(k)]);
  return "";
}

/// What a program did: an empty message when every call matched the model.
struct Outcome {
  std::string message;
  bool threw = false;  ///< a call threw
  bool wrong = false;  ///< some device's state differed from the model (before any throw)
};

/// The Runtime of n devices on `threads` threads, made once and shared by the programs of
/// that shape: later programs run on a runtime whose teams and caches earlier programs (and
/// their failures) left behind, as a long-running application's do.
pmap::Runtime& runtime_for(int n, int threads) {
  static std::map<std::pair<int, int>, std::unique_ptr<pmap::Runtime>> runtimes;
  auto& rt = runtimes[{n, threads}];
  if (!rt) rt = std::make_unique<pmap::Runtime>(pmap::RuntimeConfig{.num_devices = n, .num_threads = threads});
  return *rt;
}

/// Runs prog for prog.calls calls on one Mapped (of its launch), stopping at the first call
/// that fails. Flat device p receives call * 100 + p.
template <class T>
Outcome run_program(const Program& prog) {
  pmap::Runtime& rt = runtime_for(prog.n, prog.threads);
  const Geometry& geo = prog.geo;
  int call = 0;
  Trace trace;
  auto device = [&](pmap::Context& ctx, float value) {
    return run_device<T>(ctx, prog, static_cast<int>(value), call,
                         trace[static_cast<std::size_t>(flat_index(ctx, prog))]);
  };
  auto flat = pmap::pmap([&](pmap::Context& ctx, auto v) { return device(ctx, v(0)); }, on_axis(rt));
  auto nested = pmap::pmap(
      [&](pmap::Context&, auto xi) {
        auto inner = pmap::pmap([&](pmap::Context& ctx, auto v) { return device(ctx, v(0)); },
                                on_axis(rt, "j"));
        return inner(xi);
      },
      on_axis(rt, "i"));
  auto nested_mesh = pmap::pmap(
      [&](pmap::Context&, auto xi) {
        const pmap::Mesh inner_mesh({{"j", geo.b}}, &rt);
        auto inner = pmap::shard_map(
            [&](pmap::Context& ctx, auto block) {
              const Summary s = device(ctx, block(0, 0));
              Tensor<std::int64_t, 2> out(1, kSummary);
              for (Index k = 0; k < kSummary; ++k) out(0, k) = s(k);
              return out;
            },
            inner_mesh, {pmap::P("j")}, {pmap::P("j")});
        return inner(Tensor<float, 2>(xi));
      },
      on_axis(rt, "i"));
  const pmap::Mesh mesh({{"i", geo.a}, {"j", geo.b}}, &rt);
  auto sharded = pmap::shard_map(
      [&](pmap::Context& ctx, auto block) {
        const Summary s = device(ctx, block(0, 0, 0));
        Tensor<std::int64_t, 3> out(1, 1, kSummary);
        for (Index k = 0; k < kSummary; ++k) out(0, 0, k) = s(k);
        return out;
      },
      mesh, {pmap::P("i", "j")}, {pmap::P("i", "j")});
  auto run = [&]() -> Tensor<std::int64_t, 2> {
    if (prog.launch == Launch::flat) {
      Tensor<float, 2> x(prog.n, 1);
      for (int p = 0; p < prog.n; ++p) x(p, 0) = static_cast<float>(call * 100 + p);
      return flat(x);
    }
    Tensor<float, 3> x(geo.a, geo.b, 1);
    for (int p = 0; p < prog.n; ++p) x(p / geo.b, p % geo.b, 0) = static_cast<float>(call * 100 + p);
    const Tensor<std::int64_t, 3> r = prog.launch == Launch::nested        ? nested(x)
                                      : prog.launch == Launch::nested_mesh ? nested_mesh(x)
                                                                           : sharded(x);
    if (r.dimension(0) != geo.a || r.dimension(1) != geo.b || r.dimension(2) != kSummary)
      return Tensor<std::int64_t, 2>(r.dimension(0), r.dimension(1) * r.dimension(2));
    Tensor<std::int64_t, 2> got(prog.n, kSummary);
    for (int p = 0; p < prog.n; ++p)
      for (Index k = 0; k < kSummary; ++k) got(p, k) = r(p / geo.b, p % geo.b, k);
    return got;
  };
  if (prog.deviation != Deviation::none) {
    // A device departs from the program in the first call: E14, whoever reads it or not.
    trace.assign(static_cast<std::size_t>(prog.n), std::vector<std::int64_t>(prog.steps.size(), kUnset));
    try {
      (void)run();
    } catch (const pmap::DeviceError&) {
      return {};
    } catch (const std::exception& e) {
      return {std::string("expected pmap::DeviceError (E14), threw ") + typeid(e).name() + " \"" +
                  e.what() + "\"",
              true, false};
    }
    return {"a device departs from the program, but the call returned normally", false, true};
  }
  for (call = 0; call < prog.calls; ++call) {
    trace.assign(static_cast<std::size_t>(prog.n), std::vector<std::int64_t>(prog.steps.size(), kUnset));
    const Want want = model<T>(prog, call);
    const std::string where = "call " + std::to_string(call) + ": ";
    try {
      const Tensor<std::int64_t, 2> got = run();
      const std::string diff = compare(prog, want, got);
      if (!diff.empty()) return {where + diff, false, true};
    } catch (const std::exception& e) {
      const std::string diff = first_difference(prog, want, [&](int p, int s) {
        return trace[static_cast<std::size_t>(p)][static_cast<std::size_t>(s)];
      });
      return {where + "threw " + typeid(e).name() + " \"" + e.what() + "\"; before that, " +
                  (diff.empty() ? "every recorded state matched the model" : diff),
              true, !diff.empty()};
    }
  }
  return {};
}

/// Generates and runs `programs` programs from seeds base, base + 1, ...; reports up to three
/// failing programs of each kind in full and, unless soaking, checks that the programs covered
/// what cfg asks for.
void run_programs(std::uint64_t base, int programs, const GenConfig& cfg, bool check_coverage = true) {
  Watchdog watchdog("test_random", kHangLimit);
  Coverage cov;
  int wrong = 0;             // returned wrong values
  int wrong_then_threw = 0;  // wrong values, then an error
  int threw = 0;             // an error, every state before it right
  for (int k = 0; k < programs; ++k) {
    const std::uint64_t seed = base + static_cast<std::uint64_t>(k);
    const Program prog = generate(seed, cfg);
    tally(cov, prog);
    watchdog.arm(prog.describe());
    const Outcome out = prog.integers ? run_program<std::int32_t>(prog) : run_program<float>(prog);
    watchdog.disarm();
    if (out.message.empty()) continue;
    int& kind = out.threw ? (out.wrong ? wrong_then_threw : threw) : wrong;
    if (++kind <= 3) ADD_FAILURE() << out.message << "\n  " << prog.describe();
  }
  const int failed = wrong + wrong_then_threw + threw;
  EXPECT_EQ(failed, 0) << failed << " of " << programs << " programs failed: " << wrong
                       << " returned values other than the model's, " << wrong_then_threw
                       << " computed wrong values and then threw, " << threw
                       << " threw with every state before the error right";
  testing::Test::RecordProperty("programs", cov.programs);
  testing::Test::RecordProperty("steps", cov.steps);
  testing::Test::RecordProperty("mixed_grouped_steps", cov.mixed_groups);
  if (!check_coverage) return;
  // The generator reaches every path, and reductions whose teams take different ones.
  EXPECT_GT(cov.staged, 0);
  EXPECT_GT(cov.in_place, 0);
  // Rare paths are required only of runs long enough to meet them (sanitizer builds run
  // 10-100 programs per TEST): large operands in the bulk mix, 1 in 33 operands.
  const bool rare_paths = cfg.sizes[3] >= 0.1 || programs >= 200;
  if (cfg.sizes[3] > 0 && rare_paths) {
    EXPECT_GT(cov.split, 0);
  }
  // Shares are required only of runs long enough to show them (TSan runs 10 programs).
  const bool shares = programs >= 20;
  if (cfg.mixed >= 0.5 && shares) {
    EXPECT_GE(cov.mixed_groups, programs / 3);
  } else if (rare_paths || cfg.mixed >= 0.5) {
    EXPECT_GE(cov.mixed_groups, 1);
  }
  EXPECT_GT(cov.threads_below_devices, 0);
  EXPECT_GT(cov.started, 0);
  EXPECT_GT(cov.twice, 0);
  if (!cfg.grouped_focus) {
    EXPECT_GT(cov.ragged, 0);
  }
  if (cfg.nested > 0) {
    EXPECT_GT(cov.nested, 0);
    if (shares) {
      EXPECT_GT(cov.nested_mesh, 0);
    }
  }
  if (cfg.sharded > 0) {
    EXPECT_GT(cov.sharded, 0);
  }
  if (cfg.nested + cfg.sharded > 0) {
    EXPECT_GT(cov.two_axes, 0);
    EXPECT_GT(cov.one_of_two, 0);
  }
  EXPECT_GT(cov.innermost, 0);
  if (cfg.yields > 0) {
    EXPECT_GT(cov.yields, 0);
  }
  if (cfg.disagree >= 0.5) {
    EXPECT_GE(cov.disagreements, programs / 3);
    EXPECT_GT(cov.unread, 0);
  }
}

/// Programs per heavy TEST (operands up to 117 KiB, mostly grouped steps with one team split):
/// 180 in all (about 9 s on two idle cores); ASan runs about 4x slower, TSan about 15x
/// (measured: 5 s and 23 s for 80 and 40 programs on two busy cores).
constexpr int kPrograms = kThreadSanitizer ? 10 : kSanitized ? 20 : 45;

TEST(RandomPrograms, GroupedReductionsBetweenWholeAxisCollectives) {
  GenConfig cfg;
  cfg.min_n = 2;
  cfg.grouped_focus = true;
  run_programs(1000, kPrograms, cfg);
}

TEST(RandomPrograms, MixedCollectivesA) {
  run_programs(2000, kPrograms, GenConfig{});
}

/// Half of these programs are nested pmaps or shard_maps over two axes.
TEST(RandomPrograms, MixedCollectivesOverTwoAxes) {
  GenConfig cfg;
  cfg.nested = 0.25;
  cfg.sharded = 0.25;
  run_programs(3000, kPrograms, cfg);
}

/// In every program of two or more devices one device departs from the program at one step
/// (most often a ppermute's, which waits for its source alone): each raises E14.
TEST(RandomPrograms, DepartingDevicesRaiseE14) {
  // Not under TSan: the E14 text of a device that sees a peer's other collective reads the
  // peer's description while that peer may already publish its next one (Team::check_agreement;
  // the message may then be wrong, the error is not), which TSan rightly reports.
  if (kThreadSanitizer) GTEST_SKIP() << "E14 texts read a peer's description racily";
  GenConfig cfg;
  cfg.min_n = 2;
  cfg.nested = 0.25;
  cfg.sharded = 0.25;
  cfg.sizes = {0.45, 0.4, 0.12, 0.03};
  cfg.max_steps = 8;
  cfg.disagree = 1;
  run_programs(5000, 4 * kPrograms, cfg);
}

TEST(RandomPrograms, ManyDevicesFewThreads) {
  GenConfig cfg;
  cfg.min_n = 5;
  cfg.max_threads = 2;
  run_programs(4000, kPrograms, cfg);
}

/// The many-programs run: shorter programs of mostly small operands (the latency paths where
/// barriers and staging interleave most), a quarter each nested pmap and shard_map, late
/// devices that yield or sleep.
GenConfig bulk_config() {
  GenConfig cfg;
  cfg.nested = 0.25;
  cfg.sharded = 0.25;
  cfg.sizes = {0.45, 0.4, 0.12, 0.03};
  cfg.mixed = 0.15;
  cfg.max_steps = 8;
  cfg.yields = 0.5;
  cfg.disagree = kThreadSanitizer ? 0 : 0.1;  // see DepartingDevicesRaiseE14
  return cfg;
}

/// Programs per bulk TEST: 2,000 in all in a release build.
constexpr int kBulkPrograms = kThreadSanitizer ? 25 : kSanitized ? 100 : 500;

TEST(RandomPrograms, Bulk0) { run_programs(100000, kBulkPrograms, bulk_config()); }
TEST(RandomPrograms, Bulk1) { run_programs(200000, kBulkPrograms, bulk_config()); }
TEST(RandomPrograms, Bulk2) { run_programs(300000, kBulkPrograms, bulk_config()); }
TEST(RandomPrograms, Bulk3) { run_programs(400000, kBulkPrograms, bulk_config()); }

/// Soak mode: PMAP_SOAK_SECONDS=600 runs programs of every configuration above, from a seed
/// drawn at start (printed; PMAP_SOAK_SEED sets it), in batches until the time is up.
TEST(RandomPrograms, Soak) {
  const char* seconds = std::getenv("PMAP_SOAK_SECONDS");
  if (seconds == nullptr) GTEST_SKIP() << "set PMAP_SOAK_SECONDS to soak";
  const char* seed_env = std::getenv("PMAP_SOAK_SEED");
  std::uint64_t seed = seed_env ? std::strtoull(seed_env, nullptr, 10) : std::random_device{}();
  std::printf("soak: PMAP_SOAK_SEED=%llu for %s s\n", static_cast<unsigned long long>(seed), seconds);
  GenConfig grouped;
  grouped.min_n = 2;
  grouped.grouped_focus = true;
  GenConfig crowded;
  crowded.min_n = 5;
  crowded.max_threads = 2;
  GenConfig two_axes;
  two_axes.nested = 0.25;
  two_axes.sharded = 0.25;
  const GenConfig configs[] = {GenConfig{}, grouped, crowded, two_axes, bulk_config(), bulk_config()};
  const auto start = std::chrono::steady_clock::now();
  const auto end = start + std::chrono::seconds(std::atol(seconds));
  constexpr int kBatch = 50;
  long programs = 0;
  for (int b = 0; std::chrono::steady_clock::now() < end && !testing::Test::HasFailure(); ++b) {
    // A failure prints the seed of its program.
    run_programs(seed, kBatch, configs[b % std::size(configs)], /*check_coverage=*/false);
    seed += kBatch;
    programs += kBatch;
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("soak: %ld programs in %.0f s\n", programs, elapsed);
}

}  // namespace
