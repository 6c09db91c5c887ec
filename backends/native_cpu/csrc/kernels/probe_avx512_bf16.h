// The bfloat16 compute ceiling: vdpbf16ps throughput, the instruction the bfloat16 GEMM
// micro-kernels are made of (kernels/gemm_avx512_bf16*.h); see kProbeBf16DotChains.
#pragma once

#if !defined(__AVX512BF16__)
#error "kernels/probe_avx512_bf16.h needs -mavx512bf16 (isa_avx512.cc only)"
#endif

inline void probe_bf16_dot(const tnc::ProbeArgs& a, int) {
  static_assert(tnc::kProbeBf16DotChains == 24, "the loop below names 24 accumulators");
  const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f803f80));  // (1, 1)
  const __m512bh y = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3c003c00));  // (2^-7, 2^-7)
  // named variables, not an array: an array of accumulators is kept in memory by GCC, and
  // the loop then measures loads and stores
#define TNC_PROBE_ACC(i) __m512 c##i = _mm512_set1_ps(static_cast<float>(i));
#define TNC_PROBE_DOT(i) c##i = _mm512_dpbf16_ps(c##i, x, y);
#define TNC_PROBE_SUM(i) s = _mm512_add_ps(s, c##i);
#define TNC_PROBE_24(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) \
  M(12) M(13) M(14) M(15) M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23)
  TNC_PROBE_24(TNC_PROBE_ACC)
  for (int64_t it = 0; it < a.iterations; ++it) {
    TNC_PROBE_24(TNC_PROBE_DOT)
  }
  __m512 s = _mm512_setzero_ps();
  TNC_PROBE_24(TNC_PROBE_SUM)
#undef TNC_PROBE_24
#undef TNC_PROBE_SUM
#undef TNC_PROBE_DOT
#undef TNC_PROBE_ACC
  *a.sink += _mm512_reduce_add_ps(s);
}

inline void register_probe_avx512_bf16(tnc::KernelTable& t) {
  t.replace<tnc::ProbeArgs>("probe_bf16_dot", tnc::DType::bf16, probe_bf16_dot);
}
