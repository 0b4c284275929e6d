// Runs a small pmap through the installed package; returns non-zero on any mismatch.
#include <cstdio>

#include <pmap/pmap.hpp>

int main() {
  pmap::Runtime runtime(pmap::RuntimeConfig{.num_devices = 4, .num_threads = 2});
  pmap::Options options;
  options.runtime = &runtime;

  Eigen::Tensor<float, 2, Eigen::RowMajor> xs(4, 3);
  for (Eigen::Index i = 0; i < xs.dimension(0); ++i) {
    for (Eigen::Index j = 0; j < xs.dimension(1); ++j) {
      xs(i, j) = static_cast<float>(3 * i + j);
    }
  }

  int failures = 0;
  auto expect = [&failures](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "package test: %s\n", what);
      ++failures;
    }
  };

  auto twice = pmap::pmap([](auto x) { return pmap::eval(x * 2.f); }, options);
  Eigen::Tensor<float, 2, Eigen::RowMajor> doubled = twice(xs);
  expect(doubled.dimension(0) == 4 && doubled.dimension(1) == 3, "pmap result shape");
  for (Eigen::Index i = 0; i < 4; ++i) {
    for (Eigen::Index j = 0; j < 3; ++j) {
      expect(doubled(i, j) == 2.f * xs(i, j), "pmap result value");
    }
  }

  // A collective goes through the compiled runtime, not just the headers.
  auto column_sums = pmap::pmap([](pmap::Context& ctx, auto x) { return ctx.psum(x); }, options);
  Eigen::Tensor<float, 2, Eigen::RowMajor> sums = column_sums(xs);
  for (Eigen::Index i = 0; i < 4; ++i) {
    for (Eigen::Index j = 0; j < 3; ++j) {
      expect(sums(i, j) == static_cast<float>(18 + 4 * j), "psum result value");
    }
  }

  // shard_map: 7 rows on 3 devices (blocks of 3, 2, 2), compiled Mesh code included.
  pmap::Mesh mesh({{"rows", 3}}, &runtime);
  auto scaled = pmap::shard_map([](auto x) { return pmap::eval(x * 3.f); }, mesh, {pmap::P("rows")},
                                {pmap::P("rows")});
  Eigen::Tensor<float, 2, Eigen::RowMajor> seven(7, 2);
  seven.setConstant(1.f);
  Eigen::Tensor<float, 2, Eigen::RowMajor> tripled = scaled(seven);
  expect(tripled.dimension(0) == 7 && tripled(6, 1) == 3.f, "shard_map result");
  expect(pmap::distributed::is_initialized() == false, "distributed from the umbrella header");

  expect(runtime.device_count() == 4, "Runtime::device_count");
  if (failures == 0) std::puts("package test: ok");
  return failures == 0 ? 0 : 1;
}
