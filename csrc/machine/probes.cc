// See probes.h. Each kernel is compiled for its instruction set with a target attribute
// and chosen at run time, so one build runs on any x86-64 and reports what it lacks.
#include "machine/probes.h"

#include <algorithm>
#include <array>
#include <barrier>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <utility>

#include <sys/mman.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tileops::machine {
namespace {

using Clock = std::chrono::steady_clock;

// Seconds of each repeat of fn(thread) run on every thread at once (timed by thread 0
// between two barriers, so the slowest thread sets the time).
std::vector<double> run_on_threads(int threads, int repeats, const std::function<void(int)>& fn) {
  std::vector<double> seconds(static_cast<size_t>(repeats));
  std::barrier sync(threads);
  auto body = [&](int t) {
    for (int r = 0; r < repeats; ++r) {
      sync.arrive_and_wait();
      const auto start = Clock::now();
      fn(t);
      sync.arrive_and_wait();
      if (t == 0) {
        seconds[static_cast<size_t>(r)] = std::chrono::duration<double>(Clock::now() - start).count();
      }
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(body, t);
  body(0);
  for (auto& helper : helpers) helper.join();
  return seconds;
}

void check_threads(int threads, int repeats) {
  if (threads < 1 || threads > 1024) {
    throw std::invalid_argument("probe: threads must be in [1, 1024], got " + std::to_string(threads));
  }
  if (repeats < 1) {
    throw std::invalid_argument("probe: repeats must be >= 1, got " + std::to_string(repeats));
  }
}

constexpr size_t kHugePage = size_t{2} << 20;

// A buffer on 2 MiB aligned memory with huge pages advised: what the kernels held to these
// figures stream lives there (native_cpu's large outputs, tileops.serving's huge-page
// tensors), and on 4 KiB pages the TLB misses would read as a lower ceiling.
class Buffer {
 public:
  explicit Buffer(int64_t floats)
      : bytes_((static_cast<size_t>(floats) * sizeof(float) + kHugePage - 1) & ~(kHugePage - 1)) {
    // over-map by a huge page and cut to an aligned run, so all of it can be huge pages
    const size_t span = bytes_ + kHugePage;
    void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    const auto start = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (start + kHugePage - 1) & ~(kHugePage - 1);
    const uintptr_t end = start + span, used = aligned + bytes_;
    if (aligned > start) munmap(raw, aligned - start);
    if (end > used) munmap(reinterpret_cast<void*>(used), end - used);
    data_ = reinterpret_cast<float*>(aligned);
#if defined(MADV_HUGEPAGE)
    madvise(data_, bytes_, MADV_HUGEPAGE);
#endif
    for (int64_t i = 0; i < floats; ++i) data_[i] = static_cast<float>(i & 1023);  // fault in
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { munmap(data_, bytes_); }
  float* get() const { return data_; }

 private:
  size_t bytes_;
  float* data_ = nullptr;
};

// ---- bandwidth --------------------------------------------------------------------------
// The read sums into 64 floats, which each clone keeps in several vector registers, so a
// core's loads never wait on its own adds (one accumulator chain held a core below what
// memory delivers). The streaming copy writes each line without reading it first, as
// kernels write large results; its store is an instruction of each width. Spans start
// 64-byte aligned and hold whole 1 KiB runs (bandwidth()).

__attribute__((target_clones("avx512f", "avx2", "default"))) float read_span(const float* src, int64_t n) {
  float acc[64] = {};
  for (int64_t i = 0; i < n; i += 64) {
#pragma GCC unroll 64
    for (int u = 0; u < 64; ++u) acc[u] += src[i + u];
  }
  float total = 0;
  for (float a : acc) total += a;
  return total;
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void copy_span(const float* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

using CopySpan = void (*)(const float*, float*, int64_t);

#if defined(__x86_64__)
__attribute__((target("avx512f"))) void stream_avx512(const float* src, float* dst, int64_t n) {
#pragma GCC unroll 4
  for (int64_t i = 0; i < n; i += 16) _mm512_stream_ps(dst + i, _mm512_load_ps(src + i));
  _mm_sfence();
}

__attribute__((target("avx2"))) void stream_avx2(const float* src, float* dst, int64_t n) {
#pragma GCC unroll 4
  for (int64_t i = 0; i < n; i += 8) _mm256_stream_ps(dst + i, _mm256_load_ps(src + i));
  _mm_sfence();
}

void stream_sse(const float* src, float* dst, int64_t n) {  // every x86-64 has SSE
#pragma GCC unroll 4
  for (int64_t i = 0; i < n; i += 4) _mm_stream_ps(dst + i, _mm_load_ps(src + i));
  _mm_sfence();
}
#endif

CopySpan stream_span() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return stream_avx512;
  if (__builtin_cpu_supports("avx2")) return stream_avx2;
  return stream_sse;
#else
  return copy_span;  // no streaming store: the ordinary copy
#endif
}

// ---- compute: independent accumulator chains, enough to hide the FMA latency ----------

constexpr int kChains = 16;
// AVX2 has 16 vector registers: 16 chains and the two operands left three chains on the
// stack, each trip a store and a reload in their dependency chains.
constexpr int kChainsAvx2 = 12;

#if defined(__x86_64__)
// Every lane of every chain, summed: the result the compiler must not drop.
__attribute__((target("avx512f"))) float sum_chains(const __m512 (&acc)[kChains]) {
  __m512 s = _mm512_setzero_ps();
  for (const auto& a : acc) s = _mm512_add_ps(s, a);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  float total = 0;
  for (float v : lanes) total += v;
  return total;
}

__attribute__((target("avx2,fma"))) float sum_chains(const __m256 (&acc)[kChainsAvx2]) {
  __m256 s = _mm256_setzero_ps();
  for (const auto& a : acc) s = _mm256_add_ps(s, a);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  float total = 0;
  for (float v : lanes) total += v;
  return total;
}

__attribute__((target("avx512f"))) float fma_avx512(int64_t trips) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < trips; ++it) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], x, y);
  }
  return sum_chains(acc);
}

__attribute__((target("avx2,fma"))) float fma_avx2(int64_t trips) {
  __m256 acc[kChainsAvx2];
  for (int c = 0; c < kChainsAvx2; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c));
  const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < trips; ++it) {
#pragma GCC unroll 16
    for (int c = 0; c < kChainsAvx2; ++c) acc[c] = _mm256_fmadd_ps(acc[c], x, y);
  }
  return sum_chains(acc);
}

__attribute__((target("avx512f,avx512bf16"))) float bf16_dot_avx512(int64_t trips) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f803f80));  // (1, 1)
  const __m512bh y = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x34003400));  // tiny
  for (int64_t it = 0; it < trips; ++it) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], x, y);
  }
  return sum_chains(acc);
}
#endif

float fma_scalar(int64_t trips) {
  std::array<float, kChains> acc;
  for (int c = 0; c < kChains; ++c) acc[c] = static_cast<float>(c);
  for (int64_t it = 0; it < trips; ++it) {
    for (auto& a : acc) a = a * 0.999f + 1e-7f;
  }
  float total = 0;
  for (float a : acc) total += a;
  return total;
}

struct ComputeKernel {
  float (*fn)(int64_t);
  double flop_per_trip;
};

struct Fp32Kernel {
  const char* isa;  // as fp32_fma_isa() names it
  ComputeKernel kernel;
};

// The fp32 FMA kernels this CPU runs, widest first.
std::vector<Fp32Kernel> fp32_kernels() {
  std::vector<Fp32Kernel> kernels;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) {
    kernels.push_back({"avx512f", {fma_avx512, kChains * 16 * 2.0}});
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    kernels.push_back({"avx2+fma", {fma_avx2, kChainsAvx2 * 8 * 2.0}});
  }
#endif
  kernels.push_back({"scalar", {fma_scalar, kChains * 2.0}});
  return kernels;
}

// GFLOP/s per repeat: trips sized from one short single-thread run to about `ms` each.
std::vector<double> compute_peak(const ComputeKernel& kernel, int threads, int repeats, double ms) {
  check_threads(threads, repeats);
  if (!(ms > 0)) throw std::invalid_argument("probe: ms must be > 0");
  std::vector<float> sink(static_cast<size_t>(threads) * 16);
  const int64_t calibration = 20000;
  const auto start = Clock::now();
  sink[0] += kernel.fn(calibration);
  const double per_trip =
      std::chrono::duration<double>(Clock::now() - start).count() / static_cast<double>(calibration);
  const auto trips = std::max<int64_t>(1000, static_cast<int64_t>(ms * 1e-3 / std::max(per_trip, 1e-12)));
  const auto seconds =
      run_on_threads(threads, repeats, [&](int t) { sink[static_cast<size_t>(t) * 16] += kernel.fn(trips); });
  const double flop = static_cast<double>(trips) * kernel.flop_per_trip * threads;
  std::vector<double> rates;
  for (double s : seconds) rates.push_back(flop / s / 1e9);
  return rates;
}

}  // namespace

std::vector<double> bandwidth(const std::string& kind, int64_t mib, int threads, int repeats) {
  check_threads(threads, repeats);
  const bool copies = kind == "copy" || kind == "copy_stream";
  if (!copies && kind != "read") {
    throw std::invalid_argument("bandwidth probe: kind must be 'read', 'copy' or 'copy_stream', got '" + kind + "'");
  }
  if (mib < 1) throw std::invalid_argument("bandwidth probe: mib must be >= 1");
  const CopySpan copy = kind == "copy_stream" ? stream_span() : copy_span;
  const int64_t floats = mib * (int64_t{1} << 20) / static_cast<int64_t>(sizeof(float));
  Buffer src(floats);
  std::unique_ptr<Buffer> dst = copies ? std::make_unique<Buffer>(floats) : nullptr;
  std::vector<float> sink(static_cast<size_t>(threads) * 16);
  // whole 1 KiB runs per thread (the kernels' unit; mib MiB are whole runs too), each
  // starting 64-byte aligned
  const int64_t share = (floats / threads) & ~int64_t{255};
  const auto seconds = run_on_threads(threads, repeats, [&](int t) {
    const int64_t begin = t * share, end = t + 1 == threads ? floats : (t + 1) * share;
    if (copies) {
      copy(src.get() + begin, dst->get() + begin, end - begin);
    } else {
      sink[static_cast<size_t>(t) * 16] += read_span(src.get() + begin, end - begin);
    }
  });
  const double bytes = static_cast<double>(floats) * sizeof(float) * (copies ? 2 : 1);
  std::vector<double> rates;
  for (double s : seconds) rates.push_back(bytes / s / 1e9);
  return rates;
}

std::vector<double> fp32_fma_peak(int threads, int repeats, double ms, const std::string& isa) {
  const std::vector<Fp32Kernel> kernels = fp32_kernels();
  if (isa.empty()) return compute_peak(kernels.front().kernel, threads, repeats, ms);
  for (const Fp32Kernel& k : kernels) {
    if (isa == k.isa) return compute_peak(k.kernel, threads, repeats, ms);
  }
  if (isa == "avx512f" || isa == "avx2+fma") {
    throw Unavailable("this CPU cannot run the " + isa + " fp32 FMA probe");
  }
  throw std::invalid_argument("fp32 FMA probe: isa must be '', 'avx512f', 'avx2+fma' or 'scalar', got '" + isa + "'");
}

std::string fp32_fma_isa() { return fp32_kernels().front().isa; }

std::string bf16_dot_missing() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16")) return "";
  return "this CPU has no AVX-512 BF16 (vdpbf16ps)";
#else
  return "bf16 dot products are probed on x86-64 (AVX-512 BF16) only";
#endif
}

std::vector<double> bf16_dot_peak(int threads, int repeats, double ms) {
  const std::string missing = bf16_dot_missing();
  if (!missing.empty()) throw Unavailable(missing);
#if defined(__x86_64__)
  return compute_peak({bf16_dot_avx512, kChains * 64.0}, threads, repeats, ms);
#else
  return {};
#endif
}

}  // namespace tileops::machine
