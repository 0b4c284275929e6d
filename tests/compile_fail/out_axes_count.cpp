// Must not compile: out_axes has three entries for a kernel with two outputs.
#include <pmap/pmap.hpp>

int main() {
  Eigen::Tensor<float, 2, Eigen::RowMajor> x(2, 3);
  auto f = pmap::pmap([](const auto& v) { return std::make_tuple(v, v); },
                      pmap::out_axes(0, 0, pmap::none));
  (void)f(x);
}
