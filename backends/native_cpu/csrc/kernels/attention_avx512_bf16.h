// The attention family's code for AVX-512 BF16 (vdpbf16ps): decode scores straight from
// the bfloat16 query and cache. Included by isa_avx512.cc inside its namespace after
// kernels/families.h; register_attention_avx512_bf16 replaces the bfloat16 decode kernel.
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

inline void register_attention_avx512_bf16(tnc::KernelTable& t) {
  t.replace<tnc::AttentionArgs>("attention_decode", tnc::DType::bf16, attention_decode<bf16_t, Avx512Bf16DecodeScores>);
}
