#include "pmap/logging.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace pmap {
namespace detail {
std::atomic<spdlog::logger*> active_logger{nullptr};
}  // namespace detail

namespace {

std::mutex logger_mutex;
std::shared_ptr<spdlog::logger> current;  // guarded by logger_mutex
// Replaced loggers stay alive: a dispatch may still hold the raw pointer it loaded.
std::vector<std::shared_ptr<spdlog::logger>> retired;  // guarded by logger_mutex

std::shared_ptr<spdlog::logger> make_default() {
  if (auto registered = spdlog::get("pmap")) return registered;
  auto made = spdlog::stderr_color_mt("pmap");
  spdlog::level::level_enum level = spdlog::level::warn;
  if (const char* env = std::getenv("PMAP_LOG_LEVEL"); env && *env)
    level = spdlog::level::from_str(env);
  made->set_level(level);
  return made;
}

}  // namespace

std::shared_ptr<spdlog::logger> logger() {
  std::lock_guard<std::mutex> lock(logger_mutex);
  if (!current) {
    current = make_default();
    detail::active_logger.store(current.get(), std::memory_order_release);
  }
  return current;
}

void set_logger(std::shared_ptr<spdlog::logger> replacement) {
  std::lock_guard<std::mutex> lock(logger_mutex);
  if (current) retired.push_back(current);
  current = replacement ? std::move(replacement) : make_default();
  detail::active_logger.store(current.get(), std::memory_order_release);
}

}  // namespace pmap
