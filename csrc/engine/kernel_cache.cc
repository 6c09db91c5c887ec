#include "engine/kernel_cache.h"

#include <pthread.h>

#include <algorithm>

#include "engine/errors.h"

namespace tileops::engine {
namespace {
std::atomic<size_t> g_capacity{KernelCache::kDefaultCapacity};
std::atomic<uint64_t> g_generation{0};

void count_fork_in_child() { g_generation.fetch_add(1, std::memory_order_relaxed); }

// Registered once per process, before any build can be pending.
const bool g_fork_handler_installed = [] { return pthread_atfork(nullptr, nullptr, count_fork_in_child) == 0; }();
}  // namespace

uint64_t KernelCache::fork_generation() {
  (void)g_fork_handler_installed;
  return g_generation.load(std::memory_order_relaxed);
}

size_t KernelCache::capacity() { return g_capacity.load(std::memory_order_relaxed); }

void KernelCache::set_capacity(size_t entries) {
  g_capacity.store(std::max<size_t>(entries, 1), std::memory_order_relaxed);
}

void KernelCache::finish(BuildSync& sync) {
  {
    std::lock_guard lock(sync.mutex);
    sync.done = true;
  }
  sync.done_cv.notify_all();
}

Handle KernelCache::get_or_build(std::span<const int64_t> key, int64_t role, const std::function<Handle()>& build,
                                 OwnerLock& owner) {
  const auto me = std::this_thread::get_id();
  for (;;) {
    auto it = slots_.find(key);
    if (it == slots_.end()) break;
    if (it->second.kernel) {
      it->second.last_used = ++clock_;
      return it->second.kernel;
    }
    // Another call is building this key: wait for it without holding the owner lock.
    std::shared_ptr<BuildSync> sync = it->second.pending;
    if (sync->generation != fork_generation()) {
      slots_.erase(it);  // started before a fork: its builder is not in this process
      break;
    }
    if (sync->builder == me) {
      throw EngineError(EngineError::Kind::kBackend, messages::recursive_build(label_));
    }
    owner.unlock();
    {
      std::unique_lock lock(sync->mutex);
      sync->done_cv.wait(lock, [&] { return sync->done; });
    }
    owner.lock();
    // Loop: the build either succeeded (a kernel is there) or failed (try ourselves).
  }

  auto sync = std::make_shared<BuildSync>();
  sync->builder = me;
  sync->generation = fork_generation();
  std::vector<int64_t> stored_key(key.begin(), key.end());
  slots_.emplace(stored_key, Slot{nullptr, role, 0, sync});

  Handle kernel;
  try {
    kernel = build();
  } catch (...) {
    slots_.erase(stored_key);
    finish(*sync);
    throw;
  }
  // `build` may have let the owner lock go (Python releases the GIL), so other keys may
  // have been added meanwhile: look the slot up again.
  auto& slot = slots_.find(stored_key)->second;
  slot.kernel = kernel;
  slot.role = role;
  slot.last_used = ++clock_;
  slot.pending.reset();
  ++stats_.builds;
  finish(*sync);

  std::vector<Handle> released;
  evict_beyond_capacity(released);
  return kernel;  // `released` is destroyed after the table is consistent
}

void KernelCache::evict_beyond_capacity(std::vector<Handle>& released) {
  const size_t bound = capacity();
  while (slots_.size() > bound) {
    auto victim = slots_.end();
    for (auto it = slots_.begin(); it != slots_.end(); ++it) {
      if (!it->second.kernel) continue;  // never evict a build in progress
      if (victim == slots_.end() || it->second.last_used < victim->second.last_used) victim = it;
    }
    if (victim == slots_.end()) return;
    released.push_back(std::move(victim->second.kernel));
    slots_.erase(victim);
    ++stats_.evictions;
  }
}

void KernelCache::erase(std::span<const int64_t> key) {
  Handle released;
  auto it = slots_.find(key);
  if (it == slots_.end() || !it->second.kernel) return;
  released = std::move(it->second.kernel);
  slots_.erase(it);
}

std::vector<KernelCache::Item> KernelCache::items() const {
  std::vector<Item> out;
  for (const auto& [key, slot] : slots_) {
    if (slot.kernel) out.push_back({key, slot.role, slot.kernel});
  }
  return out;
}

size_t KernelCache::size() const {
  return static_cast<size_t>(
      std::count_if(slots_.begin(), slots_.end(), [](const auto& s) { return s.second.kernel; }));
}

void KernelCache::clear() {
  std::vector<Handle> released;
  for (auto it = slots_.begin(); it != slots_.end();) {
    if (it->second.kernel) {
      released.push_back(std::move(it->second.kernel));
      it = slots_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace tileops::engine
