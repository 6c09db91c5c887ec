// Parallel regions of the kernels. They run on the calling thread's team of the OpenMP
// runtime torch has loaded (thread_pool.cc says why), or, where no OpenMP runtime is loaded
// or TILEOPS_NATIVE_CPU_POOL=own, on a small pool of our own workers (we never load an
// OpenMP runtime ourselves). Either way the calling thread takes part as worker 0, so a
// kernel sized to torch.get_num_threads() threads uses that many cores in total.
#pragma once

#include <cstdint>
#include <utility>

namespace tnc {

using TaskFn = void (*)(void* ctx, int64_t begin, int64_t end);

// Splits [0, n) into at most `threads` contiguous ranges of at least `grain` items and
// runs fn on each; returns after all ranges are done. Runs inline when one range suffices,
// when called from a worker, or when another thread is using the pool.
void parallel_for_impl(int64_t n, int64_t grain, int threads, TaskFn fn, void* ctx);

template <class F>
void parallel_for(int64_t n, int64_t grain, int threads, F&& f) {
  auto trampoline = [](void* ctx, int64_t b, int64_t e) { (*static_cast<std::remove_reference_t<F>*>(ctx))(b, e); };
  parallel_for_impl(n, grain, threads, trampoline, const_cast<void*>(static_cast<const void*>(&f)));
}

// Chunks per thread a parallel_for aims for (fewer when `grain` allows fewer).
inline constexpr int64_t kChunksPerThread = 16;

// Counters over the parallel regions run so far (for tests and benchmarks): regions, chunks
// in them, and chunks the calling thread ran itself (the rest ran on the pool's workers).
struct PoolStats {
  uint64_t rounds = 0;
  uint64_t chunks = 0;
  uint64_t caller_chunks = 0;
  uint64_t openmp_rounds = 0;  // regions run on the OpenMP team rather than our own pool
  uint64_t openmp_stalls = 0;  // team regions that waited over 1 ms for a late thread
  uint64_t alone_after_stall = 0;  // regions the calling thread ran alone after such a stall
};
PoolStats pool_stats();

// Whether regions run on the calling thread's team of an already-loaded OpenMP runtime
// (torch's) when there is one (the default), or always on our own pool. Returns whether
// the OpenMP team will be used.
bool set_use_openmp(bool on);
bool openmp_available();

// Index of the calling thread in the current parallel region (0 outside one).
int worker_index();

}  // namespace tnc
