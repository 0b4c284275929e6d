#include "pmap/detail/thread_state.hpp"

namespace pmap::detail {

[[gnu::noinline, gnu::noipa]] ThreadState& this_thread() {
  static thread_local ThreadState state;
  return state;
}

}  // namespace pmap::detail
