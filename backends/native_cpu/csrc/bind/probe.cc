// The machine probes' harness (kernels/probe.h): runs a probe kernel on `threads` threads
// of its own, all started at once, and reports each repeat's rate. Its own threads, not
// the kernels' pool: the probe measures the machine, so no scheduling policy of ours can
// make the ceiling look lower than it is.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "bind/kernel.h"
#include "kernels/probe_args.h"
#include "output_cache.h"

namespace tnc {
namespace {

// 2 MiB aligned with huge pages advised, like the outputs (output_cache.h): with 4 KiB
// pages the streaming copy measured ~44 GB/s here, with huge pages ~52, and the probes are
// the ceiling the benchmarks hold the kernels to.
struct Buffer {
  OutputBlock block;
  explicit Buffer(int64_t floats) {
    block = map_huge_block(static_cast<size_t>(floats) * sizeof(float));
    if (block.data == nullptr) throw std::bad_alloc();
    float* p = get();
    for (int64_t i = 0; i < floats; ++i) p[i] = static_cast<float>(i & 1023);  // faulted in before any timing
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { unmap_block(block); }
  float* get() const { return static_cast<float*>(block.data); }
};

// Seconds per repeat of fn(args of thread t) run on every thread at once.
std::vector<double> run_on_threads(int threads, int repeats, const std::function<void(int)>& fn) {
  std::vector<double> seconds(static_cast<size_t>(repeats));
  std::barrier sync(threads);
  auto body = [&](int t) {
    for (int r = 0; r < repeats; ++r) {
      sync.arrive_and_wait();
      const auto t0 = std::chrono::steady_clock::now();
      fn(t);
      sync.arrive_and_wait();
      if (t == 0) seconds[static_cast<size_t>(r)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(body, t);
  body(0);
  for (auto& h : helpers) h.join();
  return seconds;
}

int check_threads(int threads) {
  if (threads < 1 || threads > 256) throw nb::value_error("probe: threads must be in [1, 256]");
  return threads;
}

// GB/s of each repeat: `kind` is "read" (bytes read), "copy" or "copy_stream" (bytes read
// + bytes written, as STREAM counts them).
std::vector<double> probe_bandwidth(const std::string& kind, int64_t mib, int threads, int repeats) {
  check_threads(threads);
  if (mib < 1 || repeats < 1) throw nb::value_error("probe_bandwidth: mib and repeats must be >= 1");
  const auto fn = require_kernel<ProbeArgs>(("probe_" + kind).c_str(), DType::f32);
  const bool copies = kind != "read";
  const int64_t floats = mib * (int64_t{1} << 20) / static_cast<int64_t>(sizeof(float));
  Buffer src(floats);
  std::unique_ptr<Buffer> dst = copies ? std::make_unique<Buffer>(floats) : nullptr;
  std::vector<float> sink(static_cast<size_t>(threads) * 16);
  const int64_t share = (floats / threads) & ~int64_t{255};
  std::vector<double> seconds;
  {
    nb::gil_scoped_release release;
    seconds = run_on_threads(threads, repeats, [&](int t) {
      ProbeArgs a{src.get(), dst ? dst->get() : nullptr, t * share, t + 1 == threads ? floats : (t + 1) * share, 0, &sink[static_cast<size_t>(t) * 16]};
      fn(a, 1);
    });
  }
  const double bytes = static_cast<double>(floats) * sizeof(float) * (copies ? 2 : 1);
  std::vector<double> rates;
  for (double s : seconds) rates.push_back(bytes / s / 1e9);
  return rates;
}

// GFLOP/s of each repeat of `ms` milliseconds of the bfloat16 GEMM's products on every
// thread: vdpbf16ps on AVX-512 BF16, float FMAs elsewhere (kernels/probe.h).
std::vector<double> probe_bf16_peak(int threads, int repeats, double ms) {
  check_threads(threads);
  const auto fn = require_kernel<ProbeArgs>("probe_bf16_dot", DType::bf16);
  std::vector<float> sink(static_cast<size_t>(threads) * 16);
  // size the trips from one short single-thread run: about `ms` per repeat
  ProbeArgs calib{nullptr, nullptr, 0, 0, 20000, sink.data()};
  const auto t0 = std::chrono::steady_clock::now();
  fn(calib, 1);
  const double per_trip = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 20000;
  const int64_t trips = std::max<int64_t>(1000, static_cast<int64_t>(ms * 1e-3 / std::max(per_trip, 1e-12)));
  std::vector<double> seconds;
  {
    nb::gil_scoped_release release;
    seconds = run_on_threads(threads, repeats, [&](int t) {
      ProbeArgs a{nullptr, nullptr, 0, 0, trips, &sink[static_cast<size_t>(t) * 16]};
      fn(a, 1);
    });
  }
  const double flop = static_cast<double>(trips) * kProbeBf16DotFlopPerTrip * threads;
  std::vector<double> rates;
  for (double s : seconds) rates.push_back(flop / s / 1e9);
  return rates;
}

}  // namespace

void bind_probe(nb::module_& m) {
  m.def("probe_bandwidth", &probe_bandwidth, nb::arg("kind"), nb::arg("mib"), nb::arg("threads"), nb::arg("repeats"),
        "GB/s of each repeat of a 'read', 'copy' or 'copy_stream' pass over `mib` MiB on `threads` threads");
  m.def("probe_bf16_peak", &probe_bf16_peak, nb::arg("threads"), nb::arg("repeats"), nb::arg("ms") = 50.0,
        "GFLOP/s of each repeat of the bfloat16 GEMM's product throughput on `threads` threads (vdpbf16ps on "
        "AVX-512 BF16, float FMAs on other builds)");
}

}  // namespace tnc
