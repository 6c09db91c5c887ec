#include "output_cache.h"

#include <cstdlib>
#include <list>
#include <mutex>
#include <new>

#if defined(__linux__) || defined(__APPLE__)
#include <pthread.h>
#include <sys/mman.h>
#define TNC_HAVE_MMAP 1
#endif

namespace tnc {
namespace {

uint64_t budget_from_env() {
  const char* s = std::getenv("TILEOPS_NATIVE_CPU_OUTPUT_CACHE_MB");
  const long mb = s != nullptr && *s != '\0' ? std::strtol(s, nullptr, 10) : 1024;
  return static_cast<uint64_t>(mb < 0 ? 0 : mb) << 20;
}

struct Cache {
  std::mutex mutex;
  std::list<OutputBlock> idle;  // most recently returned first
  uint64_t idle_bytes = 0;
  uint64_t budget = budget_from_env();
  uint64_t hits = 0, misses = 0;

  // Drops the least recently returned idle blocks until they fit `limit`; the caller holds
  // the mutex and unmaps what comes back once it has let go of it.
  std::list<OutputBlock> trim(uint64_t limit) {
    std::list<OutputBlock> out;
    while (idle_bytes > limit && !idle.empty()) {
      idle_bytes -= idle.back().capacity;
      out.splice(out.begin(), idle, std::prev(idle.end()));
    }
    return out;
  }
};

Cache& cache() {
  static Cache* c = [] {
    auto* made = new Cache();  // never destroyed: tensors may be freed during teardown
#if defined(TNC_HAVE_MMAP)
    // A fork while another thread holds the mutex (a tensor freed on another thread) would
    // leave it locked forever in the child, a DataLoader worker say: the child starts with
    // a fresh one (its copy of the idle list is its own, copy-on-write).
    pthread_atfork(nullptr, nullptr, [] { new (&cache().mutex) std::mutex(); });
#endif
    return made;
  }();
  return *c;
}

void unmap(const std::list<OutputBlock>& blocks) {
  for (const OutputBlock& b : blocks) unmap_block(b);
}

}  // namespace

void unmap_block(OutputBlock block) {
#if defined(TNC_HAVE_MMAP)
  if (block.data != nullptr) munmap(block.data, block.capacity);
#else
  (void)block;
#endif
}

OutputBlock map_huge_block(size_t bytes) {
#if defined(TNC_HAVE_MMAP)
  const size_t capacity = huge_block_capacity(bytes);
  // over-map by 2 MiB and cut to an aligned run, so the whole block can be huge pages
  const size_t span = capacity + kHugePageBytes;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return {};
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + span, used = aligned + capacity;
  if (end > used) munmap(reinterpret_cast<void*>(used), end - used);
#if defined(MADV_HUGEPAGE)
  madvise(reinterpret_cast<void*>(aligned), capacity, MADV_HUGEPAGE);
#endif
  return {reinterpret_cast<void*>(aligned), capacity};
#else
  (void)bytes;
  return {};
#endif
}

OutputBlock output_cache_take(size_t bytes) {
  if (bytes < kOutputCacheMinBytes) return {};
  const size_t capacity = huge_block_capacity(bytes);
  Cache& c = cache();
  {
    std::lock_guard lock(c.mutex);
    if (c.budget == 0) return {};
    for (auto it = c.idle.begin(); it != c.idle.end(); ++it) {
      if (it->capacity == capacity) {
        const OutputBlock b = *it;
        c.idle.erase(it);
        c.idle_bytes -= b.capacity;
        ++c.hits;
        return b;
      }
    }
    ++c.misses;
  }
  return map_huge_block(capacity);
}

void output_cache_give(OutputBlock block) {
  if (block.data == nullptr) return;
  Cache& c = cache();
  std::list<OutputBlock> released;
  {
    std::lock_guard lock(c.mutex);
    c.idle.push_front(block);
    c.idle_bytes += block.capacity;
    released = c.trim(c.budget);
  }
  unmap(released);
}

OutputCacheStats output_cache_stats() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  return {c.hits, c.misses, c.idle_bytes, c.budget};
}

uint64_t output_cache_set_budget(uint64_t bytes) {
  Cache& c = cache();
  std::list<OutputBlock> released;
  uint64_t previous;
  {
    std::lock_guard lock(c.mutex);
    previous = c.budget;
    c.budget = bytes;
    released = c.trim(bytes);
  }
  unmap(released);
  return previous;
}

}  // namespace tnc
