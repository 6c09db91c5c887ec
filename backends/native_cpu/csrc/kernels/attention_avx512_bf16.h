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
    std::memcpy(dst, src, static_cast<size_t>(D) * 2);
    std::fill(dst + D, dst + Dp, uint16_t{0});  // Dp > D when D is odd
  }
  // A key's channel pair p is its row's 32-bit word p, so the block is a transpose of 32-bit
  // words: 16 keys x 16 words at a time, in registers. (One word at a time, this packing
  // took 15-20% of a prefill.) An odd D, whose last word would take a channel past the
  // row, packs word by word.
  template <class T>
  static void load_keys(float* Kt, const T* const ks[kAttnBK], int64_t D) {
    auto* kp = reinterpret_cast<uint32_t*>(Kt);
    if (D % 2 != 0) {
      for (int64_t j = 0; j < kAttnBK; ++j) {
        const auto* from = reinterpret_cast<const uint16_t*>(ks[j]);
        for (int64_t p = 0; p < (D + 1) / 2; ++p) {
          const uint32_t lo = from ? from[2 * p] : 0u, hi = from && 2 * p + 1 < D ? from[2 * p + 1] : 0u;
          kp[p * kAttnBK + j] = lo | hi << 16;
        }
      }
      return;
    }
    const int64_t words = D / 2;
    for (int64_t j0 = 0; j0 < kAttnBK; j0 += 16)
      for (int64_t p0 = 0; p0 < words; p0 += 16) {
        const int n = static_cast<int>(std::min<int64_t>(16, words - p0));
        const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
        __m512i r[16];
        for (int jj = 0; jj < 16; ++jj) {
          const T* row = ks[j0 + jj];
          r[jj] = row ? _mm512_maskz_loadu_epi32(m, reinterpret_cast<const uint32_t*>(row) + p0) : _mm512_setzero_si512();
        }
        transpose16x16_epi32(r);
        for (int c = 0; c < n; ++c) _mm512_storeu_si512(kp + (p0 + c) * kAttnBK + j0, r[c]);
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
    int64_t d = 0;
    for (; d + 64 <= Dp; d += 64) accumulate_columns<4>(o, rn, pp, vp, pairs, Dp, d);
    for (; d < Dp; d += 16) accumulate_columns<1>(o, rn, pp, vp, pairs, Dp, d);
  }
  // acc[i][v] += sum over pairs p < count of rows[i][p] . b[p * stride + 16 v ..]: a pair of
  // row i (one 32-bit word, broadcast) against 16 pairs of b, 4 x NV independent vdpbf16ps
  // chains (four chains alone waited on the instruction's latency, at about half its
  // throughput). The scores (rows: queries, b: the packed keys) and P V (rows: the
  // probabilities, b: the packed values) are both this.
  template <int NV>
  static void pair_products(F acc[4][NV], const uint32_t* const rows[4], const uint32_t* b, int64_t stride, int64_t count) {
    for (int64_t p = 0; p < count; ++p) {
      __m512bh bv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + p * stride + 16 * v);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m512bh r = (__m512bh)_mm512_set1_epi32(static_cast<int>(rows[i][p]));
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], r, bv[v]);
      }
    }
  }
  // o[i][d .. d + 16 NV) += p[i] . the same columns of V
  template <int NV>
  static void accumulate_columns(float* const o[4], int rn, const uint32_t pp[4][kAttnBK / 2], const uint32_t* vp,
                                 int64_t pairs, int64_t Dp, int64_t d) {
    F acc[4][NV];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_loadu_ps(o[i] + d + 16 * v);
    const uint32_t* rows[4] = {pp[0], pp[1], pp[2], pp[3]};
    pair_products<NV>(acc, rows, vp + d, Dp, pairs);
    // rows past rn repeat the last live row: store the live ones only
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
      if (i == 0 || i < rn)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) _mm512_storeu_ps(o[i] + d + 16 * v, acc[i][v]);
  }
  // s[i][v] = scores of query row q[i] against keys c + 16 v .. c + 16 v + 15: every key
  // of the block at once
  static constexpr int kKeyVectors = kAttnBK / 16;
  static void block(const float* const q[4], const float* Kt, int64_t c, int64_t D, int64_t, F s[4][kKeyVectors]) {
    const uint32_t* qp[4];
    for (int i = 0; i < 4; ++i) qp[i] = reinterpret_cast<const uint32_t*>(q[i]);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < kKeyVectors; ++v) s[i][v] = _mm512_setzero_ps();
    pair_products<kKeyVectors>(s, qp, reinterpret_cast<const uint32_t*>(Kt) + c, kAttnBK, (D + 1) / 2);
  }
};

inline void register_attention_avx512_bf16(tnc::KernelTable& t) {
  t.replace<tnc::AttentionArgs>("attention_decode", tnc::DType::bf16, attention_decode<bf16_t, Avx512Bf16DecodeScores>);
  t.replace<tnc::AttentionArgs>("attention", tnc::DType::bf16, attention<bf16_t, Avx512Bf16PrefillScores>);
}
