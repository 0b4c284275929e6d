// Must not compile: the kernel takes a float, but receives TensorMap views of slices.
#include <pmap/pmap.hpp>

int main() {
  Eigen::Tensor<float, 2, Eigen::RowMajor> x(2, 3);
  auto f = pmap::pmap([](float wrong) { return wrong; });
  (void)f(x);
}
