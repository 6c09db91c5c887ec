#include "thread_pool.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define TNC_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define TNC_PAUSE() asm volatile("yield")
#else
#define TNC_PAUSE() ((void)0)
#endif

namespace tnc {
namespace {

thread_local int tls_worker_index = 0;
thread_local bool tls_in_region = false;

class Pool {
 public:
  static Pool& instance() {
    static Pool* pool = new Pool();  // never destroyed: workers may outlive static teardown
    return *pool;
  }

  bool try_run(int64_t n, int64_t chunk, int ranges, TaskFn fn, void* ctx) {
    std::unique_lock lock(launch_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    ensure_workers(ranges - 1);
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    chunk_ = chunk;
    ranges_ = ranges;
    remaining_.store(ranges - 1, std::memory_order_relaxed);
    const uint64_t ticket = ++generation_;
    for (int i = 1; i < ranges; ++i) {
      slots_[i].ticket.store(ticket, std::memory_order_release);
      slots_[i].ticket.notify_one();
    }
    run_range(0);
    for (int spins = 0; remaining_.load(std::memory_order_acquire) != 0; ++spins) {
      if (spins < 20000) {
        TNC_PAUSE();
      } else {
        int left = remaining_.load(std::memory_order_acquire);
        if (left != 0) remaining_.wait(left, std::memory_order_acquire);
      }
    }
    return true;
  }

 private:
  void run_range(int index) {
    const int64_t begin = index * chunk_;
    const int64_t end = std::min(n_, begin + chunk_);
    tls_worker_index = index;
    tls_in_region = true;
    if (begin < end) fn_(ctx_, begin, end);
    tls_in_region = false;
    tls_worker_index = 0;
  }

  void ensure_workers(int count) {
    while (static_cast<int>(workers_.size()) < count) {
      const int index = static_cast<int>(workers_.size()) + 1;
      workers_.emplace_back([this, index] { worker_loop(index); });
      workers_.back().detach();
    }
  }

  // Each worker waits on its own slot, so a worker that is not part of a round is never
  // woken by it and cannot mistake one round for another.
  void worker_loop(int index) {
    std::atomic<uint64_t>& ticket = slots_[index].ticket;
    uint64_t seen = 0;
    for (;;) {
      uint64_t now;
      for (int spins = 0;; ++spins) {
        now = ticket.load(std::memory_order_acquire);
        if (now != seen) break;
        if (spins < 20000) {
          TNC_PAUSE();
        } else {
          ticket.wait(seen, std::memory_order_acquire);
        }
      }
      seen = now;
      run_range(index);
      if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) remaining_.notify_one();
    }
  }

  struct alignas(64) Slot {
    std::atomic<uint64_t> ticket{0};
  };
  static constexpr int kMaxRanges = 256;
  Slot slots_[kMaxRanges];

  std::mutex launch_;
  std::vector<std::thread> workers_;
  uint64_t generation_ = 0;
  std::atomic<int> remaining_{0};
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  int ranges_ = 0;
};

}  // namespace

void parallel_for_impl(int64_t n, int64_t grain, int threads, TaskFn fn, void* ctx) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t ranges = std::min<int64_t>({static_cast<int64_t>(std::max(threads, 1)), (n + grain - 1) / grain, 256});
  if (ranges <= 1 || tls_in_region) {
    fn(ctx, 0, n);
    return;
  }
  const int64_t chunk = (n + ranges - 1) / ranges;
  ranges = (n + chunk - 1) / chunk;
  if (!Pool::instance().try_run(n, chunk, static_cast<int>(ranges), fn, ctx)) fn(ctx, 0, n);
}

int worker_index() { return tls_worker_index; }

}  // namespace tnc
