// Must not compile: the kernel returns an Eigen Core expression over a local matrix.
#include <pmap/pmap.hpp>

int main() {
  Eigen::Tensor<float, 2, Eigen::RowMajor> x(2, 3);
  auto f = pmap::pmap([](const auto& v) {
    Eigen::VectorXf m = Eigen::Map<const Eigen::VectorXf>(v.data(), 3);
    return m * 2.f;
  });
  (void)f(x);
}
