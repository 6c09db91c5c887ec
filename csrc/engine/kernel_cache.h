// The memo of one op instance: signature key -> built kernel, bounded, least recently
// used entries evicted first, each kernel built once even when several threads make the
// same first call together.
//
// Synchronisation: every method runs with the caller's *owner lock* held — the GIL in
// production, a mutex in the C++ tests. That is what makes a hit one hash lookup with
// no lock of its own. The only place the lock is let go is while a thread waits for
// another thread's build of the same key (OwnerLock::unlock / lock).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/handle.h"
#include "engine/signature.h"

namespace tileops::engine {

class OwnerLock {
 public:
  virtual ~OwnerLock() = default;
  virtual void unlock() = 0;
  virtual void lock() = 0;
};

class KernelCache {
 public:
  static constexpr size_t kDefaultCapacity = 256;

  // Process-wide bound on the number of kernels one instance keeps.
  static size_t capacity();
  static void set_capacity(size_t entries);  // >= 1

  struct Stats {
    uint64_t hits = 0;
    uint64_t misses = 0;
    uint64_t builds = 0;
    uint64_t evictions = 0;
  };

  struct Item {
    std::vector<int64_t> key;
    int64_t role;
    Handle kernel;
  };

  // `label` names the owner (the op) in errors.
  explicit KernelCache(std::string label = "") : label_(std::move(label)) {}
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // The hot path: the kernel built for `key`, or nullptr. Counts a hit or a miss.
  const Handle* find(std::span<const int64_t> key) noexcept {
    auto it = slots_.find(key);
    if (it == slots_.end() || !it->second.kernel) {
      ++stats_.misses;
      return nullptr;
    }
    ++stats_.hits;
    it->second.last_used = ++clock_;
    return &it->second.kernel;
  }

  // The miss path: returns the kernel for `key`, calling `build` only if no other call
  // built it or is building it. A failed build leaves nothing behind and rethrows.
  // `role` is stored with the kernel for introspection.
  Handle get_or_build(std::span<const int64_t> key, int64_t role, const std::function<Handle()>& build,
                      OwnerLock& owner);

  // Drops the kernel for `key` (not a build in progress).
  void erase(std::span<const int64_t> key);

  std::vector<Item> items() const;
  size_t size() const;
  Stats stats() const { return stats_; }
  void clear();

 private:
  struct BuildSync {
    std::thread::id builder;
    uint64_t generation;  // process generation (see fork_generation) it was started in
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
  };
  struct Slot {
    Handle kernel;                      // set once built
    int64_t role = 0;
    uint64_t last_used = 0;
    std::shared_ptr<BuildSync> pending;  // set while being built
  };

  static void finish(BuildSync& sync);
  // Counts forks: a child process inherits pending builds whose builder thread does not
  // exist there; a build started in an earlier generation is treated as abandoned.
  static uint64_t fork_generation();
  // Removes least recently used kernels beyond capacity; the removed handles are
  // appended to `released` so the caller drops them once the table is consistent.
  void evict_beyond_capacity(std::vector<Handle>& released);

  std::unordered_map<std::vector<int64_t>, Slot, KeyHash, KeyEqual> slots_;
  std::string label_;
  uint64_t clock_ = 0;
  Stats stats_;
};

}  // namespace tileops::engine
