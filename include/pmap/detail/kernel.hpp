/// @file kernel.hpp
/// @brief How a kernel is invoked: with or without a leading pmap::Context&.
#pragma once

#include <functional>
#include <type_traits>

#include "pmap/context.hpp"

namespace pmap::detail {

template <class F, class... V>
inline constexpr bool takes_context_v = std::is_invocable_v<const F&, Context&, V...>;

template <class F, class... V>
inline constexpr bool kernel_invocable_v =
    takes_context_v<F, V...> || std::is_invocable_v<const F&, V...>;

template <bool WithContext, class F, class... V>
struct kernel_result_impl {
  using type = std::invoke_result_t<const F&, V...>;
};
template <class F, class... V>
struct kernel_result_impl<true, F, V...> {
  using type = std::invoke_result_t<const F&, Context&, V...>;
};
template <class F, class... V>
using kernel_result_t = typename kernel_result_impl<takes_context_v<F, V...>, F, V...>::type;

template <class F, class Views>
decltype(auto) invoke_kernel(const F& kernel, Context& ctx, Views&& views) {
  return std::apply(
      [&](auto&&... v) -> decltype(auto) {
        if constexpr (takes_context_v<F, decltype(v)...>)
          return std::invoke(kernel, ctx, std::forward<decltype(v)>(v)...);
        else
          return std::invoke(kernel, std::forward<decltype(v)>(v)...);
      },
      std::forward<Views>(views));
}

}  // namespace pmap::detail
