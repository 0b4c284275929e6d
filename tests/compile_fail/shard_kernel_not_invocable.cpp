// Must not compile: a shard_map kernel that takes a rank-1 view of a rank-2 block.
#include <pmap/pmap.hpp>

int main() {
  Eigen::Tensor<float, 2, Eigen::RowMajor> x(4, 3);
  pmap::Mesh mesh({{"x", 1}});
  auto f = pmap::shard_map(
      [](Eigen::TensorMap<const Eigen::Tensor<float, 1, Eigen::RowMajor>> v) { return pmap::eval(v * 2.f); },
      mesh, {pmap::P("x")}, {pmap::P("x")});
  (void)f(x);
}
