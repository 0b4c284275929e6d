// Fiber stacks (fiber_stacks.hpp).
#include "fiber_stacks.hpp"

#include <algorithm>
#include <new>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/spin_mutex.h>

namespace pmap::detail::fibers {

std::size_t page_bytes() {
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

/// Stacks as large as oneTBB's worker stacks.
std::size_t stack_bytes() {
  static const std::size_t bytes = [] {
    const std::size_t page = page_bytes();
    std::size_t size = tbb::global_control::active_value(tbb::global_control::thread_stack_size);
    size = std::max<std::size_t>(size, 256 * 1024);
    return (size + page - 1) / page * page + page;  // and the guard page
  }();
  return bytes;
}

namespace {

/// Fiber stacks, kept between calls: a mapping is made once and its pages stay touched.
class StackCache {
 public:
  ~StackCache() {
    for (void* m : free_) munmap(m, stack_bytes());
  }
  void* take() {
    {
      tbb::spin_mutex::scoped_lock guard(lock_);
      if (!free_.empty()) {
        void* m = free_.back();
        free_.pop_back();
        return m;
      }
    }
    void* m = mmap(nullptr, stack_bytes(), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    if (mprotect(m, page_bytes(), PROT_NONE) != 0) {
      munmap(m, stack_bytes());
      throw std::bad_alloc();
    }
    return m;
  }
  void give(void* m) {
    {
      tbb::spin_mutex::scoped_lock guard(lock_);
      if (free_.size() < kKept) {
        free_.push_back(m);
        return;
      }
    }
    munmap(m, stack_bytes());
  }

 private:
  static constexpr std::size_t kKept = 256;
  tbb::spin_mutex lock_;
  std::vector<void*> free_;
};

StackCache& shared_stacks() {
  static StackCache cache;
  return cache;
}

/// A few stacks kept by each thread, so that the loops of one call (one per thread) do not
/// pass the shared cache's lock between them at every call: a call whose devices never wait
/// takes and gives back one stack per thread.
class ThreadStacks {
 public:
  ~ThreadStacks() {  // at thread exit, maybe after the shared cache's static destruction
    for (int k = 0; k < count_; ++k) munmap(kept_[k], stack_bytes());
  }
  void* take() { return count_ > 0 ? kept_[--count_] : shared_stacks().take(); }
  void give(void* m) {
    if (count_ < kKept)
      kept_[count_++] = m;
    else
      shared_stacks().give(m);
  }

 private:
  static constexpr int kKept = 4;
  void* kept_[kKept] = {};
  int count_ = 0;
};

/// The calling thread's stacks.
ThreadStacks& stacks() {
  static thread_local ThreadStacks mine;
  return mine;
}

}  // namespace

void* take_stack() { return stacks().take(); }

void give_stack(void* mapping) { stacks().give(mapping); }

}  // namespace pmap::detail::fibers
