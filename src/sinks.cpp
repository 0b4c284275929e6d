// The mapped outputs' sinks of the common result types, compiled once here (pmap/detail/
// mapped_sink.hpp declares them extern).
#include "pmap/detail/mapped_sink.hpp"

namespace pmap::detail {

#define PMAP_DEFINE_MAPPED_SINK(T, R, L) template class MappedSink<T, R, L>;
PMAP_COMMON_MAPPED_SINKS(PMAP_DEFINE_MAPPED_SINK, float)
PMAP_COMMON_MAPPED_SINKS(PMAP_DEFINE_MAPPED_SINK, double)
#undef PMAP_DEFINE_MAPPED_SINK

}  // namespace pmap::detail
