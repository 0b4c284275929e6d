// The reductions of the common types, compiled once here rather than in every program that
// calls them (pmap/detail/reductions.hpp declares them extern).
#include "pmap/detail/reductions.hpp"

namespace pmap::detail {

#define PMAP_DEFINE_REDUCTION(K, Acc, T) PMAP_REDUCTION_INSTANCE(, K, Acc, T)
PMAP_COMMON_REDUCTIONS(PMAP_DEFINE_REDUCTION)
#undef PMAP_DEFINE_REDUCTION

}  // namespace pmap::detail
