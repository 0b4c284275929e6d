/// @file diagnostics.hpp
/// @brief Compile errors that say why: what a call of a mapped function checks at compile
/// time, each failure a static_assert with its own text, for a kernel that cannot be
/// invoked one that names the exact view types it would be called with.
#pragma once

#include <cstddef>
#include <type_traits>

#include "pmap/context.hpp"

namespace pmap::detail {

template <class...>
inline constexpr bool always_false_v = false;

/// Converts to a pmap::Context prvalue only: a kernel invocable with it (and not with a
/// Context&) takes its context by value (or as Context&&). Declared, never defined.
struct ContextValueProbe {
  operator Context() const;
};

/// Instantiated only to fail. The compiler's "In instantiation of" line above the message
/// lists the view types the kernel would be called with (after an optional Context&).
template <class... Views>
struct kernel_cannot_be_called_with {
  static_assert(always_false_v<Views...>,
                "pmap: the kernel cannot be invoked with the per-device views of its arguments; "
                "their exact types are the template arguments of kernel_cannot_be_called_with<...> "
                "in the line above. Take each argument as `const auto&` (or exactly that "
                "Eigen::TensorMap type), and `pmap::Context&` first if the kernel uses collectives.");
};

template <class... Views>
struct kernel_takes_context_by_value {
  static_assert(always_false_v<Views...>,
                "pmap: the kernel takes pmap::Context by value, but a Context is neither copyable "
                "nor movable: take it as `pmap::Context&`.");
};

/// Fails to compile with the diagnostic that fits a kernel F that cannot take views V...
template <class F, class... V>
constexpr void diagnose_kernel() {
  if constexpr (std::is_invocable_v<const F&, ContextValueProbe, V...>)
    (void)sizeof(kernel_takes_context_by_value<V...>);
  else
    (void)sizeof(kernel_cannot_be_called_with<V...>);
}

}  // namespace pmap::detail
