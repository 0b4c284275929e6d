/// @file logging.hpp
/// @brief The `pmap` spdlog logger (SPEC 4).
#pragma once

#include <atomic>
#include <memory>

#include <spdlog/logger.h>

namespace pmap {

/// @brief The logger named "pmap". Created on first use at the level of $PMAP_LOG_LEVEL
/// (default warn), writing to stderr, unless a logger named "pmap" was already registered
/// with spdlog, which is then used as is.
std::shared_ptr<spdlog::logger> logger();

/// @brief Replaces the logger (nullptr restores the default). Thread-safe.
void set_logger(std::shared_ptr<spdlog::logger> logger);

namespace detail {
/// The current logger, for the dispatch path: one relaxed load, no formatting when off.
extern std::atomic<spdlog::logger*> active_logger;
inline bool log_enabled(spdlog::level::level_enum level) {
  spdlog::logger* l = active_logger.load(std::memory_order_acquire);
  return l != nullptr && l->should_log(level);
}
}  // namespace detail

}  // namespace pmap
