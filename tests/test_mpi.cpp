// Multi-process pmap (SPEC 7), run under `mpirun -np 2` and `-np 3` by ctest. Every process
// runs every test; each compares its local part of a multi-process call with the same call
// on a single-process runtime over the global device count.
#include <gtest/gtest.h>

#include <pmap/distributed.hpp>
#include <pmap/pmap.hpp>

#include "mpi_test_main.hpp"

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using Vec = Eigen::Tensor<float, 1, Eigen::RowMajor>;
using Mat = Eigen::Tensor<float, 2, Eigen::RowMajor>;
constexpr int kLocal = 4;  // devices per process

pmap::Runtime* single = nullptr;  // created before MPI: one process, every device
pmap::Runtime* multi = nullptr;   // created after: kLocal devices on each process

int rank() { return multi->process_index(); }
int procs() { return multi->process_count(); }
int global_n() { return kLocal * procs(); }

Mat global_input(int cols) {
  Mat x(global_n(), cols);
  for (int i = 0; i < global_n(); ++i)
    for (int j = 0; j < cols; ++j) x(i, j) = static_cast<float>((i * 7 + j * 3) % 11) - 4.f;
  return x;
}

template <class T, int R>
Eigen::Tensor<T, R, Eigen::RowMajor> local_rows(const Eigen::Tensor<T, R, Eigen::RowMajor>& x) {
  Eigen::array<Eigen::Index, R> offsets{}, extents{};
  for (int d = 0; d < R; ++d) extents[d] = x.dimension(d);
  offsets[0] = rank() * kLocal;
  extents[0] = kLocal;
  return x.slice(offsets, extents);
}

template <class T, int R>
void expect_equal(const Eigen::Tensor<T, R, Eigen::RowMajor>& a,
                  const Eigen::Tensor<T, R, Eigen::RowMajor>& b) {
  ASSERT_EQ(a.dimensions(), b.dimensions());
  for (Eigen::Index k = 0; k < a.size(); ++k) EXPECT_NEAR(double(a.data()[k]), double(b.data()[k]), 1e-4) << k;
}

/// Runs `kernel` on every process's slice and on the single-process runtime over all rows.
template <class Kernel>
void compare(Kernel kernel, int cols = 6) {
  const Mat x = global_input(cols);
  auto on_multi = pmap::pmap(kernel, {.axis_name = "i", .runtime = multi});
  auto on_single = pmap::pmap(kernel, {.axis_name = "i", .runtime = single});
  const auto got = on_multi(local_rows(x));
  const auto want = on_single(x);
  expect_equal(got, local_rows(want));
}

TEST(Mpi, RuntimeSpansProcesses) {
  EXPECT_EQ(multi->device_count(), global_n());
  EXPECT_EQ(multi->local_device_count(), kLocal);
  ASSERT_EQ(static_cast<int>(multi->local_devices().size()), kLocal);
  EXPECT_EQ(multi->local_devices()[0].id, rank() * kLocal);
  EXPECT_EQ(multi->local_devices()[0].process_index, rank());
  EXPECT_EQ(multi->devices()[static_cast<std::size_t>(global_n() - 1)].process_index, procs() - 1);
  EXPECT_EQ(pmap::process_count(), procs());
}

TEST(Mpi, JaxDocumentedExample) {
  // JAX's multi-process example: x + psum(x) over every process's devices.
  Vec x(kLocal);
  for (int i = 0; i < kLocal; ++i) x(i) = static_cast<float>(rank() * kLocal + i);
  auto f = pmap::pmap([](pmap::Context& ctx, auto v) { return pmap::eval(v + ctx.psum(v, "i")); },
                      {.axis_name = "i", .runtime = multi});
  const Vec y = f(x);
  const float total = static_cast<float>(global_n() * (global_n() - 1) / 2);
  for (int i = 0; i < kLocal; ++i) EXPECT_EQ(y(i), total + x(i));
  if (procs() == 2) {
    EXPECT_EQ(y(0), rank() == 0 ? 28.f : 32.f);
    EXPECT_EQ(y(3), rank() == 0 ? 31.f : 35.f);
  }
}

TEST(Mpi, AxisIndexAndDevices) {
  compare([](pmap::Context& ctx, auto v) {
    return pmap::eval(v * 0.f + static_cast<float>(ctx.axis_index("i") * 100 + ctx.device().id));
  });
}

TEST(Mpi, Reductions) {
  compare([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); });
  compare([](pmap::Context& ctx, auto v) { return ctx.pmean(v, "i"); });
  compare([](pmap::Context& ctx, auto v) { return ctx.pmax(v, "i"); });
  compare([](pmap::Context& ctx, auto v) { return ctx.pmin(v, "i"); });
  compare([](pmap::Context& ctx, auto v) { return pmap::eval(ctx.pargmax(v, "i").template cast<float>()); });
  compare([](pmap::Context& ctx, auto v) { return pmap::eval(ctx.pargmin(v, "i").template cast<float>()); });
  compare([](pmap::Context& ctx, auto v) { return pmap::eval(v * 0.f + ctx.psum(1.f, "i")); });
}

TEST(Mpi, ReductionsWithGroups) {
  compare([](pmap::Context& ctx, auto v) {
    pmap::Groups evens_odds(2);
    for (int i = 0; i < ctx.axis_size("i"); ++i) evens_odds[static_cast<std::size_t>(i % 2)].push_back(i);
    return pmap::eval(ctx.psum(v, "i", evens_odds) + ctx.pmean(v, "i", evens_odds));
  });
}

TEST(Mpi, DataMovement) {
  compare([](pmap::Context& ctx, auto v) {
    auto g = ctx.all_gather(v, "i");
    return pmap::eval(g.sum(Eigen::array<int, 1>{0}) + g.chip(1, 0));
  });
  compare([](pmap::Context& ctx, auto v) { return ctx.all_gather(v, "i", 0, pmap::tiled); });
  compare([](pmap::Context& ctx, auto v) { return ctx.psum_scatter(v, "i", 0, pmap::tiled); },
          global_n() * 2);
  compare([](pmap::Context& ctx, auto v) { return ctx.all_to_all(v, "i", 0, 0, pmap::tiled); },
          global_n() * 3);
  compare([](pmap::Context& ctx, auto v) {
    std::vector<std::pair<int, int>> ring;
    const int n = ctx.axis_size("i");
    for (int i = 0; i < n; ++i) ring.emplace_back(i, (i + 1) % n);
    return ctx.ppermute(v, "i", ring);
  });
  compare([](pmap::Context& ctx, auto v) {
    std::vector<int> reversed;
    for (int i = ctx.axis_size("i") - 1; i >= 0; --i) reversed.push_back(i);
    return ctx.pshuffle(v, "i", reversed);
  });
  compare([](pmap::Context& ctx, auto v) { return ctx.pbroadcast(v, "i", ctx.axis_size("i") - 1); });
}

TEST(Mpi, AxisSizeIsGlobal) {
  Vec x(kLocal);
  x.setZero();
  auto ok = pmap::pmap([](auto v) { return v; }, {.axis_size = global_n(), .runtime = multi});
  EXPECT_NO_THROW(ok(x));
  auto bad = pmap::pmap([](auto v) { return v; }, {.axis_size = kLocal, .runtime = multi});
  try {
    bad(x);
    ADD_FAILURE() << "no error";
  } catch (const pmap::ValueError& e) {
    EXPECT_EQ(std::string(e.what()), "Specified axis_size " + std::to_string(kLocal) +
                                         " doesn't match global axis_size " +
                                         std::to_string(global_n()) + ".");
  }
}

TEST(Mpi, ProcessesThatDisagreeAllGetTheSameError) {
  auto f = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); },
                      {.axis_name = "i", .runtime = multi});
  Vec x(rank() == 1 ? kLocal - 1 : kLocal);  // process 1 passes a different local size
  x.setZero();
  try {
    f(x);
    ADD_FAILURE() << "no error";
  } catch (const pmap::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("different arguments on different processes"),
              std::string::npos)
        << e.what();
  }
  // A validation error on one process only reaches every process, with that process's text.
  Eigen::Tensor<float, 0, Eigen::RowMajor> scalar;
  scalar() = 1.f;
  auto g = pmap::pmap([](auto v) { return v; }, {.runtime = multi});
  try {
    if (rank() == 1) {
      g(scalar);
    } else {
      Vec v(kLocal);
      v.setZero();
      g(v);
    }
    ADD_FAILURE() << "no error";
  } catch (const pmap::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("requested to map its argument along axis 0"),
              std::string::npos)
        << e.what();
  }
  Vec y(kLocal);
  y.setConstant(1.f);
  EXPECT_EQ(f(y)(0), static_cast<float>(global_n()));  // the runtime serves the next call
}

TEST(Mpi, KernelThatThrowsOnOneProcessFailsEverywhere) {
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        if (ctx.device().id == kLocal + 1) throw std::out_of_range("boom on device 5");
        return ctx.psum(v, "i");  // the others wait here for the device that threw
      },
      {.axis_name = "i", .runtime = multi});
  Vec x(kLocal);
  x.setConstant(1.f);
  try {
    f(x);
    ADD_FAILURE() << "no error";
  } catch (const std::out_of_range& e) {
    EXPECT_EQ(rank(), 1);
    EXPECT_STREQ(e.what(), "boom on device 5");
  } catch (const pmap::DeviceError& e) {
    EXPECT_NE(rank(), 1);
    EXPECT_EQ(e.device_id(), kLocal + 1);
    EXPECT_NE(std::string(e.what()).find("process 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("boom on device 5"), std::string::npos) << e.what();
  }
  auto g = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); },
                      {.axis_name = "i", .runtime = multi});
  EXPECT_EQ(g(x)(0), static_cast<float>(global_n()));
}

/// Kernel-exception injection across processes: a program of five collectives (small and
/// large psum, all_gather, ppermute, grouped pmax) in which device `thrower` throws at point
/// `point` (0-4: before collective k; 5: after the last), for every device of every process
/// and every point. The thrower's process gets the kernel's exception unchanged, every other
/// process a DeviceError naming the device and its process; no process waits; the next call
/// on the same Mapped is right.
TEST(Mpi, KernelExceptionAtEveryPointOfEveryDevice) {
  int thrower = -1, point = -1;
  const int n = global_n();
  std::vector<std::pair<int, int>> ring;
  pmap::Groups parity(2);
  for (int d = 0; d < n; ++d) {
    ring.emplace_back(d, (d + 1) % n);
    parity[static_cast<std::size_t>(d % 2)].push_back(d);
  }
  auto kernel = [&](pmap::Context& ctx, auto v) {
    const int d = ctx.axis_index("i");
    auto at = [&](int j) {
      if (d == thrower && j == point)
        throw std::out_of_range("boom at point " + std::to_string(j) + " on device " + std::to_string(d));
    };
    at(0);
    Vec a = ctx.psum(v, "i");
    at(1);
    auto g = ctx.all_gather(a, "i");
    at(2);
    Vec p = ctx.ppermute(a, "i", ring);
    at(3);
    Vec big(20000);  // 80 KB: the split path of a reduction
    big.setConstant(static_cast<float>(d));
    Vec s = ctx.psum(std::move(big), "i");
    at(4);
    Vec m = ctx.pmax(p, "i", parity);
    at(5);
    m(0) += s(19999) + g(n - 1, 0);
    return m;
  };
  const Mat x = global_input(6);
  auto on_multi = pmap::pmap(kernel, {.axis_name = "i", .runtime = multi});
  const Mat want = local_rows(pmap::pmap(kernel, {.axis_name = "i", .runtime = single})(x));
  int injected = 0;
  for (thrower = 0; thrower < n; ++thrower)
    for (point = 0; point <= 5; ++point) {
      const std::string where = "device " + std::to_string(thrower) + " point " + std::to_string(point);
      const int owner = thrower / kLocal;
      try {
        on_multi(local_rows(x));
        ADD_FAILURE() << where << ": no error";
      } catch (const std::out_of_range& e) {
        EXPECT_EQ(rank(), owner) << where;
        EXPECT_EQ(std::string(e.what()), "boom at point " + std::to_string(point) + " on device " +
                                             std::to_string(thrower));
      } catch (const pmap::DeviceError& e) {
        EXPECT_NE(rank(), owner) << where << ": " << e.what();
        EXPECT_EQ(e.device_id(), thrower) << where;
        EXPECT_NE(std::string(e.what()).find("process " + std::to_string(owner)), std::string::npos)
            << where << ": " << e.what();
      }
      ++injected;
      const int saved = thrower;
      thrower = -1;
      expect_equal(on_multi(local_rows(x)), want);
      thrower = saved;
    }
  EXPECT_EQ(injected, 6 * n);
  testing::Test::RecordProperty("injected", injected);
}

TEST(Mpi, ProcessesCallingDifferentCollectivesFail) {
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        if (ctx.device().process_index == 0) return ctx.psum(v, "i");
        return ctx.pmax(v, "i");
      },
      {.axis_name = "i", .runtime = multi});
  Vec x(kLocal);
  x.setConstant(1.f);
  EXPECT_THROW(f(x), pmap::DeviceError);
  auto skip = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        if (ctx.device().process_index == 0) return pmap::eval(v * 1.f);
        return ctx.psum(v, "i");  // process 0 never joins
      },
      {.axis_name = "i", .runtime = multi});
  EXPECT_THROW(skip(x), pmap::DeviceError);
  auto g = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); },
                      {.axis_name = "i", .runtime = multi});
  EXPECT_EQ(g(x)(0), static_cast<float>(global_n()));
}

// Devices that disagree on a point-to-point collective where no peer reads them (issue 26's
// cases; each process runs kLocal of the global devices): E14 on every process. The odd
// device is on the last process, or on process 0, or is a device of each process.
TEST(Mpi, DevicesThatDisagreeWhereNobodyReadsThemFail) {
  using Pairs = std::vector<std::pair<int, int>>;
  const int n = global_n();
  const auto shape = [](pmap::Context& ctx, auto) {
    Vec w(ctx.axis_index() == 1 ? 5 : 3);
    w.setConstant(1.f);
    return static_cast<float>(ctx.ppermute(w, "i", {}).size());
  };
  const auto kind = [n](pmap::Context& ctx, auto) {
    Vec w(3);
    w.setConstant(1.f);
    if (ctx.axis_index() == 0) return static_cast<float>(ctx.pbroadcast(w, "i", 0).size());
    std::vector<int> perm(static_cast<std::size_t>(n));
    for (int d = 1; d < n; ++d) perm[static_cast<std::size_t>(d)] = d + 1 < n ? d + 1 : 1;
    return static_cast<float>(ctx.pshuffle(w, "i", perm).size());
  };
  const auto parameters = [n](pmap::Context& ctx, auto) {
    Vec w(3);
    w.setConstant(1.f);
    const Pairs pairs = ctx.axis_index() == n - 1 ? Pairs{} : Pairs{{0, n / 2}, {n - 1, n - 1}};
    return static_cast<float>(ctx.ppermute(w, "i", pairs).size());
  };
  Vec x(kLocal);
  x.setConstant(1.f);
  auto f1 = pmap::pmap(shape, {.axis_name = "i", .runtime = multi});
  auto f2 = pmap::pmap(kind, {.axis_name = "i", .runtime = multi});
  auto f3 = pmap::pmap(parameters, {.axis_name = "i", .runtime = multi});
  for (int run = 0; run < 3; ++run) {
    EXPECT_THROW(f1(x), pmap::DeviceError) << "shape, run " << run;
    EXPECT_THROW(f2(x), pmap::DeviceError) << "kind, run " << run;
    EXPECT_THROW(f3(x), pmap::DeviceError) << "parameters, run " << run;
  }
  auto g = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); },
                      {.axis_name = "i", .runtime = multi});
  EXPECT_EQ(g(x)(0), static_cast<float>(global_n()));
}

// Above mpi::kFramePayloadBytes (64 KiB) per process the data leaves the frame of the header
// round for an MPI_Allgather or MPI_Allreduce after it.
TEST(Mpi, CollectivesLargerThanAFrame) {
  constexpr int cols = 20000;  // 80 KB per device, 320 KB per process
  compare([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); }, cols);
  compare([](pmap::Context& ctx, auto v) { return ctx.pmax(v, "i"); }, cols);
  compare([](pmap::Context& ctx, auto v) { return ctx.pmean(v, "i"); }, cols);
  compare([](pmap::Context& ctx, auto v) { return pmap::eval(ctx.all_gather(v, "i").chip(1, 0)); },
          cols);
  compare([](pmap::Context& ctx, auto v) { return ctx.pbroadcast(v, "i", ctx.axis_size("i") - 1); },
          cols);
}

// Every process combines the processes' contributions in rank order: the same bits everywhere,
// even where a float sum depends on its order.
TEST(Mpi, ReductionsGiveTheSameBitsOnEveryProcess) {
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto v) {
        const float scale = ctx.axis_index("i") % 2 == 0 ? 1e8f : 1e-3f;
        Vec mine = pmap::eval(v * scale + static_cast<float>(ctx.axis_index("i")) * 0.37f);
        Vec total = ctx.psum(mine, "i");
        return ctx.all_gather(total, "i");  // every device's (and so process's) result
      },
      {.axis_name = "i", .runtime = multi});
  for (const int cols : {7, 20000}) {
    Mat x(kLocal, cols);
    x.setConstant(1.3f);
    const Eigen::Tensor<float, 3, Eigen::RowMajor> all = f(x);
    for (int d = 0; d < kLocal; ++d)
      for (int k = 0; k < global_n(); ++k)
        for (int j = 0; j < cols; j += 97)
          ASSERT_EQ(all(d, k, j), all(0, 0, j)) << cols << " " << d << " " << k << " " << j;
  }
}

// One device per process: the device's input is the process's contribution, not a copy.
TEST(Mpi, OneDevicePerProcess) {
  pmap::Runtime one({.num_devices = 1, .num_threads = 1});
  ASSERT_EQ(one.device_count(), procs());
  for (const int cols : {5, 20000}) {
    Mat x(1, cols);
    for (int j = 0; j < cols; ++j)
      x(0, j) = static_cast<float>(rank() + 1) * static_cast<float>(j % 13);
    const Mat before = x;
    auto sum = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); },
                          {.axis_name = "i", .runtime = &one});
    auto mean = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.pmean(v, "i"); },
                           {.axis_name = "i", .runtime = &one});
    auto max = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.pmax(v, "i"); },
                          {.axis_name = "i", .runtime = &one});
    const Mat s = sum(x), m = mean(x), top = max(x);
    const float weights = static_cast<float>(procs() * (procs() + 1) / 2);
    for (int j = 0; j < cols; j += 31) {
      const float base = static_cast<float>(j % 13);
      ASSERT_EQ(s(0, j), weights * base) << j;
      ASSERT_FLOAT_EQ(m(0, j), weights * base / static_cast<float>(procs())) << j;
      ASSERT_EQ(top(0, j), static_cast<float>(procs()) * base) << j;
      ASSERT_EQ(x(0, j), before(0, j)) << j;
    }
  }
}

/// ragged_all_to_all (SPEC 12) across processes: device i sends (i * 3 + j * 5 + seed) % 4
/// rows of its own values to member j; what each device received, as a row of fixed length
/// (rows, a weighted sum of the data, the sizes and offsets in a code), matches one process.
template <int L>
Vec ragged_summary(pmap::Context& ctx, int cols, int seed, const pmap::Groups& groups) {
  const int i = ctx.axis_index("i");
  int n = ctx.axis_size("i");
  for (const auto& grp : groups)
    if (std::find(grp.begin(), grp.end(), i) != grp.end()) n = static_cast<int>(grp.size());
  std::vector<Eigen::Index> sizes;
  Eigen::Index rows = 0;
  for (int j = 0; j < n; ++j) rows += sizes.emplace_back((i * 3 + j * 5 + seed) % 4);
  Eigen::Tensor<float, 2, L> x(rows, cols);
  for (Eigen::Index r = 0; r < rows; ++r)
    for (Eigen::Index c = 0; c < cols; ++c) x(r, c) = static_cast<float>(100 * i + 10 * r + c);
  const auto got = ctx.ragged_all_to_all(x, "i", sizes, groups);
  Vec row(4);
  row.setZero();
  row(0) = static_cast<float>(got.data.dimension(0));
  for (Eigen::Index r = 0; r < got.data.dimension(0); ++r)
    for (Eigen::Index c = 0; c < cols; ++c) row(1) += got.data(r, c) * static_cast<float>(r + 1);
  for (std::size_t k = 0; k < got.sizes.size(); ++k) {
    row(2) = row(2) * 5.f + static_cast<float>(got.sizes[k]);
    row(3) += static_cast<float>(got.offsets[k]) * static_cast<float>(k + 1);
  }
  return row;
}

TEST(Mpi, RaggedAllToAll) {
  for (int seed = 0; seed < 3; ++seed) {
    compare([seed](pmap::Context& ctx, auto) { return ragged_summary<Eigen::RowMajor>(ctx, 3, seed, {}); });
    compare([seed](pmap::Context& ctx, auto) { return ragged_summary<Eigen::ColMajor>(ctx, 2, seed, {}); });
  }
  compare([](pmap::Context& ctx, auto) {
    pmap::Groups evens_odds(2);
    for (int i = 0; i < ctx.axis_size("i"); ++i) evens_odds[static_cast<std::size_t>(i % 2)].push_back(i);
    return ragged_summary<Eigen::RowMajor>(ctx, 2, 1, evens_odds);
  });
  // Rows of another length on one process: E14 on every process, then the next call works.
  auto f = pmap::pmap(
      [](pmap::Context& ctx, auto) {
        const int n = ctx.axis_size("i");
        Mat x(n, ctx.device().process_index == procs() - 1 ? 3 : 2);
        x.setZero();
        return static_cast<float>(ctx.ragged_all_to_all(x, "i", std::vector<Eigen::Index>(n, 1)).data.size());
      },
      {.axis_name = "i", .runtime = multi});
  EXPECT_THROW(f(Mat(kLocal, 3).setConstant(1.f)), pmap::DeviceError);
  compare([](pmap::Context& ctx, auto) { return ragged_summary<Eigen::RowMajor>(ctx, 3, 2, {}); });
}

// A frame of another size (another shape, above or below the frame limit) fails the
// collective on every process, and the next call works.
TEST(Mpi, ProcessesCallingACollectiveOnDifferentShapesFail) {
  for (const int other : {9, 20000}) {
    auto f = pmap::pmap(
        [other](pmap::Context& ctx, auto v) {
          if (ctx.device().process_index == 0) return ctx.psum(v, "i");
          Vec longer(other);
          longer.setConstant(1.f);
          return pmap::eval(
              ctx.psum(longer, "i")
                  .slice(Eigen::array<Eigen::Index, 1>{0}, Eigen::array<Eigen::Index, 1>{3}));
        },
        {.axis_name = "i", .runtime = multi});
    Vec x(kLocal);
    x.setConstant(1.f);
    EXPECT_THROW(f(Mat(kLocal, 3).setConstant(1.f)), pmap::DeviceError) << other;
    auto g = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); },
                        {.axis_name = "i", .runtime = multi});
    EXPECT_EQ(g(x)(0), static_cast<float>(global_n()));
  }
}

/// A trace of a multi-process call: one file per process ({process} in the path), each
/// with its own process index as pid and its own devices' tracks.
TEST(Mpi, TraceWritesOneFilePerProcess) {
  const std::string pattern = "/tmp/pmap_mpi_trace_np" + std::to_string(procs()) + "_{process}.json";
  auto path_of = [&](int p) {
    return "/tmp/pmap_mpi_trace_np" + std::to_string(procs()) + "_" + std::to_string(p) + ".json";
  };
  std::remove(path_of(rank()).c_str());
  auto f = pmap::pmap([](pmap::Context& ctx, auto v) { return ctx.psum(v, "i"); },
                      {.axis_name = "i", .runtime = multi});
  Vec x(kLocal);
  x.setConstant(1.f);
  pmap::trace::start(pattern);
  EXPECT_EQ(f(x)(0), static_cast<float>(global_n()));
  pmap::trace::stop();
  EXPECT_EQ(f(x)(0), static_cast<float>(global_n()));  // every process has written its file
  for (int p = 0; p < procs(); ++p) {
    std::FILE* file = std::fopen(path_of(p).c_str(), "rb");
    ASSERT_NE(file, nullptr) << path_of(p);
    std::string text;
    char buffer[4096];
    for (std::size_t got; (got = std::fread(buffer, 1, sizeof buffer, file)) > 0;) text.append(buffer, got);
    std::fclose(file);
    EXPECT_NE(text.find("\"pid\":" + std::to_string(p) + ","), std::string::npos) << path_of(p);
    EXPECT_EQ(text.find("\"pid\":" + std::to_string((p + 1) % procs()) + ","), std::string::npos) << path_of(p);
    EXPECT_NE(text.find("pmap process " + std::to_string(p)), std::string::npos);
    // This process's devices only: global ids p * kLocal ...
    const int first = p * kLocal;
    EXPECT_NE(text.find("(cpu:" + std::to_string(first) + ")"), std::string::npos) << path_of(p);
    EXPECT_NE(text.find("\"name\":\"psum\""), std::string::npos);
    EXPECT_NE(text.find("\"path\":\"gathered\""), std::string::npos);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return pmap_test::run_mpi_suite(argc, argv, 16, kLocal, single, multi);
}
