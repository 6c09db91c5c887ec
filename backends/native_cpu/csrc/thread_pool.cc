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

// Chunks are claimed dynamically: on a machine shared with torch's OpenMP threads (which
// spin for a while after each torch op) a worker may wake late; the calling thread then
// simply takes the chunks it would have run, instead of waiting for it.
class Pool {
 public:
  static Pool& instance() {
    static Pool* pool = new Pool();  // never destroyed: workers may outlive static teardown
    return *pool;
  }

  bool try_run(int64_t n, int64_t chunk, int chunks, int helpers, TaskFn fn, void* ctx) {
    std::unique_lock lock(launch_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    ensure_workers(helpers);
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    chunk_ = chunk;
    chunks_ = chunks;
    done_.store(0, std::memory_order_relaxed);
    round_ = (round_ + 1) & 0xffffffffu;  // 32-bit rounds, never 0 (a fresh worker's 'seen')
    if (round_ == 0) round_ = 1;
    const uint64_t round = round_;
    // one word: round (bits 63..32), chunk count (31..16), next chunk to claim (15..0), so a
    // late worker can never pair one round's count with another round's index
    next_.store((round << 32) | (static_cast<uint64_t>(chunks) << 16), std::memory_order_release);
    for (int i = 1; i <= helpers; ++i) {
      slots_[i].ticket.store(round, std::memory_order_release);
      slots_[i].ticket.notify_one();
    }
    work(round, 0);
    for (int spins = 0;; ++spins) {
      const int d = done_.load(std::memory_order_acquire);
      if (d == chunks) break;
      if (spins < 4000) {
        TNC_PAUSE();
      } else {
        done_.wait(d, std::memory_order_acquire);
      }
    }
    return true;
  }

 private:
  void work(uint64_t round, int index) {
    tls_worker_index = index;
    tls_in_region = true;
    for (;;) {
      uint64_t cur = next_.load(std::memory_order_acquire);
      int claimed = -1;
      while ((cur >> 32) == round && (cur & 0xffffu) < ((cur >> 16) & 0xffffu)) {
        if (next_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel)) {
          claimed = static_cast<int>(cur & 0xffffu);
          break;
        }
      }
      if (claimed < 0) break;
      // the round cannot end while we hold a claimed chunk: fn_ and ctx_ are stable
      const int64_t begin = claimed * chunk_;
      const int64_t end = std::min(n_, begin + chunk_);
      if (begin < end) fn_(ctx_, begin, end);
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks_) done_.notify_one();
    }
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

  // Each worker waits on its own slot, so only the workers a round asks for are woken.
  void worker_loop(int index) {
    std::atomic<uint64_t>& ticket = slots_[index].ticket;
    uint64_t seen = 0;
    for (;;) {
      uint64_t now;
      for (int spins = 0;; ++spins) {
        now = ticket.load(std::memory_order_acquire);
        if (now != seen) break;
        if (spins < 4000) {
          TNC_PAUSE();
        } else {
          ticket.wait(seen, std::memory_order_acquire);
        }
      }
      seen = now;
      work(now, index);
    }
  }

  struct alignas(64) Slot {
    std::atomic<uint64_t> ticket{0};
  };
  static constexpr int kMaxWorkers = 256;

  std::mutex launch_;
  std::vector<std::thread> workers_;
  Slot slots_[kMaxWorkers + 1];
  uint64_t round_ = 0;
  alignas(64) std::atomic<uint64_t> next_{0};
  alignas(64) std::atomic<int> done_{0};
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  int chunks_ = 0;
};

}  // namespace

void parallel_for_impl(int64_t n, int64_t grain, int threads, TaskFn fn, void* ctx) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  threads = std::clamp(threads, 1, 256);
  const int64_t max_chunks = (n + grain - 1) / grain;
  if (threads <= 1 || max_chunks <= 1 || tls_in_region) {
    fn(ctx, 0, n);
    return;
  }
  // a few chunks per thread, so a late or slow thread leaves little behind
  const int64_t want = std::min<int64_t>(max_chunks, 4 * static_cast<int64_t>(threads));
  const int64_t chunk = (n + want - 1) / want;
  const int chunks = static_cast<int>((n + chunk - 1) / chunk);
  const int helpers = std::min(threads, chunks) - 1;
  if (!Pool::instance().try_run(n, chunk, chunks, helpers, fn, ctx)) fn(ctx, 0, n);
}

int worker_index() { return tls_worker_index; }

}  // namespace tnc
