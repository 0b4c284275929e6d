// Must not compile: the kernel returns an expression over a collective's result (SPEC 2.2).
#include <pmap/pmap.hpp>

int main() {
  Eigen::Tensor<float, 2, Eigen::RowMajor> x(2, 3);
  auto f = pmap::pmap([](pmap::Context& ctx, const auto& v) { return v + ctx.psum(v); });
  (void)f(x);
}
