// shard_map across processes (SPEC 13), run under `mpirun -np 2` and `-np 3` by ctest. Every
// process passes its process block of a global tensor; each compares what it gets with its
// block of the same call on a single-process runtime over the global device count.
#include <gtest/gtest.h>

#include <pmap/distributed.hpp>
#include <pmap/pmap.hpp>

#include "mpi_test_main.hpp"

#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace {

using Vec = Eigen::Tensor<float, 1, Eigen::RowMajor>;
using Mat = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using pmap::P;
constexpr int kLocal = 2;  // devices per process

pmap::Runtime* single = nullptr;  // created before MPI: one process, every device
pmap::Runtime* multi = nullptr;   // created after: kLocal devices on each process

int rank() { return multi->process_index(); }
int procs() { return multi->process_count(); }

/// SPEC 9's block b of k along a dimension of size s: {start, extent}.
std::pair<Eigen::Index, Eigen::Index> block(Eigen::Index s, Eigen::Index k, Eigen::Index b) {
  const Eigen::Index q = s / k, r = s % k;
  return {b * q + std::min(b, r), q + (b < r ? 1 : 0)};
}

Mat global_input(Eigen::Index rows, Eigen::Index cols) {
  Mat x(rows, cols);
  for (Eigen::Index i = 0; i < rows; ++i)
    for (Eigen::Index j = 0; j < cols; ++j) x(i, j) = static_cast<float>((i * 7 + j * 3) % 11) - 4.f;
  return x;
}

/// Rows [first block, last block] of k blocks of x.
Mat rows_of(const Mat& x, Eigen::Index k, Eigen::Index first, Eigen::Index last) {
  const auto lo = block(x.dimension(0), k, first), hi = block(x.dimension(0), k, last);
  const Eigen::array<Eigen::Index, 2> offsets{lo.first, 0};
  const Eigen::array<Eigen::Index, 2> extents{hi.first + hi.second - lo.first, x.dimension(1)};
  return x.slice(offsets, extents);
}

/// The rows of x that this process's devices hold when they are split over all devices.
Mat my_rows(const Mat& x) { return rows_of(x, procs() * kLocal, rank() * kLocal, rank() * kLocal + kLocal - 1); }

template <class T, int R>
void expect_equal(const Eigen::Tensor<T, R, Eigen::RowMajor>& a,
                  const Eigen::Tensor<T, R, Eigen::RowMajor>& b) {
  ASSERT_EQ(a.dimensions(), b.dimensions());
  for (Eigen::Index k = 0; k < a.size(); ++k) EXPECT_NEAR(double(a.data()[k]), double(b.data()[k]), 1e-3) << k;
}

std::vector<std::pair<std::string, int>> proc_x() { return {{"proc", procs()}, {"x", kLocal}}; }

/// Raises e's ValueError text on every process, or fails.
template <class Fn>
std::string value_error_of(Fn&& fn) {
  try {
    fn();
  } catch (const pmap::ValueError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ValueError";
  return {};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// Collectives over "x", "proc" and both, in both orders; outputs split over the processes,
/// over the local axis only, and replicated everywhere.
auto collectives_kernel() {
  return [](pmap::Context& ctx, auto x) {
    const Vec colsum = x.sum(Eigen::array<int, 1>{0});
    auto over_x = ctx.psum(colsum, "x");
    auto over_proc = ctx.psum(colsum, "proc");
    auto over_both = ctx.psum(colsum, {"proc", "x"});
    auto gathered = ctx.all_gather(colsum, {"x", "proc"});
    const float where = static_cast<float>(ctx.axis_index({"proc", "x"}));
    Mat y = (x * 2.f + where).eval();
    return std::make_tuple(std::move(y), std::move(over_x), std::move(over_proc), std::move(over_both),
                           std::move(gathered));
  };
}

TEST(MpiShardMap, ProcessBlocksOfAnUnevenGlobalBatch) {
  // 1001 rows over 2 or 3 processes of 2 devices: blocks of 501/500 or 167/166 rows.
  const Mat x = global_input(1001, 5);
  const std::vector<pmap::PartitionSpec> out{P(std::vector<std::string>{"proc", "x"}), P("proc"),
                                             P("x"), P(), P()};
  auto on_multi = pmap::shard_map(collectives_kernel(), pmap::Mesh(proc_x(), multi),
                                  {P(std::vector<std::string>{"proc", "x"})}, out);
  auto on_single = pmap::shard_map(collectives_kernel(), pmap::Mesh(proc_x(), single),
                                   {P(std::vector<std::string>{"proc", "x"})}, out);
  const auto [y, over_x, over_proc, over_both, gathered] = on_multi(my_rows(x));
  const auto [y1, over_x1, over_proc1, over_both1, gathered1] = on_single(x);
  expect_equal(y, my_rows(y1));
  // over_x differs between processes: each gets its own block of P("proc").
  const Eigen::array<Eigen::Index, 1> offset{rank() * 5}, extent{5};
  expect_equal(over_x, Vec(over_x1.slice(offset, extent)));
  expect_equal(over_proc, over_proc1);  // split over "x" only: every process holds it whole
  expect_equal(over_both, over_both1);
  expect_equal(gathered, gathered1);
  EXPECT_EQ(gathered.dimension(0), procs() * kLocal);
}

TEST(MpiShardMap, RowsOverProcessesColumnsOverTheLocalAxis) {
  const Mat x = global_input(7 * procs() + 1, 6);
  auto kernel = [](pmap::Context& ctx, auto b) {
    return pmap::eval(b + static_cast<float>(ctx.axis_index("x") * 100 + ctx.axis_index("proc")));
  };
  auto on_multi = pmap::shard_map(kernel, pmap::Mesh(proc_x(), multi), {P("proc", "x")}, {P("proc", "x")});
  auto on_single = pmap::shard_map(kernel, pmap::Mesh(proc_x(), single), {P("proc", "x")}, {P("proc", "x")});
  const Mat mine = rows_of(x, procs(), rank(), rank());
  expect_equal(on_multi(mine), rows_of(on_single(x), procs(), rank(), rank()));
  // into(): the target has the process block's shape.
  Mat target(mine.dimension(0), mine.dimension(1));
  on_multi.into(target, mine);
  expect_equal(target, rows_of(on_single(x), procs(), rank(), rank()));
  // A wrong target on one process fails the call on every process, and writes nothing.
  Mat wrong(rank() == 1 ? mine.dimension(0) + 1 : mine.dimension(0), mine.dimension(1));
  wrong.setConstant(-7.f);
  const std::string text = value_error_of([&] { on_multi.into(wrong, mine); });
  EXPECT_TRUE(contains(text, "into: output 0 must have shape")) << text;
  if (rank() == 1) {
    for (Eigen::Index k = 0; k < wrong.size(); ++k) ASSERT_EQ(wrong.data()[k], -7.f);
  }
  expect_equal(on_multi(mine), rows_of(on_single(x), procs(), rank(), rank()));
}

TEST(MpiShardMap, MeshWithTheLocalAxisFirst) {
  // {x: 2, proc: P}: process p holds mesh positions 2p and 2p + 1. With 2 processes each
  // holds x = p, both proc; with 3 the devices of a process are no block of the mesh.
  pmap::Mesh mesh({{"x", kLocal}, {"proc", procs()}}, multi);
  auto kernel = [](pmap::Context& ctx, auto b) { return pmap::eval(b * 1.f + ctx.psum(1.f, "x")); };
  const Mat x = global_input(9, 3);
  const auto x_major = P(std::vector<std::string>{"x", "proc"});
  auto f = pmap::shard_map(kernel, mesh, {x_major}, {x_major});
  if (procs() == 2) {
    auto g = pmap::shard_map(kernel, pmap::Mesh({{"x", kLocal}, {"proc", procs()}}, single), {x_major}, {x_major});
    expect_equal(f(my_rows(x)), my_rows(g(x)));
    // ("proc", "x") puts a process's two blocks 2 apart: no process block.
    const auto proc_major = P(std::vector<std::string>{"proc", "x"});
    auto h = pmap::shard_map(kernel, mesh, {proc_major}, {x_major});
    const std::string text = value_error_of([&] { h(my_rows(x)); });
    EXPECT_TRUE(contains(text, "in_specs[0] splits dimension 0 of args[0] over mesh axes ('proc', 'x')")) << text;
    EXPECT_TRUE(contains(text, "not contiguous")) << text;
  } else {
    const std::string text = value_error_of([&] { f(my_rows(x)); });
    EXPECT_TRUE(contains(text, "do not form a block of the mesh")) << text;
  }
}

TEST(MpiShardMap, ProcessBlockIsWhatEachProcessPasses) {
  const pmap::Mesh mesh(proc_x(), multi);
  const auto both = P(std::vector<std::string>{"proc", "x"});
  const Mat x = global_input(1001, 5);
  expect_equal(pmap::process_block(x, mesh, both), my_rows(x));  // uneven: 501/500 or 334/334/333
  const Mat small = global_input(7 * procs() + 1, 6);
  expect_equal(pmap::process_block(small, mesh, P("proc", "x")), rows_of(small, procs(), rank(), rank()));
  expect_equal(pmap::process_block(small, mesh, P(pmap::none, "x")), small);  // no process-spanning axis
  const Vec v = Vec(small.chip(0, 1));
  expect_equal(pmap::process_block(v, mesh, P()), v);
  // What it returns is what a call over the same mesh and spec accepts.
  auto f = pmap::shard_map([](auto b) { return pmap::eval(b * 2.f); }, mesh, {both}, {both});
  auto g = pmap::shard_map([](auto b) { return pmap::eval(b * 2.f); }, pmap::Mesh(proc_x(), single), {both}, {both});
  expect_equal(f(pmap::process_block(x, mesh, both)), pmap::process_block(g(x), mesh, both));
  // The call's errors, before anything is copied.
  const std::string text = value_error_of([&] { pmap::process_block(x, mesh, P(std::vector<std::string>{"x", "proc"})); });
  EXPECT_TRUE(contains(text, "process_block: spec splits dimension 0 of the tensor over mesh axes ('x', 'proc')")) << text;
  const std::string rank3 = value_error_of([&] { pmap::process_block(x, mesh, P("proc", pmap::none, "x")); });
  EXPECT_TRUE(contains(rank3, "process_block spec[0] has 3 entries, but the tensor has rank 2")) << rank3;
  const std::string local = value_error_of([&] {
    pmap::process_block(x, pmap::Mesh({{"x", kLocal}}, multi), P("x"));
  });
  EXPECT_TRUE(contains(local, "needs a Mesh of all")) << local;
  EXPECT_THROW(pmap::process_block(x, mesh, P("y")), pmap::NameError);
}

TEST(MpiShardMap, NonContiguousSpecFailsOnEveryProcess) {
  auto f = pmap::shard_map([](auto b) { return pmap::eval(b * 2.f); }, pmap::Mesh(proc_x(), multi),
                           {P(std::vector<std::string>{"x", "proc"})}, {P(std::vector<std::string>{"proc", "x"})});
  const std::string text = value_error_of([&] { f(my_rows(global_input(12, 2))); });
  EXPECT_TRUE(contains(text, "in_specs[0] splits dimension 0 of args[0] over mesh axes ('x', 'proc')")) << text;
  auto g = pmap::shard_map([](auto b) { return pmap::eval(b * 2.f); }, pmap::Mesh(proc_x(), multi),
                           {P(std::vector<std::string>{"proc", "x"})}, {P(std::vector<std::string>{"x", "proc"})});
  const std::string out = value_error_of([&] { g(my_rows(global_input(12, 2))); });
  EXPECT_TRUE(contains(out, "out_specs[0] splits dimension 0 of output 0")) << out;
}

TEST(MpiShardMap, ProcessBlockOfTheWrongSizeFailsOnEveryProcess) {
  auto f = pmap::shard_map([](auto b) { return pmap::eval(b * 2.f); }, pmap::Mesh(proc_x(), multi),
                           {P(std::vector<std::string>{"proc", "x"})}, {P(std::vector<std::string>{"proc", "x"})});
  const Mat x = global_input(1001, 2);
  Mat mine = my_rows(x);
  if (rank() == 1) mine = Mat(mine.slice(Eigen::array<Eigen::Index, 2>{0, 0},
                                          Eigen::array<Eigen::Index, 2>{mine.dimension(0) - 3, 2}));
  const std::string text = value_error_of([&] { f(mine); });
  EXPECT_TRUE(contains(text, "passed args[0] with size")) << text;
  EXPECT_TRUE(contains(text, "was expected")) << text;
  // Another width on one process: the dimension nothing splits must agree.
  Mat wide = rank() == 1 ? global_input(my_rows(x).dimension(0), 3) : my_rows(x);
  const std::string width = value_error_of([&] { f(wide); });
  EXPECT_TRUE(contains(width, "process 1 passed args[0] with size 3 along dimension 1, but process 0 passed size 2")) << width;
  expect_equal(f(my_rows(x)), Mat(my_rows(x) * 2.f));  // the next call is right
}

TEST(MpiShardMap, ReplicatedArgumentsMustAgree) {
  auto kernel = [](auto b, auto w, float s) {
    float total = 0.f;
    for (Eigen::Index k = 0; k < w.size(); ++k) total += w(k);
    return pmap::eval(b * s + total);
  };
  const auto rows = P(std::vector<std::string>{"proc", "x"});
  auto f = pmap::shard_map(kernel, pmap::Mesh(proc_x(), multi), {rows, P(), P()}, {rows});
  const Mat x = global_input(10, 4);
  Vec w(3);
  w.setValues({1.f, 2.f, 3.f});
  const Mat want = (my_rows(x) * 2.f + 6.f).eval();
  expect_equal(f(my_rows(x), w, 2.f), want);
  Vec w_other = w;
  if (rank() == 1) w_other(2) = 4.f;
  const std::string text = value_error_of([&] { f(my_rows(x), w_other, 2.f); });
  EXPECT_TRUE(contains(text, "args[1] differs between processes 0 and 1")) << text;
  const std::string scalar = value_error_of([&] { f(my_rows(x), w, rank() == 1 ? 3.f : 2.f); });
  EXPECT_TRUE(contains(scalar, "args[2] differs between processes 0 and 1")) << scalar;
  // Unchecked, each process computes with its own.
  auto g = pmap::shard_map(kernel, pmap::Mesh(proc_x(), multi), {rows, P(), P()}, {rows},
                           {.check_replicated = false});
  EXPECT_NO_THROW(g(my_rows(x), w_other, 2.f));
}

TEST(MpiShardMap, ReplicatedOutputsAreCheckedAcrossProcesses) {
  auto f = pmap::shard_map(
      [](pmap::Context& ctx, auto b) {
        return std::make_tuple(pmap::eval(b * 1.f), static_cast<float>(ctx.axis_index("proc")));
      },
      pmap::Mesh(proc_x(), multi), {P(std::vector<std::string>{"proc", "x"})},
      {P(std::vector<std::string>{"proc", "x"}), P()});
  const Mat x = my_rows(global_input(8, 2));
  const std::string text = value_error_of([&] { f(x); });
  EXPECT_TRUE(contains(text, "out_specs[1] does not name mesh axis 'proc', so output 1 must be equal "
                             "along it, but device 2 differs from device 0"))
      << text;
  auto g = pmap::shard_map(
      [](pmap::Context& ctx, auto b) {
        return std::make_tuple(pmap::eval(b * 1.f), static_cast<float>(ctx.axis_index("proc")));
      },
      pmap::Mesh(proc_x(), multi), {P(std::vector<std::string>{"proc", "x"})},
      {P(std::vector<std::string>{"proc", "x"}), P()}, {.check_replicated = false});
  EXPECT_EQ(std::get<1>(g(x))(), static_cast<float>(rank()));  // unchecked: its own value
}

TEST(MpiShardMap, KernelThatThrowsOnOneProcessFailsEverywhere) {
  auto kernel = [](pmap::Context& ctx, auto b) {
    if (ctx.axis_index({"proc", "x"}) == kLocal + 1) throw std::out_of_range("boom at position 3");
    return ctx.psum(b, "proc");
  };
  auto f = pmap::shard_map(kernel, pmap::Mesh(proc_x(), multi), {P()}, {P("x")});
  Vec v(4);
  v.setConstant(1.f);
  try {
    f(v);
    ADD_FAILURE() << "no error";
  } catch (const std::out_of_range& e) {
    EXPECT_EQ(rank(), 1);
    EXPECT_STREQ(e.what(), "boom at position 3");
  } catch (const pmap::DeviceError& e) {
    EXPECT_NE(rank(), 1);
    EXPECT_TRUE(contains(e.what(), "boom at position 3")) << e.what();
  }
  auto g = pmap::shard_map([](pmap::Context& ctx, auto b) { return ctx.psum(b, "proc"); },
                           pmap::Mesh(proc_x(), multi), {P()}, {P("x")});
  const Vec got = g(v);
  ASSERT_EQ(got.dimension(0), 8);
  for (Eigen::Index k = 0; k < got.size(); ++k) EXPECT_EQ(got(k), static_cast<float>(procs()));
}

TEST(MpiShardMap, NestedShardMapIsAValueErrorOnEveryProcess) {
  auto f = pmap::shard_map(
      [](auto b) {
        auto inner = pmap::shard_map([](auto c) { return pmap::eval(c * 1.f); },
                                     pmap::Mesh({{"y", 1}}, multi), {P()}, {P()});
        return inner(b);
      },
      pmap::Mesh(proc_x(), multi), {P()}, {P()});
  Vec v(4);
  v.setZero();
  const std::string text = value_error_of([&] { f(v); });
  EXPECT_TRUE(contains(text, "shard_map: a shard_map nested inside a call across processes is "
                             "not supported")) << text;
  // The processes are still in step: the next call runs.
  auto g = pmap::shard_map([](pmap::Context& ctx, auto b) { return ctx.psum(b, "proc"); },
                           pmap::Mesh(proc_x(), multi), {P()}, {P("x")});
  v.setConstant(1.f);
  const Vec got = g(v);
  ASSERT_EQ(got.dimension(0), 8);
  EXPECT_EQ(got(0), static_cast<float>(procs()));
}

TEST(MpiShardMap, MeshMustSpanEveryProcess) {
  auto f = pmap::shard_map([](auto b) { return pmap::eval(b * 1.f); }, pmap::Mesh({{"x", kLocal}}, multi),
                           {P("x")}, {P("x")});
  Vec v(4);
  v.setZero();
  const std::string text = value_error_of([&] { f(v); });
  EXPECT_TRUE(contains(text, "needs a Mesh of all " + std::to_string(procs() * kLocal) + " devices")) << text;
}

}  // namespace

int main(int argc, char** argv) {
  return pmap_test::run_mpi_suite(argc, argv, 8, kLocal, single, multi);
}
