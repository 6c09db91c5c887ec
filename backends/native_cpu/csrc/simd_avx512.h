// 16 float lanes, AVX-512 F/BW/VL (+BF16 for the float→bfloat16 store).
#pragma once
// Included inside a per-ISA namespace: the translation unit includes the system headers.

struct Simd {
  using F = __m512;
  static constexpr int W = 16;
  static constexpr int kGemmMR = 12;  // 12x32 micro-tile: 24 accumulators of 32 registers
  static constexpr int kRegisters = 32;
  static constexpr const char* kName = "avx512";

  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float a) { return _mm512_set1_ps(a); }
  static __mmask16 mask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }

  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F load(const tnc::bf16_t* p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  }
  static F load(const tnc::half_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }

  static F load_n(const float* p, int n, float fill = 0.f) { return _mm512_mask_loadu_ps(set1(fill), mask(n), p); }
  static F load_n(const tnc::bf16_t* p, int n, float fill = 0.f) {
    const __m512 v =
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask(n), p)), 16));
    return _mm512_mask_blend_ps(mask(n), set1(fill), v);
  }
  static F load_n(const tnc::half_t* p, int n, float fill = 0.f) {
    const __m512 v = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask(n), p));
    return _mm512_mask_blend_ps(mask(n), set1(fill), v);
  }

  static __m256i to_bf16(F v) { return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)); }
  static __m256i to_f16(F v) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void store(tnc::bf16_t* p, F v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16(v)); }
  static void store(tnc::half_t* p, F v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_f16(v)); }
  static void store_n(float* p, F v, int n) { _mm512_mask_storeu_ps(p, mask(n), v); }
  static void store_n(tnc::bf16_t* p, F v, int n) { _mm256_mask_storeu_epi16(p, mask(n), to_bf16(v)); }
  static void store_n(tnc::half_t* p, F v, int n) { _mm256_mask_storeu_epi16(p, mask(n), to_f16(v)); }

  // streaming (non-temporal) stores of one vector; p aligned to W * sizeof(T)
  static constexpr bool kHasStream = true;
  // kRowAheadBytes: see simd_avx2.h. None here: on a Zen 4, prefetchnta on the weight rows
  // of the bfloat16 GEMVs (kernels/gemm_avx512_bf16_nt.h, which prefetch into the L2
  // themselves) slowed a decode step (docs/performance.md).
  static constexpr int kRowAheadBytes = 0;
  static void stream(float* p, F v) { _mm512_stream_ps(p, v); }
  static void stream(tnc::bf16_t* p, F v) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), to_bf16(v)); }
  static void stream(tnc::half_t* p, F v) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), to_f16(v)); }
  static void stream_fence() { _mm_sfence(); }

  // 2W bfloat16 at once, without the cross-lane widening of load(): the even elements widen
  // by a shift, the odd ones by a mask; store_pair packs both with one vcvtne2ps2bf16 and
  // re-interleaves them with one vpermw. (Faster than W at a time on L1-resident rows,
  // which wait on the cross-lane widening and narrowing.) Lane order: even elements in
  // `even`, odd ones in `odd`; see load_pair in kernels/common.h.
  static void load_pair(const tnc::bf16_t* p, F& even, F& odd) {
    __m512i v = _mm512_loadu_si512(p);
    __asm__("" : "+v"(v));  // one load, not two: see load_pair in simd_avx2.h
    even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  static __m512i pack_pair(F even, F odd) {
    const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(inter, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(odd, even)));
  }
  static void store_pair(tnc::bf16_t* p, F even, F odd) { _mm512_storeu_si512(p, pack_pair(even, odd)); }
  static void stream_pair(tnc::bf16_t* p, F even, F odd) {  // p 64-byte aligned
    _mm512_stream_si512(reinterpret_cast<__m512i*>(p), pack_pair(even, odd));
  }

  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  // max that propagates NaN from either operand (as torch.amax does)
  static F max_nan(F a, F v) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_max_ps(v, a), v);
  }
  static F abs(F a) { return _mm512_abs_ps(a); }
  static F copysign(F magnitude, F sign) {
    const __m512i s = _mm512_and_si512(_mm512_castps_si512(sign), _mm512_set1_epi32(static_cast<int>(0x80000000u)));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(abs(magnitude)), s));
  }
  static float reduce_add(F a) { return _mm512_reduce_add_ps(a); }
  // lane i of the result = the sum of the lanes of v[i] (16 dot products finished at once)
  static F transpose_add(const F* v) {
    F t[8], u[4], w[2];
    for (int i = 0; i < 8; ++i)
      t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; ++i) {
      const __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
      u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    for (int i = 0; i < 2; ++i)
      w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  static float reduce_max(F a) { return _mm512_reduce_max_ps(a); }
  static F round(F a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // 1/a from the 14-bit estimate and one Newton step (about 1 ulp; finite nonzero a)
  static F rcp(F a) {
    const F r = _mm512_rcp14_ps(a);
    return _mm512_mul_ps(r, _mm512_fnmadd_ps(a, r, _mm512_set1_ps(2.f)));
  }
  // p * 2^n for integral n, with correct overflow, underflow and subnormals
  static F rcp_estimate(F a) { return _mm512_rcp14_ps(a); }
  static constexpr bool kHasScalef = true;
  static F scalef(F p, F n) { return _mm512_scalef_ps(p, n); }
  // 2^n for integral n in [-126, 127]
  static F pow2n(F n) {
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_castsi512_ps(e);
  }
  // v where x >= threshold, else 0
  static F keep_at_least(F x, float threshold, F v) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, set1(threshold), _CMP_GE_OQ), v);
  }
  // Lane pairs (2j, 2j+1): swapped; lane j of the low / high half to lanes 2j and 2j+1;
  // a * b - c in even lanes, a * b + c in odd ones.
  static F swap_pairs(F a) { return _mm512_permute_ps(a, _MM_SHUFFLE(2, 3, 0, 1)); }
  static F dup_pairs_lo(F a) {
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), a);
  }
  static F dup_pairs_hi(F a) {
    return _mm512_permutexvar_ps(_mm512_setr_epi32(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15), a);
  }
  static F fmaddsub(F a, F b, F c) { return _mm512_fmaddsub_ps(a, b, c); }
};

// In-register transpose of a 16x16 matrix of 32-bit words: v[r] lane c -> v[c] lane r
// (the bfloat16 GEMM's and prefill attention's packing of K pairs).
inline void transpose16x16_epi32(__m512i v[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // v[4i + c], 128-bit lane L: rows 4i..4i+3 of column 4L + c
    v[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
    v[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
    v[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    v[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i u0 = _mm512_shuffle_i32x4(v[c], v[4 + c], 0x88), u1 = _mm512_shuffle_i32x4(v[c], v[4 + c], 0xdd);
    const __m512i u2 = _mm512_shuffle_i32x4(v[8 + c], v[12 + c], 0x88),
                  u3 = _mm512_shuffle_i32x4(v[8 + c], v[12 + c], 0xdd);
    t[c] = _mm512_shuffle_i32x4(u0, u2, 0x88);
    t[8 + c] = _mm512_shuffle_i32x4(u0, u2, 0xdd);
    t[4 + c] = _mm512_shuffle_i32x4(u1, u3, 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(u1, u3, 0xdd);
  }
  for (int i = 0; i < 16; ++i) v[i] = t[i];
}
