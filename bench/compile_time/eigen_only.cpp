// The quickstart's work (examples/quickstart.cpp) written with Eigen alone, serially: the
// same Tensor expressions per row. scripts/compile_time.sh compiles both; the difference is
// what a program pays for pmap at compile time.
#include <cstdio>

#include <unsupported/Eigen/CXX11/Tensor>

int main() {
  using Rows = Eigen::Tensor<float, 2, Eigen::RowMajor>;
  using Row = Eigen::Tensor<float, 1, Eigen::RowMajor>;
  Rows xs(8, 1024);
  xs.setRandom();
  const Row total = xs.sum(Eigen::array<int, 1>{0});  // what the psum over the rows gives
  Rows ys(8, 1024);
  for (int i = 0; i < 8; ++i) {
    const Eigen::TensorMap<const Row> x(&xs(i, 0), 1024);
    Eigen::TensorMap<Row> y(&ys(i, 0), 1024);
    y = 2.f * x / total;
  }
  Row column = ys.sum(Eigen::array<int, 1>{0});
  std::printf("sum over rows of column 0: %.3f (expected 2)\n", column(0));
  for (int i = 0; i < 8; ++i) {
    const Eigen::TensorMap<const Row> a(&xs(i, 0), 1024);
    Eigen::TensorMap<Row> y(&ys(i, 0), 1024);
    y = a + 0.5f * a;
  }
  std::printf("triad(3, 7) = %.3f, expected %.3f\n", ys(3, 7), 1.5f * xs(3, 7));
  return 0;
}
