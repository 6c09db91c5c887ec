// Warm memory for large outputs. A fresh block of many MiB from torch's CPU allocator is a
// fresh mapping (glibc maps blocks of 32 MiB and more anew on every allocation, and smaller
// ones once its heap is trimmed), so a kernel writing it page-faults on every call: the
// kernel zeroes each page before we write it, a large share of a call that writes tens of
// MiB. Outputs of kMinBytes and more therefore come from blocks this package keeps:
// mapped once (2 MiB aligned, huge pages advised), handed to torch as DLPack tensors whose
// deleter gives the block back, reused by the next output of the same rounded size.
// Idle blocks are held up to a byte budget (TILEOPS_NATIVE_CPU_OUTPUT_CACHE_MB, default
// 1024; 0 turns the cache off), the least recently returned released first.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tnc {

struct OutputBlock {
  void* data = nullptr;
  size_t capacity = 0;  // the mapping's size, a multiple of kHugePageBytes
};

inline constexpr size_t kOutputCacheMinBytes = size_t{4} << 20;
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// What a block for `bytes` maps: rounded up to whole huge pages (also the cache's buckets).
inline size_t huge_block_capacity(size_t bytes) { return (bytes + kHugePageBytes - 1) & ~(kHugePageBytes - 1); }

// A block of at least `bytes`, or {nullptr, 0} when the cache is off or `bytes` is too
// small for it (the caller allocates through torch) or the mapping failed.
OutputBlock output_cache_take(size_t bytes);
// Gives a block back (any thread, with or without the GIL).
void output_cache_give(OutputBlock block);

// A fresh mapping of huge_block_capacity(bytes), 2 MiB aligned, huge pages advised;
// {nullptr, 0} where mmap is missing or fails. tileops' machine probes (bind/probe.cc)
// measure on mappings made the same way, so their ceiling is the memory our outputs live in.
OutputBlock map_huge_block(size_t bytes);
void unmap_block(OutputBlock block);

struct OutputCacheStats {
  uint64_t hits = 0, misses = 0;  // takes served by an idle block / by a new mapping
  uint64_t idle_bytes = 0, budget_bytes = 0;
};
OutputCacheStats output_cache_stats();
// Sets the idle budget (releases what exceeds it); returns the previous one.
uint64_t output_cache_set_budget(uint64_t bytes);

}  // namespace tnc
