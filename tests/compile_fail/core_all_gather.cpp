// Must not compile: all_gather changes the rank, which an Eigen::Matrix cannot hold.
#include <pmap/pmap.hpp>

int main() {
  Eigen::Tensor<float, 2, Eigen::RowMajor> x(2, 3);
  auto f = pmap::pmap([](pmap::Context& ctx, const auto& v) {
    Eigen::VectorXf m = Eigen::Map<const Eigen::VectorXf>(v.data(), 3);
    return ctx.all_gather(m);
  });
  (void)f(x);
}
