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

// attention_decode's policy for bfloat16 (see FloatDecode). The query rows are kept
// unscaled (exact in bf16), zero-padded to whole vectors of 32, and the scores are scaled
// afterwards. P V runs on vdpbf16ps too: the probabilities are rounded to bfloat16 pairs
// of keys (as a bf16 matmul of softmax's output rounds them; sums stay float), and two
// value rows are interleaved into pairs by vpunpck{l,h}wd, which works within 128-bit
// lanes: the 16 channels of one vector come out as 8L + w (lo) and 8L + 4 + w (hi) for lane
// L and word w. Rows of O keep that order in each run of 32 channels (o_index), and only
// the final write puts channels back in order. (Half the instructions of float P V, where
// each value needed widening and a float FMA per head.)
struct Avx512Bf16Decode {
  static constexpr bool kScaled = false;
  static int64_t padded(int64_t D) { return (D + 31) / 32 * 32; }
  static int64_t query_floats(int64_t H, int64_t D) { return H * padded(D) / 2; }
  template <class T>
  static void load_query(float* q, int64_t h, const T* src, int64_t D, float) {
    auto* row = reinterpret_cast<uint16_t*>(q) + h * padded(D);
    std::memcpy(row, src, static_cast<size_t>(D) * 2);
    std::fill(row + D, row + padded(D), uint16_t{0});
  }
  template <class T>
  static void scores(const float* q, int64_t h0, int gn, const T* const kr[4], int64_t D, F acc[4][4]) {
    const uint16_t* qb[4];
    const uint16_t* kb[4];
    for (int i = 0; i < 4; ++i) qb[i] = reinterpret_cast<const uint16_t*>(q) + (h0 + std::min(i, gn - 1)) * padded(D);
    for (int jj = 0; jj < 4; ++jj) kb[jj] = reinterpret_cast<const uint16_t*>(kr[jj]);
    decode_scores_bf16(qb, kb, D, acc);
  }
  static int64_t o_stride(int64_t D) { return padded(D); }
  static int64_t o_index(int64_t d) {
    const int64_t r = d % 32;
    return d - r + 16 * (r % 8 / 4) + 4 * (r / 8) + r % 4;
  }
  static int64_t prob_floats(int64_t H) { return H * W / 2; }
  static void store_probs(float* P, int64_t h, F p) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(P + h * W / 2), (__m256i)_mm512_cvtneps_pbh(p));
  }
  // O rows h0 .. h0 + gn - 1 += P V over keys j0 (even) <= j < j1: 64 channels (4 vectors
  // a head) at a time, a pair of keys per vdpbf16ps; a dead key's half of a pair is zero
  template <class T>
  static void accumulate(float* O, int64_t h0, int gn, const float* P, const T* vbase, const int64_t* row, int j0, int j1,
                         int64_t kv_tok, int64_t D) {
    const int64_t Dp = padded(D);
    const auto* pp = reinterpret_cast<const uint32_t*>(P);
    int64_t d0 = 0;
    for (; d0 + 64 <= Dp; d0 += 64) accumulate_columns<2>(O, h0, gn, pp, vbase, row, j0, j1, kv_tok, D, d0);
    if (d0 < Dp) accumulate_columns<1>(O, h0, gn, pp, vbase, row, j0, j1, kv_tok, D, d0);
  }
  template <int NC, class T>  // NC runs of 32 channels from d0
  static void accumulate_columns(float* O, int64_t h0, int gn, const uint32_t* pp, const T* vbase, const int64_t* row, int j0,
                                 int j1, int64_t kv_tok, int64_t D, int64_t d0) {
    const int64_t Dp = padded(D);
    const uint32_t* prow[4];
    float* orow[4];
    F acc[4][2 * NC];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const int64_t h = h0 + std::min(i, gn - 1);
      prow[i] = pp + h * W / 2;
      orow[i] = O + h * Dp + d0;
#pragma GCC unroll 4
      for (int v = 0; v < 2 * NC; ++v) acc[i][v] = _mm512_loadu_ps(orow[i] + 16 * v);
    }
    __mmask32 mk[NC];
    for (int c = 0; c < NC; ++c) {
      const int64_t left = D - d0 - 32 * c;
      mk[c] = left >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << left) - 1);
    }
    // a dead key's half of a pair reads zeros (a branch here made GCC keep acc in memory)
    alignas(64) static constexpr uint16_t kZeros[64] = {};
    for (int j = j0; j < j1; j += 2) {
      const auto* r0 = reinterpret_cast<const uint16_t*>(vbase + row[j] * kv_tok + d0);
      const auto* r1 = j + 1 < j1 ? reinterpret_cast<const uint16_t*>(vbase + row[j + 1] * kv_tok + d0) : kZeros;
#pragma GCC unroll 2
      for (int c = 0; c < NC; ++c) {
        const __m512i a = _mm512_maskz_loadu_epi16(mk[c], r0 + 32 * c);
        const __m512i b = _mm512_maskz_loadu_epi16(mk[c], r1 + 32 * c);
        const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(a, b), hi = (__m512bh)_mm512_unpackhi_epi16(a, b);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          const __m512bh pj = (__m512bh)_mm512_set1_epi32(static_cast<int>(prow[i][j / 2]));
          acc[i][2 * c] = _mm512_dpbf16_ps(acc[i][2 * c], pj, lo);
          acc[i][2 * c + 1] = _mm512_dpbf16_ps(acc[i][2 * c + 1], pj, hi);
        }
      }
    }
    // a dead head repeats the last live one (see FloatDecode::accumulate)
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < 2 * NC; ++v) _mm512_storeu_ps(orow[i] + 16 * v, acc[i][v]);
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
  t.replace<tnc::AttentionArgs>("attention_decode", tnc::DType::bf16, attention_decode<bf16_t, Avx512Bf16Decode>);
  t.replace<tnc::AttentionArgs>("attention", tnc::DType::bf16, attention<bf16_t, Avx512Bf16PrefillScores>);
}
