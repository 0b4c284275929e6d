/// @file test_trace.cpp
/// @brief pmap::trace (trace.hpp): the Chrome trace JSON of known programs parses, its
/// slices nest on every track, each collective has one slice per member and one flow, the
/// device and thread tracks are named, suspensions and counters appear when devices outnumber
/// threads, a kernel exception leaves a complete trace, and tracing does not change results.

#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "collective_util.hpp"
#include "json_lite.hpp"

namespace {

using namespace coll_test;
using json_lite::Value;
using F1 = Tensor<float, 1>;
using F2 = Tensor<float, 2>;

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "pmap_trace_" +
         testing::UnitTest::GetInstance()->current_test_info()->name() + "_" + name + ".json";
}

const std::string& str(const Value& e, const char* key) { return e.at(key).string; }
double num(const Value& e, const char* key) { return e.at(key).number; }

/// A trace file, read and indexed.
struct Trace {
  Value root;
  std::vector<const Value*> events;
  std::map<int, std::string> thread_names;  ///< tid -> name

  std::vector<const Value*> with(const std::string& ph, const std::string& name = "") const {
    std::vector<const Value*> out;
    for (const Value* e : events)
      if (str(*e, "ph") == ph && (name.empty() || str(*e, "name") == name)) out.push_back(e);
    return out;
  }
  std::vector<const Value*> category(const std::string& cat) const {
    std::vector<const Value*> out;
    for (const Value* e : events)
      if (e->find("cat") && str(*e, "cat") == cat && str(*e, "ph") == "X") out.push_back(e);
    return out;
  }
};

Trace read_trace(const std::string& path) {
  Trace t;
  t.root = json_lite::parse_file(path);
  for (const Value& e : t.root.at("traceEvents").array) {
    t.events.push_back(&e);
    if (str(e, "ph") == "M" && str(e, "name") == "thread_name")
      t.thread_names[static_cast<int>(num(e, "tid"))] = e.at("args").at("name").string;
  }
  return t;
}

/// Runs body() while a trace records into a fresh file, and reads the file back.
template <class Body>
Trace traced(const std::string& name, Body&& body) {
  const std::string path = temp_path(name);
  std::remove(path.c_str());
  pmap::trace::start(path);
  EXPECT_TRUE(pmap::trace::active());
  try {
    body();
  } catch (...) {
    pmap::trace::stop();
    throw;
  }
  pmap::trace::stop();
  EXPECT_FALSE(pmap::trace::active());
  return read_trace(path);
}

/// What every trace must be: events with their fields, slices that nest properly on every
/// track (each slice inside the one before it or after its end), and flows whose members
/// number their collective's group (one start, one finish, group_size - 2 steps).
void expect_well_formed(const Trace& t, bool complete = true) {
  std::map<std::pair<int, int>, std::vector<const Value*>> tracks;
  for (const Value* e : t.events) {
    ASSERT_TRUE(e->find("ph") && e->find("pid") && e->find("tid") && e->find("name"));
    const std::string& ph = str(*e, "ph");
    ASSERT_TRUE(ph == "M" || ph == "X" || ph == "i" || ph == "C" || ph == "s" || ph == "t" || ph == "f" ||
                ph == "b" || ph == "e")
        << ph;
    if (ph == "X") {
      ASSERT_GE(num(*e, "dur"), 0.0);
      ASSERT_GE(num(*e, "ts"), 0.0);
      tracks[{static_cast<int>(num(*e, "pid")), static_cast<int>(num(*e, "tid"))}].push_back(e);
    }
  }
  for (auto& [track, slices] : tracks) {
    std::stable_sort(slices.begin(), slices.end(), [](const Value* a, const Value* b) {
      return num(*a, "ts") != num(*b, "ts") ? num(*a, "ts") < num(*b, "ts") : num(*a, "dur") > num(*b, "dur");
    });
    std::vector<double> open;  // end times of the enclosing slices
    for (const Value* e : slices) {
      const double begin = num(*e, "ts"), end = begin + num(*e, "dur");
      // Microseconds with three decimals: sums of them round (1e-3 is one nanosecond).
      while (!open.empty() && open.back() <= begin + 1e-4) open.pop_back();
      if (!open.empty()) {
        EXPECT_LE(end, open.back() + 1e-3) << "slice " << str(*e, "name") << " at " << begin
                                           << " overlaps its enclosing slice on track " << track.second;
      }
      open.push_back(end);
    }
  }
  // Flows: per id, the members of one collective.
  std::map<std::int64_t, std::vector<std::string>> flows;
  for (const Value* e : t.events) {
    const std::string& ph = str(*e, "ph");
    if (ph == "s" || ph == "t" || ph == "f") flows[static_cast<std::int64_t>(num(*e, "id"))].push_back(ph);
  }
  std::map<std::int64_t, int> group_of_flow;
  for (const Value* e : t.category("collective")) {
    const int g = static_cast<int>(num(e->at("args"), "group_size"));
    const auto id = static_cast<std::int64_t>(num(e->at("args"), "flow"));
    if (g >= 2) group_of_flow[id] = g;
  }
  for (const auto& [id, phs] : flows) {
    ASSERT_TRUE(group_of_flow.count(id)) << "a flow without a collective: " << id;
    // A failed call's collectives may end with fewer members (the others were cancelled).
    if (complete) {
      EXPECT_EQ(static_cast<int>(phs.size()), group_of_flow[id]) << "flow " << id;
    } else {
      EXPECT_LE(static_cast<int>(phs.size()), group_of_flow[id]) << "flow " << id;
    }
    EXPECT_EQ(std::count(phs.begin(), phs.end(), "s"), 1);
    EXPECT_EQ(std::count(phs.begin(), phs.end(), "f"), phs.size() >= 2 ? 1 : 0);
  }
  if (complete) {
    EXPECT_EQ(flows.size(), group_of_flow.size()) << "every collective of 2+ members has one flow";
  }
  // Async slices (started collectives): each id begins once and ends once, not before it began.
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> async;
  for (const Value* e : t.events) {
    const std::string& ph = str(*e, "ph");
    if (ph == "b") async[str(*e, "id")].first.push_back(num(*e, "ts"));
    if (ph == "e") async[str(*e, "id")].second.push_back(num(*e, "ts"));
  }
  for (const auto& [id, be] : async) {
    ASSERT_EQ(be.first.size(), 1u) << "async slice " << id;
    ASSERT_EQ(be.second.size(), 1u) << "async slice " << id;
    EXPECT_LE(be.first[0], be.second[0]) << "async slice " << id;
  }
}

/// The collective slices of one name, per device track.
std::map<int, int> per_track(const Trace& t, const std::string& name) {
  std::map<int, int> out;
  for (const Value* e : t.category("collective"))
    if (str(*e, "name") == name) ++out[static_cast<int>(num(*e, "tid"))];
  return out;
}

TEST(Trace, TwoDevicesPsumAndAllGather) {
  pmap::Runtime rt({.num_devices = 2, .num_threads = 2});
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        F1 s = ctx.psum(v, "i");
        F2 g = ctx.all_gather(s, "i");
        return pmap::eval(g * 2.f);
      },
      on_axis(rt));
  F2 x = make<F2>(1, 2, 16);
  const Trace t = traced("a", [&] {
    for (int k = 0; k < 3; ++k) f(x);
  });
  expect_well_formed(t);
  EXPECT_EQ(t.with("X", "pmap").size(), 3u);
  for (const Value* c : t.with("X", "pmap")) {
    EXPECT_EQ(num(c->at("args"), "devices"), 2);
    EXPECT_EQ(str(c->at("args"), "axes"), "i=2");
    EXPECT_EQ(str(c->at("args"), "arguments"), "float32[2,16]");
  }
  EXPECT_EQ(t.category("kernel").size(), 6u);
  EXPECT_EQ(per_track(t, "psum"), (std::map<int, int>{{1, 3}, {2, 3}}));
  EXPECT_EQ(per_track(t, "all_gather"), (std::map<int, int>{{1, 3}, {2, 3}}));
  EXPECT_EQ(t.thread_names.at(1), "i=0 (cpu:0)");
  EXPECT_EQ(t.thread_names.at(2), "i=1 (cpu:1)");
  for (const Value* e : t.category("collective")) {
    const Value& args = e->at("args");
    EXPECT_EQ(str(args, "axes"), "i");
    EXPECT_EQ(num(args, "group_size"), 2);
    EXPECT_EQ(num(args, "bytes"), 16 * 4 * (str(*e, "name") == "psum" ? 1 : 1));
    EXPECT_EQ(str(args, "path"), "staged");
  }
  EXPECT_EQ(t.with("s").size(), 6u);
  EXPECT_EQ(t.with("f").size(), 6u);
  // A thread track for every thread that called or ran a device.
  int threads = 0;
  for (const auto& [tid, name] : t.thread_names) threads += name.rfind("thread ", 0) == 0;
  EXPECT_GE(threads, 1);
  // Every kernel ran inside its call, and the calls ran on a thread track.
  for (const Value* c : t.with("X", "pmap")) EXPECT_GE(num(*c, "tid"), 100000);
}

TEST(Trace, EightDevicesOnTwoThreadsSuspendAndCount) {
  pmap::Runtime rt({.num_devices = 8, .num_threads = 2});
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        F1 a = ctx.psum(v, "i");
        F1 b = ctx.ppermute(a, "i", ring(8, 1));
        return ctx.pmax(b, "i");
      },
      on_axis(rt));
  F2 x = make<F2>(1, 8, 64);
  const Trace t = traced("a", [&] {
    for (int k = 0; k < 5; ++k) f(x);
  });
  expect_well_formed(t);
  EXPECT_EQ(t.category("kernel").size(), 40u);
  EXPECT_EQ(per_track(t, "ppermute").size(), 8u);
  const auto suspends = t.with("i", "suspend");
  const auto resumes = t.with("i", "resume");
  EXPECT_FALSE(suspends.empty()) << "8 devices on 2 threads suspend";
  EXPECT_EQ(suspends.size(), resumes.size());
  for (const Value* r : resumes) {
    const int thread = static_cast<int>(num(r->at("args"), "thread"));
    ASSERT_TRUE(t.thread_names.count(thread)) << "resumed on a named thread track";
  }
  EXPECT_FALSE(t.category("wait").empty());
  for (const Value* w : t.category("wait")) {
    const std::string& c = str(w->at("args"), "collective");
    EXPECT_TRUE(c == "psum" || c == "ppermute" || c == "pmax") << c;
  }
  // Counters: threads busy never above the threads that run devices, back to 0 at the end.
  double last_busy = -1, last_suspended = -1, max_busy = 0;
  for (const Value* c : t.with("C")) {
    if (str(*c, "name") == "threads busy") {
      last_busy = num(c->at("args"), "threads");
      max_busy = std::max(max_busy, last_busy);
      EXPECT_GE(last_busy, 0);
    } else if (str(*c, "name") == "devices suspended") {
      last_suspended = num(c->at("args"), "devices");
      EXPECT_GE(last_suspended, 0);
      EXPECT_LE(last_suspended, 8);
    }
  }
  EXPECT_EQ(last_busy, 0);
  EXPECT_EQ(last_suspended, 0);
  EXPECT_GE(max_busy, 1);
  // Two workers and the calling thread; sanitizer builds run each device on a thread.
  EXPECT_LE(max_busy, kSanitized ? 8 : 3);
  // The thread tracks show which device ran when: stretches of every device.
  std::set<int> ran;
  for (const Value* r : t.category("running")) ran.insert(static_cast<int>(num(r->at("args"), "device")));
  EXPECT_EQ(ran.size(), 8u);
}

TEST(Trace, StartedCollectivesAreSlicesFromStartToCompletionAndTheirWaitsAreCounted) {
  // SPEC 11: a started collective is a slice from its start to its completion (async: two
  // are in flight on one track), wait() a slice of its own; the summary counts the waits and
  // those that did not suspend (here the psum's and the ppermute's, which the blocking pmax
  // completed before them).
  pmap::Runtime rt({.num_devices = 4, .num_threads = 2});
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        auto a = ctx.psum_start(v, "i");
        auto b = ctx.ppermute_start(v, "i", ring(4, 1));
        const F1 top = ctx.pmax(v, "i");  // completes a and b first
        const F1 sum = a.wait();
        const F1 shifted = b.wait();
        auto c = ctx.all_gather_start(sum, "i");
        const F2 gathered = c.wait();
        F1 out = pmap::eval(top + sum + shifted + gathered.chip(0, 0));
        return out;
      },
      on_axis(rt));
  F2 x = make<F2>(1, 4, 16);
  const F2 untraced = f(x);
  setenv("PMAP_TRACE_SUMMARY", "1", 1);
  testing::internal::CaptureStderr();
  F2 result;
  const Trace t = traced("a", [&] {
    for (int k = 0; k < 5; ++k) result = f(x);
  });
  const std::string err = testing::internal::GetCapturedStderr();
  unsetenv("PMAP_TRACE_SUMMARY");
  expect_well_formed(t);
  EXPECT_TRUE(tensors_equal(result, untraced));
  std::map<std::string, int> begun;
  for (const Value* e : t.with("b")) ++begun[str(*e, "name")];
  EXPECT_EQ(begun["psum"], 20);
  EXPECT_EQ(begun["ppermute"], 20);
  EXPECT_EQ(begun["all_gather"], 20);
  EXPECT_EQ(t.with("e").size(), 60u);
  int waits = 0, done_before = 0;
  for (const Value* w : t.category("pending")) {
    ++waits;
    const std::string& c = str(w->at("args"), "collective");
    EXPECT_TRUE(c == "psum" || c == "ppermute" || c == "all_gather") << c;
    if (c != "all_gather") done_before += !w->at("args").at("suspended").boolean;
  }
  EXPECT_EQ(waits, 60);
  EXPECT_EQ(done_before, 40) << "a wait for a collective that completed earlier does not suspend";
  EXPECT_NE(err.find("started collectives: 60 waits, "), std::string::npos) << err;
}

/// Runs `kernel` (two collectives in flight, then their waits) 5 times on 2 devices and 1
/// thread, traced: its result is expected(x, d, k) and only device 0's first wait suspends.
template <class Kernel, class Expected>
void expect_one_suspension_per_call(Kernel kernel, Expected expected) {
  pmap::Runtime rt({.num_devices = 2, .num_threads = 1});
  auto f = pmap::pmap(kernel, on_axis(rt));
  F2 x = make<F2>(4, 2, 16);
  const F2 untraced = f(x);
  F2 result;
  const Trace t = traced("inflight", [&] {
    for (int k = 0; k < 5; ++k) result = f(x);
  });
  expect_well_formed(t);
  EXPECT_TRUE(tensors_equal(result, untraced));
  for (Index d = 0; d < 2; ++d)
    for (Index k = 0; k < 16; ++k) EXPECT_EQ(result(d, k), expected(x, d, k)) << d << " " << k;
  int waits = 0, suspended = 0;
  for (const Value* w : t.category("pending")) {
    ++waits;
    suspended += w->at("args").at("suspended").boolean ? 1 : 0;
  }
  EXPECT_EQ(waits, 20);
  std::set<int> suspending;  // the device tracks with suspensions
  for (const Value* e : t.with("i", "suspend")) suspending.insert(static_cast<int>(num(*e, "tid")));
  if (!PMAP_DEVICE_THREADS) {
    EXPECT_EQ(suspended, 5) << "one suspension per call, device 0's first wait";
    EXPECT_EQ(suspending.size(), 1u) << "device 1 never suspends: both collectives were posted";
  }
}

TEST(Trace, TwoPpermutesInFlightCostOneSuspension) {
  // SPEC 11's cost: two started ppermutes between the same devices cost one handoff. On one
  // thread device 0 runs first: it starts both, waits for the first and suspends (device 1
  // has not run yet); device 1 starts both, and its waits find both arrived, as do device 0's
  // second wait and its first once it resumes. Were a started collective run only when it is
  // waited for, device 1 would meet the second ppermute before device 0 did and suspend too.
  expect_one_suspension_per_call(
      [](pmap::Context& ctx, auto v) {
        const F1 x = pmap::eval(v);
        auto right = ctx.ppermute_start(x, "i", ring(2, 1));
        auto left = ctx.ppermute_start(pmap::eval(x * 2.f), "i", ring(2, -1));
        const F1 r = right.wait();
        const F1 l = left.wait();
        F1 out = pmap::eval(r + l);
        return out;
      },
      [](const F2& x, Index d, Index k) { return x(1 - d, k) + 2.f * x(1 - d, k); });
}

TEST(Trace, GroupCollectivesInFlightCostOneSuspension) {
  // As two ppermutes: a started psum and all_gather (staged, over the whole axis) are posted
  // when they start. On one thread device 0 starts both, waits for the psum and suspends;
  // device 1 starts both, which completes both barriers, and its waits find both done.
  // Were a started collective run only when it is waited for, device 1 would reach the
  // all_gather before device 0 and suspend there.
  expect_one_suspension_per_call(
      [](pmap::Context& ctx, auto v) {
        const F1 x = pmap::eval(v);
        auto sum = ctx.psum_start(x, "i");
        auto gathered = ctx.all_gather_start(pmap::eval(x * 2.f), "i");
        const F1 s = sum.wait();
        const F2 g = gathered.wait();
        F1 out = pmap::eval(s + g.chip(0, 0) + 3.f * g.chip(1, 0));
        return out;
      },
      [](const F2& x, Index, Index k) {
        return (x(0, k) + x(1, k)) + 2.f * x(0, k) + 3.f * (2.f * x(1, k));
      });
}

TEST(Trace, ReductionsOfCoreOperandsInFlightCostOneSuspension) {
  // The same for Eigen Core operands (SPEC 10): a Matrix read where it is, a Map evaluated.
  expect_one_suspension_per_call(
      [](pmap::Context& ctx, auto v) {
        const F1 x = pmap::eval(v);
        const Eigen::RowVectorXf m = Eigen::Map<const Eigen::RowVectorXf>(x.data(), x.size());
        auto sum = ctx.psum_start(m, "i");
        auto top = ctx.pmax_start(Eigen::Map<const Eigen::RowVectorXf>(x.data(), x.size()), "i");
        const Eigen::RowVectorXf s = sum.wait();
        const Eigen::RowVectorXf t = top.wait();
        F1 out(x.size());
        for (Index k = 0; k < x.size(); ++k) out(k) = s(k) + 3.f * t(k);
        return out;
      },
      [](const F2& x, Index, Index k) {
        return (x(0, k) + x(1, k)) + 3.f * std::max(x(0, k), x(1, k));
      });
}

TEST(Trace, CorePpermutesInFlightCostOneSuspension) {
  // The halos of Eigen Core operands (SPEC 10), a Matrix read where it is and a Map
  // evaluated, posted as a tensor's are.
  expect_one_suspension_per_call(
      [](pmap::Context& ctx, auto v) {
        const F1 x = pmap::eval(v);
        const Eigen::RowVectorXf m = Eigen::Map<const Eigen::RowVectorXf>(x.data(), x.size());
        auto right = ctx.ppermute_start(m, "i", ring(2, 1));
        auto left = ctx.ppermute_start(Eigen::Map<const Eigen::RowVectorXf>(x.data(), x.size()),
                                       "i", ring(2, -1));
        const Eigen::RowVectorXf r = right.wait();
        const Eigen::RowVectorXf l = left.wait();
        F1 out(x.size());
        for (Index k = 0; k < x.size(); ++k) out(k) = r(k) + 3.f * l(k);
        return out;
      },
      [](const F2& x, Index d, Index k) { return x(1 - d, k) + 3.f * x(1 - d, k); });
}

TEST(Trace, TreeCollectivesInFlightCostOneSuspension) {
  // The same for trees whose leaves pack into one staged copy: a pmean of a tuple (one leaf
  // donated) and an all_gather of an array of two leaves, both posted when they start.
  expect_one_suspension_per_call(
      [](pmap::Context& ctx, auto v) {
        const F1 x = pmap::eval(v);
        auto mean = ctx.pmean_start(std::make_tuple(x, F1(pmap::eval(x * 2.f))), "i");
        auto gathered = ctx.all_gather_start(std::array<F1, 2>{x, pmap::eval(x + 1.f)}, "i");
        const auto [m, m2] = mean.wait();
        const auto g = gathered.wait();
        F1 out = pmap::eval(m + m2 + g[0].chip(1, 0) + 3.f * g[1].chip(0, 0));
        return out;
      },
      [](const F2& x, Index, Index k) {
        const float mean = (x(0, k) + x(1, k)) / 2.f;
        return mean + (2.f * x(0, k) + 2.f * x(1, k)) / 2.f + x(1, k) + 3.f * (x(0, k) + 1.f);
      });
}

TEST(Trace, TreePpermutesInFlightCostOneSuspension) {
  // The halos of two fields, a tuple each way (one donated), posted as one tree each.
  expect_one_suspension_per_call(
      [](pmap::Context& ctx, auto v) {
        const F1 x = pmap::eval(v);
        const F1 y = pmap::eval(x * 2.f);
        auto right = ctx.ppermute_start(std::tie(x, y), "i", ring(2, 1));
        auto left = ctx.ppermute_start(std::make_tuple(F1(pmap::eval(x + 1.f)), y), "i",
                                       ring(2, -1));
        const auto [rx, ry] = right.wait();
        const auto [lx, ly] = left.wait();
        F1 out = pmap::eval(rx + ry + 3.f * lx + ly);
        return out;
      },
      [](const F2& x, Index d, Index k) {
        const float p = x(1 - d, k);
        return p + 2.f * p + 3.f * (p + 1.f) + 2.f * p;
      });
}

TEST(Trace, NestedCallsInsideTheOuterKernel) {
  pmap::Runtime rt({.num_devices = 8, .num_threads = 2});
  pmap::Runtime& runtime = rt;
  auto outer = pmap::pmap(
      [&runtime](pmap::Context&, auto xi) {
        auto inner = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, {"i", "j"}); },
                                on_axis(runtime, "j"));
        return inner(xi);
      },
      on_axis(rt, "i"));
  Tensor<float, 3> x = make<Tensor<float, 3>>(1, 2, 2, 4);
  const Trace t = traced("a", [&] { outer(x); });
  expect_well_formed(t);
  EXPECT_EQ(t.with("X", "pmap").size(), 3u) << "the outer call and two inner ones";
  // A track per device and nesting level: the outer devices 0 and 1 run while the inner
  // devices with their ids do.
  for (const auto& [tid, want] : std::map<int, std::string>{{1, "i=0 (cpu:0)"}, {2, "i=1 (cpu:1)"},
                                                             {10001, "i=0,j=0 (cpu:0)"}, {10002, "i=0,j=1 (cpu:1)"},
                                                             {10003, "i=1,j=0 (cpu:2)"}, {10004, "i=1,j=1 (cpu:3)"}})
    EXPECT_EQ(t.thread_names.at(tid), want);
  for (const Value* e : t.category("collective")) EXPECT_EQ(num(e->at("args"), "group_size"), 4);
  // The inner calls sit on the outer devices' tracks, inside their kernels.
  int nested = 0;
  for (const Value* c : t.with("X", "pmap")) nested += num(*c, "tid") < 100000;
  EXPECT_EQ(nested, 2);
}

TEST(Trace, ShardMapDevicesNamedByMeshCoordinates) {
  pmap::Runtime rt({.num_devices = 4, .num_threads = 2});
  const pmap::Mesh mesh({{"x", 2}, {"y", 2}}, &rt);
  auto f = pmap::shard_map([](pmap::Context& ctx, View<float, 2, RowMajor> b) { return ctx.psum(b, "y"); },
                           mesh, {pmap::P("x", "y")}, {pmap::P("x", "y")});
  F2 x = make<F2>(1, 4, 6);
  const Trace t = traced("a", [&] { f(x); });
  expect_well_formed(t);
  ASSERT_EQ(t.with("X", "shard_map").size(), 1u);
  EXPECT_EQ(str(t.with("X", "shard_map")[0]->at("args"), "axes"), "x=2,y=2");
  std::set<std::string> names;
  for (const auto& [tid, name] : t.thread_names) names.insert(name.substr(0, name.find(' ')));
  for (const char* want : {"x=0,y=0", "x=0,y=1", "x=1,y=0", "x=1,y=1"}) EXPECT_TRUE(names.count(want)) << want;
  EXPECT_EQ(t.with("s").size(), 2u) << "two groups over y: two flows";
}

TEST(Trace, KernelExceptionLeavesACompleteTrace) {
  pmap::Runtime rt({.num_devices = 4, .num_threads = 2});
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        F1 a = ctx.psum(v, "i");
        if (ctx.axis_index("i") == 1) throw std::out_of_range("boom");
        return ctx.psum(a, "i");
      },
      on_axis(rt));
  F2 x = make<F2>(1, 4, 8);
  const Trace t = traced("a", [&] { EXPECT_THROW(f(x), std::out_of_range); });
  expect_well_formed(t, /*complete=*/false);
  EXPECT_EQ(t.with("X", "pmap").size(), 1u);
  int failed = 0;
  for (const Value* k : t.category("kernel")) failed += k->at("args").at("failed").boolean;
  EXPECT_GE(failed, 1);
  EXPECT_EQ(t.category("kernel").size(), 4u);
  EXPECT_EQ(per_track(t, "psum").at(2), 1) << "device 1 threw after its first psum";
}

TEST(Trace, ResultsAreTheSameWithTracingOnAndOff) {
  pmap::Runtime rt({.num_devices = 8, .num_threads = 2});
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        F1 a = ctx.psum(v, "i", {{0, 3, 5}, {1, 2, 4, 6, 7}});
        auto g = ctx.all_gather(a, "i");                      // (8, 40)
        auto m = ctx.pmean(g, "i");
        auto r = ctx.psum_scatter(m, "i", 0, pmap::tiled);  // (1, 40)
        F1 p = ctx.ppermute(a, "i", ring(8, 3));
        return std::make_tuple(r, p);
      },
      on_axis(rt));
  F2 x = make<F2>(3, 8, 40);
  const auto [off_r, off_p] = f(x);
  Tensor<float, 3> on_r;
  F2 on_p;
  traced("a", [&] { std::tie(on_r, on_p) = f(x); });
  EXPECT_TRUE(tensors_equal(on_r, off_r));
  EXPECT_TRUE(tensors_equal(on_p, off_p));
  const auto [again_r, again_p] = f(x);
  EXPECT_TRUE(tensors_equal(again_r, off_r));
  EXPECT_TRUE(tensors_equal(again_p, off_p));
}

TEST(Trace, SummaryOnStderr) {
  pmap::Runtime rt({.num_devices = 2, .num_threads = 2});
  auto f = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); }, on_axis(rt));
  F2 x = make<F2>(1, 2, 8);
  setenv("PMAP_TRACE_SUMMARY", "1", 1);
  testing::internal::CaptureStderr();
  traced("a", [&] { f(x); });
  const std::string err = testing::internal::GetCapturedStderr();
  unsetenv("PMAP_TRACE_SUMMARY");
  EXPECT_NE(err.find("pmap trace summary: 2 kernel runs"), std::string::npos) << err;
  EXPECT_NE(err.find("waiting ms"), std::string::npos) << err;
  EXPECT_NE(err.find("psum"), std::string::npos) << err;
}

TEST(Trace, ProcessIndexInThePathAndRestart) {
  pmap::Runtime rt({.num_devices = 2, .num_threads = 1});
  auto f = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); }, on_axis(rt));
  F2 x = make<F2>(1, 2, 8);
  const std::string pattern = testing::TempDir() + "pmap_trace_process_{process}.json";
  const std::string first = testing::TempDir() + "pmap_trace_process_0.json";
  const std::string second = temp_path("second");
  std::remove(first.c_str());
  pmap::trace::start(pattern);
  f(x);
  pmap::trace::start(second);  // writes the first trace, starts another
  f(x);
  f(x);
  pmap::trace::stop();
  pmap::trace::stop();  // nothing runs: nothing happens
  EXPECT_EQ(read_trace(first).with("X", "pmap").size(), 1u);
  const Trace t = read_trace(second);
  EXPECT_EQ(t.with("X", "pmap").size(), 2u);
  for (const Value* e : t.events) EXPECT_EQ(num(*e, "pid"), 0);
}

TEST(Trace, UnwritablePathThrowsAtStop) {
  pmap::trace::start("/nonexistent-directory/trace.json");
  EXPECT_THROW(pmap::trace::stop(), std::runtime_error);
  EXPECT_FALSE(pmap::trace::active());
}

/// PMAP_TRACE in the environment: the first Runtime starts the trace, exit writes it. Runs in
/// a child process (the environment is read once per process).
TEST(TraceDeathTest, EnvironmentTraceIsWrittenAtExit) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = testing::TempDir() + "pmap_trace_environment.json";
  std::remove(path.c_str());
  EXPECT_EXIT(
      {
        setenv("PMAP_TRACE", path.c_str(), 1);
        pmap::Runtime rt({.num_devices = 2, .num_threads = 2});
        auto f = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); }, on_axis(rt));
        F2 x = make<F2>(1, 2, 8);
        f(x);
        std::exit(pmap::trace::active() ? 0 : 3);
      },
      testing::ExitedWithCode(0), "");
  const Trace t = read_trace(path);
  expect_well_formed(t);
  EXPECT_EQ(t.with("X", "pmap").size(), 1u);
}

}  // namespace
