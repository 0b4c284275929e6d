/// @file axes.hpp
/// @brief in_axes / out_axes specs, axis names, groups and the tiled tag.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <initializer_list>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

namespace pmap {

/// @brief The type of pmap::none: an argument or output that is not mapped.
struct none_t {
  explicit constexpr none_t(int) {}
};
/// @brief Broadcast an argument to every device / return device 0's replicated output.
inline constexpr none_t none{0};

namespace detail {
template <class A>
inline constexpr bool is_axis_entry_v = std::is_same_v<A, int> || std::is_same_v<A, none_t>;
}

/// @brief A per-argument axis spec: each entry an int (mapped along it) or none_t.
template <class... A>
struct InAxes {
  static_assert((detail::is_axis_entry_v<A> && ...),
                "pmap::in_axes entries must be ints or pmap::none");
  std::tuple<A...> entries;
};

/// @brief A per-output axis spec: each entry an int (device axis inserted there) or none_t.
template <class... A>
struct OutAxes {
  static_assert((detail::is_axis_entry_v<A> && ...),
                "pmap::out_axes entries must be ints or pmap::none");
  std::tuple<A...> entries;
};

namespace detail {
struct Access;
template <class A>
using axis_entry_t = std::conditional_t<std::is_same_v<std::decay_t<A>, none_t>, none_t, int>;
}

/// @brief in_axes(0, pmap::none, -1): one entry per positional argument, or one for all.
template <class... A>
constexpr InAxes<detail::axis_entry_t<A>...> in_axes(A... entries) {
  return {{detail::axis_entry_t<A>(entries)...}};
}

/// @brief out_axes(pmap::none): one entry per output, or one for all.
template <class... A>
constexpr OutAxes<detail::axis_entry_t<A>...> out_axes(A... entries) {
  return {{detail::axis_entry_t<A>(entries)...}};
}

/// @brief Tag selecting the tiled form of all_gather, psum_scatter and all_to_all.
struct tiled_t {
  explicit constexpr tiled_t(int) {}
};
inline constexpr tiled_t tiled{0};

/// @brief The axes a collective runs over: one name, several (one flattened axis,
/// row-major in the listed order), or {} for the innermost axis.
///
/// Holds up to 8 names in one string (each ended by '\0'), so that naming a short axis does
/// not allocate and a copy (a started collective keeps one) is one short string's copy.
class AxisNames {
 public:
  static constexpr int kMaxNames = 8;
  AxisNames() = default;
  AxisNames(const char* name) { add(name); }
  AxisNames(const std::string& name) { add(name); }
  AxisNames(std::string_view name) { add(name); }
  AxisNames(std::initializer_list<std::string_view> names) {
    for (auto n : names) add(n);
  }
  /// @brief How many names are listed; 0 for the innermost axis.
  std::size_t size() const { return count_; }
  /// @brief The k-th listed name (k < size()).
  std::string_view name(std::size_t k) const {
    std::size_t begin = 0;
    for (std::size_t i = 0; i < k; ++i) begin = chars_.find('\0', begin) + 1;
    return std::string_view(chars_).substr(begin, chars_.find('\0', begin) - begin);
  }
  bool innermost() const { return count_ == 0; }

 private:
  friend struct detail::Access;
  void add(std::string_view name) {
    if (count_ == kMaxNames) throw std::length_error("pmap::AxisNames holds at most 8 names");
    chars_.append(name);
    chars_.push_back('\0');
    ++count_;
  }
  std::string chars_;
  std::size_t count_ = 0;
};

/// @brief axis_index_groups: each inner vector one group of axis indices; {} = one group.
using Groups = std::vector<std::vector<int>>;

}  // namespace pmap
