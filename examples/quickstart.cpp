// The README's tour as a program: normalise rows with a psum, then a triad into a reused
// result.
#include <cstdio>

#include <pmap/pmap.hpp>

int main() {
  // 8 logical devices on 2 worker threads: devices may outnumber threads.
  pmap::Runtime rt({.num_devices = 8, .num_threads = 2});

  auto normalize = pmap::pmap(
      [](pmap::Context& ctx, auto x, float scale) {
        return pmap::eval(scale * x / ctx.psum(x, "i"));  // collectives over axis "i"
      },
      pmap::in_axes(0, pmap::none), {.axis_name = "i", .runtime = &rt});

  Eigen::Tensor<float, 2, Eigen::RowMajor> xs(8, 1024);  // RowMajor: slices are contiguous
  xs.setRandom();
  Eigen::Tensor<float, 2, Eigen::RowMajor> ys = normalize(xs, 2.f);

  // Column sums of ys over the devices are `scale` everywhere.
  Eigen::Tensor<float, 1, Eigen::RowMajor> column = ys.sum(Eigen::array<int, 1>{0});
  std::printf("sum over devices of column 0: %.3f (expected 2)\n", column(0));

  auto triad = pmap::pmap([](auto a, auto b) { return a + 0.5f * b; }, {.runtime = &rt});
  triad.into(ys, xs, xs);
  std::printf("triad(3, 7) = %.3f, expected %.3f\n", ys(3, 7), 1.5f * xs(3, 7));
  return 0;
}
