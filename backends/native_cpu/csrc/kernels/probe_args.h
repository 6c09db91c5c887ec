// What the machine probes' harness (bind/probe.cc) hands the probe kernels
// (kernels/probe.h, kernels/probe_avx512_bf16.h). A probe kernel runs on one thread over
// its share; the harness starts every thread's share at once and times the slowest.
#pragma once

#include <cstdint>

namespace tnc {

struct ProbeArgs {
  const float* src;    // bandwidth probes: [begin, end) of src (and of dst for copies)
  float* dst;
  int64_t begin, end;
  int64_t iterations;  // compute probes: loop trips
  float* sink;         // one float per thread that keeps the loads and products live
};

// probe_bf16_dot: every build's loop trip is kProbeBf16DotFlopPerTrip flops. AVX-512 BF16:
// 24 independent accumulators (enough to hide vdpbf16ps's latency, so issue rate alone
// bounds the loop); one vdpbf16ps on 16 lanes is 32 products and 32 sums. Elsewhere the
// float FMAs the bfloat16 GEMM widens its operands into (kernels/probe.h).
inline constexpr int kProbeBf16DotChains = 24;
inline constexpr int64_t kProbeBf16DotFlopPerTrip = kProbeBf16DotChains * 64;

}  // namespace tnc
