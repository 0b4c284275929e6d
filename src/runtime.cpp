#include "pmap/runtime.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

#include "pmap/detail/distributed.hpp"
#include "pmap/detail/errors.hpp"
#include "pmap/distributed.hpp"
#include "pmap/detail/pool.hpp"
#include "pmap/detail/trace_events.hpp"
#include "pmap/logging.hpp"

namespace pmap {
namespace {

int hardware_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

int from_env(const char* name, int fallback) {
  const char* value = std::getenv(name);
  if (!value || !*value) return fallback;
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  if (*end != '\0' || parsed <= 0)
    detail::raise_value_error(fmt::format("{} must be a positive integer, got '{}'", name, value));
  return static_cast<int>(parsed);
}

/// A 0/1 switch from the environment (unset or empty: false).
bool flag_from_env(const char* name) {
  const char* value = std::getenv(name);
  if (!value || !*value) return false;
  const std::string v(value);
  if (v != "0" && v != "1")
    detail::raise_value_error(fmt::format("{} must be 0 or 1, got '{}'", name, value));
  return v == "1";
}

}  // namespace

std::string Device::to_string() const { return fmt::format("cpu:{}", id); }


Runtime::Runtime(RuntimeConfig config) {
  detail::tracing::start_from_environment();
  if (config.num_devices < 0 || config.num_threads < 0)
    detail::raise_value_error(fmt::format(
        "RuntimeConfig needs num_devices >= 0 and num_threads >= 0, got {} and {}",
        config.num_devices, config.num_threads));
  const int hw = hardware_threads();
  const int num_devices =
      config.num_devices > 0 ? config.num_devices : from_env("PMAP_NUM_DEVICES", hw);
  const int num_threads = config.num_threads > 0
                              ? config.num_threads
                              : from_env("PMAP_NUM_THREADS", std::min(num_devices, hw));
  const bool bind = config.bind_threads || flag_from_env("PMAP_BIND_THREADS");
  local_device_count_ = num_devices;
  pool_ = std::make_unique<detail::Pool>(num_threads, bind);
  span_processes();
  (void)logger();  // the logger exists before the first dispatch looks at it
}

Runtime::~Runtime() = default;

void Runtime::span_processes() {
  process_count_ = distributed::is_initialized() ? detail::mpi::size() : 1;
  process_index_ = distributed::is_initialized() ? detail::mpi::rank() : 0;
  devices_.clear();
  for (int p = 0; p < process_count_; ++p)
    for (int i = 0; i < local_device_count_; ++i)
      devices_.push_back(Device{p * local_device_count_ + i, p});
}

Runtime& Runtime::global() {
  static Runtime runtime{RuntimeConfig{}};
  return runtime;
}

std::span<const Device> Runtime::devices() const { return devices_; }
std::span<const Device> Runtime::local_devices() const {
  return std::span<const Device>(devices_).subspan(
      static_cast<std::size_t>(process_index_ * local_device_count_),
      static_cast<std::size_t>(local_device_count_));
}
int Runtime::device_count() const { return static_cast<int>(devices_.size()); }
int Runtime::local_device_count() const { return local_device_count_; }
int Runtime::num_threads() const { return pool_->threads(); }
int Runtime::process_index() const { return process_index_; }
int Runtime::process_count() const { return process_count_; }

std::span<const Device> devices() { return Runtime::global().devices(); }
std::span<const Device> local_devices() { return Runtime::global().local_devices(); }
int device_count() { return Runtime::global().device_count(); }
int local_device_count() { return Runtime::global().local_device_count(); }
int process_index() { return Runtime::global().process_index(); }
int process_count() { return Runtime::global().process_count(); }

}  // namespace pmap
