#include "thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <dlfcn.h>
#include <link.h>
#endif

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

using Clock = std::chrono::steady_clock;

// How long an idle worker spins before it sleeps on a futex, and how long the caller spins
// for the last chunks. A futex wake costs a sleeping worker tens of microseconds on a
// virtual machine (more on a busy one), which is most of a 2-thread split of a ~100 us
// kernel; spinning through the gap between two kernel calls avoids it. Measured as time,
// not as PAUSE count (PAUSE takes ~10 to ~140 cycles depending on the CPU).
// TILEOPS_NATIVE_CPU_SPIN_US overrides it (0: sleep at once).
int64_t spin_ns() {
  static const int64_t ns = [] {
    const char* s = std::getenv("TILEOPS_NATIVE_CPU_SPIN_US");
    const long us = s != nullptr && *s != '\0' ? std::strtol(s, nullptr, 10) : 200;
    return static_cast<int64_t>(std::clamp<long>(us, 0, 100000)) * 1000;
  }();
  return ns;
}

// Spins until pred() holds or the spin budget is spent; true when pred() held.
template <class Pred>
bool spin_until(Pred pred, int64_t budget_ns) {
  if (pred()) return true;
  if (budget_ns <= 0) return false;
  const Clock::time_point until = Clock::now() + std::chrono::nanoseconds(budget_ns);
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      TNC_PAUSE();
      if (pred()) return true;
    }
    if (Clock::now() >= until) return false;
  }
}

struct {
  std::atomic<uint64_t> rounds{0}, chunks{0}, caller_chunks{0}, openmp_rounds{0}, openmp_stalls{0},
      alone_after_stall{0};
} g_stats;

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
    task_.fn = fn;
    task_.ctx = ctx;
    task_.n = n;
    task_.chunk = chunk;
    task_.chunks = chunks;
    done_.store(0, std::memory_order_relaxed);
    round_ = (round_ + 1) & 0xffffffffu;  // 32-bit rounds, never 0 (a fresh worker's 'seen')
    if (round_ == 0) round_ = 1;
    const uint32_t round = round_;
    // one word: round (bits 63..32), chunk count (31..16), next chunk to claim (15..0), so a
    // late worker can never pair one round's count with another round's index
    next_.store((static_cast<uint64_t>(round) << 32) | (static_cast<uint64_t>(chunks) << 16),
                std::memory_order_release);
    for (int i = 1; i <= helpers; ++i) {
      Slot& s = slots_[i];
      s.ticket.store(round, std::memory_order_seq_cst);
      // a futex wake only for a worker that went to sleep (it sets `sleeping`, then
      // re-reads the ticket, both seq_cst: one of the two sides sees the other)
      if (s.sleeping.load(std::memory_order_seq_cst)) s.ticket.notify_one();
    }
    const int mine = work(round, 0);
    const auto finished = [&] { return done_.load(std::memory_order_acquire) == chunks; };
    if (!spin_until(finished, std::max<int64_t>(spin_ns(), 50000))) {
      for (int d; (d = done_.load(std::memory_order_acquire)) != chunks;) done_.wait(d, std::memory_order_acquire);
    }
    g_stats.rounds.fetch_add(1, std::memory_order_relaxed);
    g_stats.chunks.fetch_add(chunks, std::memory_order_relaxed);
    g_stats.caller_chunks.fetch_add(mine, std::memory_order_relaxed);
    return true;
  }

 private:
  // Runs chunks of `round` until none is left; returns how many this thread ran.
  int work(uint32_t round, int index) {
    tls_worker_index = index;
    tls_in_region = true;
    int ran = 0;
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
      // the round cannot end while we hold a claimed chunk: the task is stable
      const int64_t begin = claimed * task_.chunk;
      const int64_t end = std::min(task_.n, begin + task_.chunk);
      if (begin < end) task_.fn(task_.ctx, begin, end);
      ++ran;
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == task_.chunks) done_.notify_one();
    }
    tls_in_region = false;
    tls_worker_index = 0;
    return ran;
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
    Slot& slot = slots_[index];
    uint32_t seen = 0;
    for (;;) {
      const auto posted = [&] { return slot.ticket.load(std::memory_order_acquire) != seen; };
      if (!spin_until(posted, spin_ns())) {
        slot.sleeping.store(1, std::memory_order_seq_cst);
        while (slot.ticket.load(std::memory_order_seq_cst) == seen) slot.ticket.wait(seen, std::memory_order_acquire);
        slot.sleeping.store(0, std::memory_order_relaxed);
      }
      seen = slot.ticket.load(std::memory_order_acquire);
      work(seen, index);
    }
  }

  struct alignas(64) Slot {
    std::atomic<uint32_t> ticket{0};
    std::atomic<uint32_t> sleeping{0};
  };
  // written once per round before it is published, then only read: a line of its own, so
  // the claim and completion counters' traffic does not evict it from the workers' caches
  struct alignas(64) Task {
    TaskFn fn = nullptr;
    void* ctx = nullptr;
    int64_t n = 0;
    int64_t chunk = 0;
    int chunks = 0;
  };
  static constexpr int kMaxWorkers = 256;

  std::mutex launch_;
  std::vector<std::thread> workers_;
  uint32_t round_ = 0;
  Task task_;
  alignas(64) std::atomic<uint64_t> next_{0};
  alignas(64) std::atomic<int> done_{0};
  Slot slots_[kMaxWorkers + 1];
};

// ---------------------------------------------------------------------------------------
// torch's OpenMP team. torch's CPU ops run on OpenMP threads that spin for milliseconds
// after each op (libgomp's default GOMP_SPINCOUNT is 300000 PAUSEs). A pool of our own
// then competes with a spinning OpenMP thread for the same cores whenever our kernels
// follow torch ops: our helper gets only part of a core, and 2 threads barely scale. So
// when the process has already loaded an OpenMP runtime (torch's
// libgomp, or an LLVM/Intel runtime, which export the same GOMP_parallel entry point) the
// regions run on that runtime's team of the calling thread -- the very threads torch uses,
// hot when a torch op just ran. We never link or load one ourselves: the runtime is found
// among the loaded objects and opened with RTLD_NOLOAD.

struct OmpApi {
  void (*parallel)(void (*)(void*), void*, unsigned, unsigned) = nullptr;
  int (*thread_num)() = nullptr;
  int (*in_parallel)() = nullptr;
};

const OmpApi* find_openmp() {
#if defined(__linux__)
  std::string path;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        const char* name = info->dlpi_name;
        if (name == nullptr) return 0;
        const char* base = std::strrchr(name, '/');
        base = base != nullptr ? base + 1 : name;
        if (std::strncmp(base, "libgomp", 7) == 0 || std::strncmp(base, "libomp", 6) == 0 ||
            std::strncmp(base, "libiomp5", 8) == 0) {
          *static_cast<std::string*>(data) = name;
          return 1;
        }
        return 0;
      },
      &path);
  if (path.empty()) return nullptr;
  void* handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  auto* api = new OmpApi;
  api->parallel = reinterpret_cast<decltype(api->parallel)>(dlsym(handle, "GOMP_parallel"));
  api->thread_num = reinterpret_cast<decltype(api->thread_num)>(dlsym(handle, "omp_get_thread_num"));
  api->in_parallel = reinterpret_cast<decltype(api->in_parallel)>(dlsym(handle, "omp_in_parallel"));
  if (api->parallel == nullptr || api->thread_num == nullptr || api->in_parallel == nullptr) {
    delete api;
    return nullptr;  // the handle stays open: the runtime was loaded before us and stays
  }
  return api;
#else
  return nullptr;
#endif
}

const OmpApi* openmp_runtime() {
  static const OmpApi* api = find_openmp();  // looked up at the first parallel region
  return api;
}

// 1: use the OpenMP team when a runtime is loaded; 0: always our own pool.
// TILEOPS_NATIVE_CPU_POOL=own starts with 0.
std::atomic<int> g_use_openmp{[] {
  const char* s = std::getenv("TILEOPS_NATIVE_CPU_POOL");
  return s != nullptr && std::strcmp(s, "own") == 0 ? 0 : 1;
}()};

// A team thread that is not running when a region starts (another process holds its core)
// makes the region wait at OpenMP's closing barrier for that thread's next time slice, on
// every call while the machine stays busy: a short kernel then takes a time slice. So after
// a region whose team thread started, or finished, over 1 ms late, and which took over 1 ms
// longer than the caller alone would have, the regions run on the calling thread alone for
// 50 ms (doubling up to 1 s while the regions that try the team again stall too; back to
// 50 ms after one that did not): a busy machine gives us one core anyway, and the caller
// alone never waits for anyone. Not our own pool: its helper would
// share a core with the team's thread, which spins for milliseconds after every torch op,
// and that mixed regime was the least predictable of all (benchmarks/native_latency.py:
// more targets missed with a back-off to our own pool than with none, and the only tail
// misses; docs/performance.md).
constexpr int64_t kStallNs = 1000000;          // a late or preempted team thread
constexpr int64_t kBackoffMinNs = 50000000;    // the caller alone for this long after a stall...
constexpr int64_t kBackoffMaxNs = 1000000000;  // ...doubling up to this
std::atomic<int64_t> g_alone_until{0};
std::atomic<int64_t> g_backoff_ns{kBackoffMinNs};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

struct OmpRegion {
  TaskFn fn;
  void* ctx;
  int64_t n, chunk;
  int chunks;
  const OmpApi* api;
  int64_t posted_ns;
  int64_t caller_done_ns = 0;
  int64_t caller_chunk_ns = 0;  // the caller's mean time per chunk
  int caller_chunks = 0;
  alignas(64) std::atomic<int> next{0};
  alignas(64) std::atomic<bool> late{false};
};

void omp_body(void* p) {
  auto* r = static_cast<OmpRegion*>(p);
  const int index = r->api->thread_num();
  const int64_t start = now_ns();
  if (index != 0 && start - r->posted_ns > kStallNs) r->late.store(true, std::memory_order_relaxed);
  tls_worker_index = index;
  tls_in_region = true;
  int ran = 0;
  for (int c; (c = r->next.fetch_add(1, std::memory_order_relaxed)) < r->chunks; ++ran) {
    const int64_t begin = c * r->chunk;
    r->fn(r->ctx, begin, std::min(r->n, begin + r->chunk));
  }
  if (index == 0) {
    r->caller_done_ns = now_ns();
    r->caller_chunks = ran;
    r->caller_chunk_ns = (r->caller_done_ns - start) / std::max(ran, 1);
  }
  tls_in_region = false;
  tls_worker_index = 0;
}

// Runs the region on torch's team, or on the caller alone after a stall; false when there
// is no team to use (no OpenMP runtime, or our own pool was asked for).
bool try_run_openmp(int64_t n, int64_t chunk, int chunks, int team, TaskFn fn, void* ctx) {
  if (g_use_openmp.load(std::memory_order_relaxed) == 0) return false;
  const OmpApi* api = openmp_runtime();
  if (api == nullptr) return false;
  if (api->in_parallel()) {  // inside someone's OpenMP region: stay on this thread
    fn(ctx, 0, n);
    return true;
  }
  const int64_t posted = now_ns();
  if (posted < g_alone_until.load(std::memory_order_relaxed)) {
    fn(ctx, 0, n);
    g_stats.rounds.fetch_add(1, std::memory_order_relaxed);
    g_stats.chunks.fetch_add(1, std::memory_order_relaxed);  // one piece, on the caller
    g_stats.caller_chunks.fetch_add(1, std::memory_order_relaxed);
    g_stats.alone_after_stall.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  OmpRegion region{fn, ctx, n, chunk, chunks, api, posted};
  api->parallel(omp_body, &region, static_cast<unsigned>(team), 0);  // returns after the team's barrier
  const int64_t done = now_ns();
  const int64_t waited = done - region.caller_done_ns;  // for the others' last chunks
  const bool late =
      region.late.load(std::memory_order_relaxed) || (waited > kStallNs && waited > 4 * region.caller_chunk_ns);
  // ...and only a stall if the region took over 1 ms longer than all its chunks at the
  // caller's pace would have: a team thread that came late to a long region still did
  // its share (backing off then only halved the next 50 ms of large regions).
  if (late && done - posted > static_cast<int64_t>(chunks) * region.caller_chunk_ns + kStallNs) {
    const int64_t backoff = g_backoff_ns.load(std::memory_order_relaxed);
    g_alone_until.store(done + backoff, std::memory_order_relaxed);
    g_backoff_ns.store(std::min(2 * backoff, kBackoffMaxNs), std::memory_order_relaxed);
    g_stats.openmp_stalls.fetch_add(1, std::memory_order_relaxed);
  } else if (g_backoff_ns.load(std::memory_order_relaxed) != kBackoffMinNs) {
    g_backoff_ns.store(kBackoffMinNs, std::memory_order_relaxed);
  }
  g_stats.rounds.fetch_add(1, std::memory_order_relaxed);
  g_stats.chunks.fetch_add(chunks, std::memory_order_relaxed);
  g_stats.caller_chunks.fetch_add(region.caller_chunks, std::memory_order_relaxed);
  g_stats.openmp_rounds.fetch_add(1, std::memory_order_relaxed);
  return true;
}

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
  // several chunks per thread: a thread that starts late (woken from sleep, or preempted on
  // a busy machine) leaves the caller at most one chunk's imbalance at the end instead of
  // a quarter of its share
  const int64_t want = std::min<int64_t>(max_chunks, kChunksPerThread * static_cast<int64_t>(threads));
  const int64_t chunk = (n + want - 1) / want;
  const int chunks = static_cast<int>((n + chunk - 1) / chunk);
  const int team = std::min(threads, chunks);
  if (try_run_openmp(n, chunk, chunks, team, fn, ctx)) return;
  if (!Pool::instance().try_run(n, chunk, chunks, team - 1, fn, ctx)) fn(ctx, 0, n);
}

int worker_index() { return tls_worker_index; }

PoolStats pool_stats() {
  PoolStats s;
  s.rounds = g_stats.rounds.load();
  s.chunks = g_stats.chunks.load();
  s.caller_chunks = g_stats.caller_chunks.load();
  s.openmp_rounds = g_stats.openmp_rounds.load();
  s.openmp_stalls = g_stats.openmp_stalls.load();
  s.alone_after_stall = g_stats.alone_after_stall.load();
  return s;
}

bool set_use_openmp(bool on) {
  g_use_openmp.store(on ? 1 : 0);
  g_alone_until.store(0);
  g_backoff_ns.store(kBackoffMinNs);
  return on && openmp_runtime() != nullptr;
}

bool openmp_available() { return openmp_runtime() != nullptr; }

}  // namespace tnc
