// 8 float lanes, AVX2 + FMA + F16C.
#pragma once
// Included inside a per-ISA namespace: the translation unit includes the system headers.

struct Simd {
  using F = __m256;
  static constexpr int W = 8;
  static constexpr int kGemmMR = 6;  // 6x16 micro-tile: 12 accumulators of 16 registers
  static constexpr int kRegisters = 16;  // vector registers: what register blocks are sized by
  static constexpr const char* kName = "avx2";

  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float a) { return _mm256_set1_ps(a); }

  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static F load(const tnc::bf16_t* p) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  }
  static F load(const tnc::half_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

  template <class T>
  static F load_n(const T* p, int n, float fill = 0.f) {
    alignas(32) float buf[8];
    for (int i = 0; i < 8; ++i) buf[i] = i < n ? tnc::to_float(p[i]) : fill;
    return _mm256_load_ps(buf);
  }

  // Each lane's bfloat16, rounded to nearest even on the bit pattern, in its high 16 bits
  // (the low 16 are not zeroed); NaN keeps a quiet payload.
  static __m256i bf16_in_high_half(F v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
    const __m256 is_nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    const __m256i nan = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
    return _mm256_blendv_epi8(r, nan, _mm256_castps_si256(is_nan));
  }
  static __m128i to_bf16(F v) {
    const __m256i r = _mm256_srli_epi32(bf16_in_high_half(v), 16);
    const __m256i packed = _mm256_packus_epi32(r, r);  // lanes 0..3 | 0..3 , 4..7 | 4..7
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
  }
  static __m128i to_f16(F v) { return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void store(tnc::bf16_t* p, F v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bf16(v)); }
  static void store(tnc::half_t* p, F v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_f16(v)); }
  template <class T>
  static void store_n(T* p, F v, int n) {
    alignas(32) T buf[8];
    store(buf, v);
    std::memcpy(p, buf, sizeof(T) * static_cast<size_t>(n));
  }

  // 2W bfloat16 at once, without the cross-lane widening of load(): the even elements widen
  // by a shift, the odd ones by a mask, and store_pair puts each pair back into one 32-bit
  // word (no pack or permute). Lane order: even elements in `even`, odd ones in `odd`; see
  // load_pair in kernels/common.h. (A bfloat16 GEMV streams faster from the L2 this way.)
  static void load_pair(const tnc::bf16_t* p, F& even, F& odd) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    // One load: otherwise GCC folds a second load of p into the mask's vpand. A decode
    // GEMV runs short of load slots on cores with two 128-bit loads a cycle (Zen 1), since
    // it also loads two vectors of A per weight vector, so a second load of each weight
    // vector costs it time.
    __asm__("" : "+x"(v));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  static void store_pair(tnc::bf16_t* p, F even, F odd) {
    const __m256i lo = _mm256_srli_epi32(bf16_in_high_half(even), 16);
    const __m256i hi = _mm256_and_si256(bf16_in_high_half(odd), _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_or_si256(lo, hi));
  }
  static void stream_pair(tnc::bf16_t* p, F even, F odd) { store_pair(p, even, odd); }  // (kHasStream: none)

  static constexpr bool kHasStream = false;
  // Bytes ahead that a row read once from memory (a decode GEMV's weight row,
  // kernels/gemm_skinny.h) is prefetched, non-temporally; 0 leaves it to the hardware
  // prefetcher. 1 KiB did best of the distances tried on a Zen (family 17h) VM without
  // AVX-512, and prefetchnta better than prefetcht0 (docs/performance.md).
  static constexpr int kRowAheadBytes = 1024;
  template <class T>
  static void stream(T* p, F v) {
    store(p, v);
  }
  static void stream_fence() {}

  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }
  // max that propagates NaN from either operand (as torch.amax does)
  static F max_nan(F a, F v) { return _mm256_blendv_ps(_mm256_max_ps(v, a), v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q)); }
  static F abs(F a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), a); }
  static F copysign(F magnitude, F sign) {
    return _mm256_or_ps(abs(magnitude), _mm256_and_ps(sign, _mm256_set1_ps(-0.f)));
  }
  static float reduce_add(F a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // lane i of the result = the sum of the lanes of v[i]
  static F transpose_add(const F* v) {
    F t[4], u[2];
    for (int i = 0; i < 4; ++i)
      t[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 2; ++i) {
      const __m256d a = _mm256_castps_pd(t[2 * i]), b = _mm256_castps_pd(t[2 * i + 1]);
      u[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
  }
  static float reduce_max(F a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static F round(F a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // 1/a from the 12-bit estimate and one Newton step (finite nonzero a)
  static F rcp(F a) {
    const F r = _mm256_rcp_ps(a);
    return _mm256_mul_ps(r, _mm256_fnmadd_ps(a, r, _mm256_set1_ps(2.f)));
  }
  static F rcp_estimate(F a) { return rcp(a); }
  static constexpr bool kHasScalef = false;
  static F scalef(F p, F) { return p; }
  static F pow2n(F n) {
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_castsi256_ps(e);
  }
  static F keep_at_least(F x, float threshold, F v) {
    return _mm256_and_ps(_mm256_cmp_ps(x, set1(threshold), _CMP_GE_OQ), v);
  }
  // Lane pairs (2j, 2j+1): swapped; lane j of the low / high half to lanes 2j and 2j+1;
  // a * b - c in even lanes, a * b + c in odd ones.
  static F swap_pairs(F a) { return _mm256_permute_ps(a, _MM_SHUFFLE(2, 3, 0, 1)); }
  static F dup_pairs_lo(F a) { return _mm256_permutevar8x32_ps(a, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)); }
  static F dup_pairs_hi(F a) { return _mm256_permutevar8x32_ps(a, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7)); }
  static F fmaddsub(F a, F b, F c) { return _mm256_fmaddsub_ps(a, b, c); }
};
