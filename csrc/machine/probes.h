// Machine probes: what this CPU's memory system and vector units sustain, measured with
// small micro-kernels on threads of their own started at once (no scheduling policy of a
// backend's pool can make the ceiling look lower). Behind `tileops profile-machine`, and the
// one implementation native_cpu's _C.probe_* forward to for the benchmarks' ceilings. Plain
// C++ (no Python): the binding in bindings/machine_bindings.cc only maps types.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace tileops::machine {

// A probe this CPU (or this build) cannot run; its text says what is missing.
class Unavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// GB/s of each repeat of one pass over `mib` MiB (on huge pages) split across `threads`
// threads. "read" counts the bytes read; "copy" (ordinary stores) and "copy_stream"
// (streaming stores) count bytes read plus bytes written (as STREAM).
std::vector<double> bandwidth(const std::string& kind, int64_t mib, int threads, int repeats);

// GFLOP/s of each repeat (about `ms` milliseconds) of independent fp32 fused multiply-adds
// on every thread; an FMA counts two FLOP. fp32_fma_isa() names the instructions used; `isa`
// ("avx512f", "avx2+fma" or "scalar") asks for narrower ones, the ceiling of code built for
// them (Unavailable where the CPU lacks them).
std::vector<double> fp32_fma_peak(int threads, int repeats, double ms, const std::string& isa = "");
std::string fp32_fma_isa();

// The same for bfloat16 dot products (vdpbf16ps: 32 products and 32 sums per 16 lanes).
// Throws Unavailable where the CPU has no AVX-512 BF16; bf16_dot_missing() says why
// (empty when available).
std::vector<double> bf16_dot_peak(int threads, int repeats, double ms);
std::string bf16_dot_missing();

}  // namespace tileops::machine
