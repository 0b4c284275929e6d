// Must not compile: the kernel returns a collective in flight (SPEC 11).
#include <pmap/pmap.hpp>

int main() {
  Eigen::Tensor<float, 2, Eigen::RowMajor> x(2, 3);
  auto f = pmap::pmap([](pmap::Context& ctx, const auto& v) { return ctx.psum_start(v); });
  (void)f(x);
}
