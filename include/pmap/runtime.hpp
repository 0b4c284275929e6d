/// @file runtime.hpp
/// @brief Logical devices and the oneTBB worker pool that runs them.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

namespace pmap {

/// @brief One logical device: a position along a mapped axis, run as a oneTBB task.
struct Device {
  int id = 0;             ///< global id: process_index * local_device_count + local id
  int process_index = 0;  ///< the process that owns the device
  /// @brief "cpu:{id}".
  std::string to_string() const;
  friend bool operator==(const Device&, const Device&) = default;
};

/// @brief How many devices a Runtime has and how many worker threads run them.
struct RuntimeConfig {
  int num_devices = 0;  ///< 0: $PMAP_NUM_DEVICES, else std::thread::hardware_concurrency()
  int num_threads = 0;  ///< 0: $PMAP_NUM_THREADS, else min(num_devices, hardware threads)
  /// Bind worker thread k of the arena (k = 1 .. num_threads - 1; the calling thread takes
  /// slot 0) to the k-th CPU of the process's affinity mask, as OMP_PROC_BIND=close binds
  /// OpenMP's threads, so that the OS never stacks two of them on one CPU while another
  /// idles. false: $PMAP_BIND_THREADS=1 turns it on. The calling thread is left as it is
  /// (bind it to the first CPU yourself for the same effect). For machines dedicated to the
  /// job: a bound worker stays bound when it later serves another arena.
  bool bind_threads = false;
};

namespace detail {
class Pool;
}
namespace distributed {
void initialize();
}

/// @brief A set of logical devices and the worker threads (one oneTBB arena) that run them.
///
/// Threads are created once and reused by every call. Devices may outnumber threads:
/// a device waiting in a collective gives its thread back.
///
/// Example:
/// @code
///   pmap::Runtime rt({.num_devices = 8, .num_threads = 2});
///   auto f = pmap::pmap([](auto x) { return x * 2.f; }, {.runtime = &rt});
///   Eigen::Tensor<float, 2, Eigen::RowMajor> xs(8, 1024);
///   xs.setRandom();
///   Eigen::Tensor<float, 2, Eigen::RowMajor> ys = f(xs);   // 8 devices on 2 threads
/// @endcode
///
/// Thread safety: all members are const and safe to call from any thread; several
/// threads may dispatch onto one Runtime at once.
class Runtime {
 public:
  /// @brief Creates the devices and the worker arena; throws ValueError for negative counts.
  explicit Runtime(RuntimeConfig config = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// @brief The process-wide runtime, created on first use from the environment (SPEC 4).
  static Runtime& global();

  /// @brief All devices of all processes, in id order.
  std::span<const Device> devices() const;
  /// @brief This process's devices.
  std::span<const Device> local_devices() const;
  int device_count() const;
  int local_device_count() const;
  int num_threads() const;
  int process_index() const;
  int process_count() const;

  /// @brief The worker pool (internal).
  detail::Pool& pool() const { return *pool_; }

 private:
  friend void distributed::initialize();
  /// Lays out the devices of every process (after distributed::initialize()).
  void span_processes();

  std::vector<Device> devices_;
  int process_index_ = 0;
  int process_count_ = 1;
  int local_device_count_ = 0;
  std::unique_ptr<detail::Pool> pool_;
};

/// @name Shorthands over Runtime::global().
/// @{
std::span<const Device> devices();
std::span<const Device> local_devices();
int device_count();
int local_device_count();
int process_index();
int process_count();
/// @}

}  // namespace pmap
