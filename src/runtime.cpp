#include "pmap/runtime.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

#include "pmap/context.hpp"
#include "pmap/detail/distributed.hpp"
#include "pmap/detail/errors.hpp"
#include "pmap/distributed.hpp"
#include "pmap/detail/pool.hpp"
#include "pmap/logging.hpp"
#include "pmap/mapped.hpp"

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

}  // namespace

std::string Device::to_string() const { return fmt::format("cpu:{}", id); }

namespace detail {

Pool::Pool(int threads)
    : threads_(threads),
      parallelism_(threads > static_cast<int>(tbb::global_control::active_value(
                                 tbb::global_control::max_allowed_parallelism))
                       ? std::make_unique<tbb::global_control>(
                             tbb::global_control::max_allowed_parallelism,
                             static_cast<std::size_t>(threads))
                       : nullptr),
      arena_(threads, 1) {
  arena_.initialize();
}

}  // namespace detail

Runtime::Runtime(RuntimeConfig config) {
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
  local_device_count_ = num_devices;
  pool_ = std::make_unique<detail::Pool>(num_threads);
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

namespace detail {

void check_devices_option(const std::optional<std::vector<Device>>& devices,
                          const Runtime& runtime) {
  if (!devices) return;
  if (devices->empty()) raise_no_devices();
  const auto all = runtime.devices();
  for (std::size_t i = 0; i < devices->size(); ++i) {
    const Device& d = (*devices)[i];
    if (std::find(all.begin(), all.end(), d) == all.end())
      raise_value_error(fmt::format("pmap devices: {} is not a device of the runtime, which has "
                                    "{} devices",
                                    d.to_string(), all.size()));
    for (std::size_t j = 0; j < i; ++j)
      if ((*devices)[j] == d)
        raise_value_error(fmt::format("pmap devices must be distinct, but {} appears twice",
                                      d.to_string()));
  }
}

// The nesting rendezvous: every outer device of the team calls the inner pmap. Either all of
// them get the child team, or none does: an outer device that got it runs its inner devices
// (which leave at once if the child is cancelled), so an inner device never waits for a peer
// whose outer device left without starting it. Hence the barriers here ignore cancellation
// (Team::drain): they complete when every outer device arrived, and fail on every device
// alike when one returned from its kernel instead.
std::shared_ptr<Team> join_nested(Context& outer, int n, const std::string* axis_name,
                                  const Runtime& runtime) {
  Member& me = Access::member(outer);
  Team& team = *me.team;
  if (team.distributed())
    raise_value_error("pmap: a pmap nested inside a multi-process pmap is not supported; map "
                      "the processes' axis innermost or flatten the two axes into one");
  const int depth = team.num_axes();
  if (depth + 1 > kMaxAxes) raise_value_error(fmt::format("pmap nests at most {} axes", kMaxAxes));
  std::vector<int> everyone(static_cast<std::size_t>(team.size()));
  for (int m = 0; m < team.size(); ++m) everyone[static_cast<std::size_t>(m)] = m;
  Slot& slot = team.slot(me.index);
  slot.desc = OpDesc{"pmap", 0x9e3779b97f4a7c15ULL ^ static_cast<std::uint64_t>(n), "",
                     Shape{1, {n}}, 2};
  *fmt::format_to_n(slot.axes, sizeof(slot.axes) - 1, "{}",
                    axis_name->empty() ? std::string("None") : *axis_name)
       .out = '\0';
  slot.signature.store(slot.desc.signature, std::memory_order_release);
  const std::uint64_t base = me.phase;
  me.phase = base + kPhasesPerCollective;
  // Barrier 1: all outer devices are here (or one returned, and none will get a child).
  team.drain(me.index, everyone, base + 1, base + 1);
  for (int m : everyone)
    if (team.slot(m).phase.load(std::memory_order_acquire) < base + 1) {
      if (team.cancelled()) throw Cancelled{};
      team.arrive_and_wait(me.index, everyone, base + 1);  // raises E14 (or the deadlock)
    }
  team.check_agreement(me.index, everyone, base + 1);  // the same on every device
  std::exception_ptr failure;
  if (me.index == 0) {
    try {
      AxisBinding axes[kMaxAxes];
      for (int a = 0; a < depth; ++a) axes[a] = team.axis(a);
      axes[depth] = AxisBinding{*axis_name, n};
      const int size = team.size() * n;
      std::vector<int> ids(static_cast<std::size_t>(size));
      for (int c = 0; c < size; ++c)
        ids[static_cast<std::size_t>(c)] = runtime.devices()[static_cast<std::size_t>(c)].id;
      team.make_child(size, std::span<const AxisBinding>(axes, static_cast<std::size_t>(depth + 1)),
                      std::move(ids), runtime.num_threads());
    } catch (...) {
      failure = std::current_exception();  // still arrive: the others must not wait for us
    }
  }
  // Barrier 2: the child is published; every device that passed barrier 1 arrives here.
  team.drain(me.index, everyone, base + 2, base + 2);
  if (failure) std::rethrow_exception(failure);
  std::shared_ptr<Team> child = team.child();
  if (!child) throw Cancelled{};  // the leader failed to create it and reports why
  return child;
}

void log_dispatch(const std::string& name, int n, const Device* devices,
                  const std::vector<LeafInfo>& leaves, double microseconds) {
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back(devices[i].id);
  std::vector<std::string> shapes;
  for (const LeafInfo& leaf : leaves) shapes.push_back(format_typed_shape(leaf.dtype, leaf.shape));
  logger()->debug("{}: axis_size={} devices=[{}] args=[{}] took {:.1f} us", name, n,
                  fmt::join(ids, ", "), fmt::join(shapes, ", "), microseconds);
}

}  // namespace detail
}  // namespace pmap
