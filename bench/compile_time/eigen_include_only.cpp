// Eigen Tensor's header and nothing else (scripts/compile_time.sh).
#include <unsupported/Eigen/CXX11/Tensor>

int main() { return 0; }
