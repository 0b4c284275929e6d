// Box copies of the common scalars, compiled once here (pmap/detail/layout.hpp declares them
// extern).
#include "pmap/detail/layout.hpp"

#include <cstdint>

namespace pmap::detail {

template void copy_box<float>(float*, const float*, const Box&, bool);
template void copy_box<double>(double*, const double*, const Box&, bool);
template void copy_box<std::int32_t>(std::int32_t*, const std::int32_t*, const Box&, bool);
template void copy_box<std::int64_t>(std::int64_t*, const std::int64_t*, const Box&, bool);

}  // namespace pmap::detail
