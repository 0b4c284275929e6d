// Must not compile: the kernel takes pmap::Context by value (it is neither copyable nor movable).
#include <pmap/pmap.hpp>

int main() {
  Eigen::Tensor<float, 2, Eigen::RowMajor> x(2, 3);
  auto f = pmap::pmap([](pmap::Context ctx, const auto& v) { return ctx.psum(v); });
  (void)f(x);
}
