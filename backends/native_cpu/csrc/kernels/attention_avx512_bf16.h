// The attention family's code for AVX-512 BF16 (vdpbf16ps): decode and prefill scores
// straight from the bfloat16 query and cache. Included by isa_avx512.cc inside its
// namespace after kernels/families.h; register_attention_avx512_bf16 replaces the bfloat16
// decode and prefill kernels.
#pragma once
// (no includes here on purpose: see kernels/common.h)

#if !defined(__AVX512BF16__)
#error "kernels/attention_avx512_bf16.h needs -mavx512bf16 (isa_avx512.cc only)"
#endif

// Decode scores for bfloat16 on AVX512-BF16: q (unscaled, exact in bf16) and K rows are
// both D-contiguous bf16, so vdpbf16ps takes 32 products per instruction with no widening.
// acc[jj][i] gets the 16-lane partial dot product of key jj and head i.
inline void decode_scores_bf16(const uint16_t* const qr[4], const uint16_t* const kr[4], int64_t D, __m512 acc[4][4]) {
#pragma GCC unroll 4
  for (int jj = 0; jj < 4; ++jj)
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) acc[jj][i] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 32) {
    const __mmask32 mk = D - d >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << (D - d)) - 1);
    __m512bh qv[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) qv[i] = (__m512bh)_mm512_loadu_si512(qr[i] + d);  // zero-padded
#pragma GCC unroll 4
    for (int jj = 0; jj < 4; ++jj) {
      const __m512bh kv = (__m512bh)_mm512_maskz_loadu_epi16(mk, kr[jj] + d);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) acc[jj][i] = _mm512_dpbf16_ps(acc[jj][i], qv[i], kv);
    }
  }
}

// attention_decode's Scores for bfloat16 (see FloatDecodeScores): the query rows are kept
// unscaled (exact in bf16), zero-padded to whole vectors of 32.
struct Avx512Bf16DecodeScores {
  static constexpr bool kOwnQuery = true;
  struct Query {
    uint16_t* rows;  // [H][stride]
    int64_t stride;
  };
  static Query alloc_query(int64_t heads, int64_t head_dim) {
    const int64_t stride = (head_dim + 31) / 32 * 32;
    return {reinterpret_cast<uint16_t*>(scratch(static_cast<size_t>(heads * stride / 2 + 16), 1)), stride};
  }
  template <class T>
  static void load_query(const Query& q, int64_t h, const T* src, int64_t D) {
    for (int64_t d = 0; d < q.stride; ++d)
      q.rows[h * q.stride + d] = d < D ? reinterpret_cast<const uint16_t*>(src)[d] : uint16_t{0};
  }
  // acc[jj][i]: key kr[jj] with query head first_head + i (heads past `heads` repeat the last)
  template <class T>
  static void block(const Query& q, int64_t first_head, int heads, const T* const kr[4], int64_t D, F acc[4][4]) {
    const uint16_t* qb[4];
    const uint16_t* kb[4];
    for (int i = 0; i < 4; ++i) qb[i] = q.rows + (first_head + std::min(i, heads - 1)) * q.stride;
    for (int jj = 0; jj < 4; ++jj) kb[jj] = reinterpret_cast<const uint16_t*>(kr[jj]);
    decode_scores_bf16(qb, kb, D, acc);
  }
};

// attention's Scores for bfloat16 (see FloatPrefillScores): the query rows stay unscaled
// bf16 (in the float rows' storage) and the key block is kept as channel pairs,
// Kp[D / 2][kAttnBK] of 32 bits (two consecutive channels of one key), so one vdpbf16ps
// takes a channel pair of W keys against one query row's pair, broadcast: half the
// instructions of the float dot products, and a repack of 32-bit words instead of a
// widening transpose. Products are exact in float either way.
struct Avx512Bf16PrefillScores {
  static constexpr bool kScaled = false;
  static int64_t key_floats(int64_t D) { return (D + 1) / 2 * kAttnBK; }
  template <class T>
  static void load_query(float* row, const T* src, int64_t D, int64_t Dp, float) {
    auto* dst = reinterpret_cast<uint16_t*>(row);
    const auto* from = reinterpret_cast<const uint16_t*>(src);
    for (int64_t d = 0; d < Dp; ++d) dst[d] = d < D ? from[d] : uint16_t{0};  // Dp > D when D is odd
  }
  template <class T>
  static void load_key(float* Kt, int64_t j, const T* ks, int64_t D) {  // ks null: a dead key
    auto* kp = reinterpret_cast<uint32_t*>(Kt);
    const auto* from = reinterpret_cast<const uint16_t*>(ks);
    for (int64_t p = 0; p < (D + 1) / 2; ++p) {
      const uint32_t lo = ks ? from[2 * p] : 0u, hi = ks && 2 * p + 1 < D ? from[2 * p + 1] : 0u;
      kp[p * kAttnBK + j] = lo | hi << 16;
    }
  }
  // the value block as key pairs, Vp[kAttnBK / 2][Dp] of 32 bits: keys 2 jp and 2 jp + 1 of
  // channel d in the low and high halves
  static int64_t value_floats(int64_t Dp) { return kAttnBK / 2 * Dp; }
  template <class T>
  static void load_values(float* V, const T* const vs[kAttnBK], int64_t D, int64_t Dp) {
    auto* vp = reinterpret_cast<uint32_t*>(V);
    for (int64_t jp = 0; jp < kAttnBK / 2; ++jp) {
      const auto* lo = reinterpret_cast<const uint16_t*>(vs[2 * jp]);
      const auto* hi = reinterpret_cast<const uint16_t*>(vs[2 * jp + 1]);
      for (int64_t d = 0; d < Dp; d += 16) {
        const __mmask16 m = d + 16 <= D ? __mmask16(0xffff) : d < D ? __mmask16((1u << (D - d)) - 1) : __mmask16(0);
        const __m512i a = lo ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, lo + d)) : _mm512_setzero_si512();
        const __m512i b = hi ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, hi + d)) : _mm512_setzero_si512();
        _mm512_storeu_si512(vp + jp * Dp + d, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
      }
    }
  }
  // o[i] += p[i] . V with the probabilities rounded to bfloat16 pairs (as a bf16 matmul of
  // softmax's output rounds them), products and sums in float
  static void accumulate(float* const o[4], int rn, const float* const p[4], const float* V, int64_t bk, int64_t Dp) {
    const auto* vp = reinterpret_cast<const uint32_t*>(V);
    alignas(64) uint32_t pp[4][kAttnBK / 2];
    for (int i = 0; i < 4; ++i)
      for (int64_t j = 0; j < kAttnBK; j += 32) {
        const __m512bh two = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(p[i] + j + 16), _mm512_loadu_ps(p[i] + j));
        _mm512_store_si512(pp[i] + j / 2, (__m512i)two);
      }
    const int64_t pairs = (bk + 1) / 2;  // a dead key's value pair half is zero
    for (int64_t d = 0; d < Dp; d += 16) {
      F o0 = _mm512_loadu_ps(o[0] + d), o1 = _mm512_loadu_ps(o[1] + d);
      F o2 = _mm512_loadu_ps(o[2] + d), o3 = _mm512_loadu_ps(o[3] + d);
      for (int64_t jp = 0; jp < pairs; ++jp) {
        const __m512bh vv = (__m512bh)_mm512_loadu_si512(vp + jp * Dp + d);
        o0 = _mm512_dpbf16_ps(o0, (__m512bh)_mm512_set1_epi32(static_cast<int>(pp[0][jp])), vv);
        o1 = _mm512_dpbf16_ps(o1, (__m512bh)_mm512_set1_epi32(static_cast<int>(pp[1][jp])), vv);
        o2 = _mm512_dpbf16_ps(o2, (__m512bh)_mm512_set1_epi32(static_cast<int>(pp[2][jp])), vv);
        o3 = _mm512_dpbf16_ps(o3, (__m512bh)_mm512_set1_epi32(static_cast<int>(pp[3][jp])), vv);
      }
      // rows past rn repeat the last live row: store the live ones only
      _mm512_storeu_ps(o[0] + d, o0);
      if (rn > 1) _mm512_storeu_ps(o[1] + d, o1);
      if (rn > 2) _mm512_storeu_ps(o[2] + d, o2);
      if (rn > 3) _mm512_storeu_ps(o[3] + d, o3);
    }
  }
  static void block(const float* const q[4], const float* Kt, int64_t c, int64_t D, int64_t, F s[4]) {
    const auto* kp = reinterpret_cast<const uint32_t*>(Kt);
    const uint32_t* qp[4];
    for (int i = 0; i < 4; ++i) qp[i] = reinterpret_cast<const uint32_t*>(q[i]);
    F s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t p = 0; p < (D + 1) / 2; ++p) {
      const __m512bh kv = (__m512bh)_mm512_loadu_si512(kp + p * kAttnBK + c);
      s0 = _mm512_dpbf16_ps(s0, (__m512bh)_mm512_set1_epi32(static_cast<int>(qp[0][p])), kv);
      s1 = _mm512_dpbf16_ps(s1, (__m512bh)_mm512_set1_epi32(static_cast<int>(qp[1][p])), kv);
      s2 = _mm512_dpbf16_ps(s2, (__m512bh)_mm512_set1_epi32(static_cast<int>(qp[2][p])), kv);
      s3 = _mm512_dpbf16_ps(s3, (__m512bh)_mm512_set1_epi32(static_cast<int>(qp[3][p])), kv);
    }
    s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3;
  }
};

inline void register_attention_avx512_bf16(tnc::KernelTable& t) {
  t.replace<tnc::AttentionArgs>("attention_decode", tnc::DType::bf16, attention_decode<bf16_t, Avx512Bf16DecodeScores>);
  t.replace<tnc::AttentionArgs>("attention", tnc::DType::bf16, attention<bf16_t, Avx512Bf16PrefillScores>);
}
