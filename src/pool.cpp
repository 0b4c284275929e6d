#include "pmap/detail/pool.hpp"

#include <memory>

namespace pmap::detail {

Pool::Pool(int threads)
    : threads_(threads),
      parallelism_(threads > static_cast<int>(tbb::global_control::active_value(
                                 tbb::global_control::max_allowed_parallelism))
                       ? std::make_unique<tbb::global_control>(
                             tbb::global_control::max_allowed_parallelism,
                             static_cast<std::size_t>(threads))
                       : nullptr),
      arena_(threads, 1) {
  arena_.initialize();
}

}  // namespace pmap::detail
