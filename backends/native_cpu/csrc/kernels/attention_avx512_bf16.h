// The attention family's code for AVX-512 BF16 (vdpbf16ps): decode's policy, and a
// prefill of its own with the query rows in the lanes. Included by isa_avx512.cc inside its
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
  static constexpr int kKeys = 4;  // keys of a block of scores
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
  static void accumulate(float* O, int64_t h0, int gn, const float* P, const T* vbase, const int64_t* row, int j0,
                         int j1, int64_t kv_tok, int64_t D) {
    const int64_t Dp = padded(D);
    const auto* pp = reinterpret_cast<const uint32_t*>(P);
    int64_t d0 = 0;
    for (; d0 + 64 <= Dp; d0 += 64) accumulate_columns<2>(O, h0, gn, pp, vbase, row, j0, j1, kv_tok, D, d0);
    if (d0 < Dp) accumulate_columns<1>(O, h0, gn, pp, vbase, row, j0, j1, kv_tok, D, d0);
  }
  template <int NC, class T>  // NC runs of 32 channels from d0
  static void accumulate_columns(float* O, int64_t h0, int gn, const uint32_t* pp, const T* vbase, const int64_t* row,
                                 int j0, int j1, int64_t kv_tok, int64_t D, int64_t d0) {
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

// Prefill for bfloat16 on AVX512-BF16 with the query rows in the lanes: 16 rows of a work
// item (prefill_items) form a lane group, and every vector holds one number per row. A
// score vector is one key against 16 rows, so the softmax's maxima and sums over keys are
// lane-wise max and add (no horizontal reduction per row, and masks are one compare per
// key), and O is kept transposed, O^T[channel][16 rows]. Both products run on vdpbf16ps:
// - scores: the rows' query pairs, packed Qp[pair][16 rows], against one key's channel
//   pair, broadcast from the block's keys packed per 16-key chunk, Kt[pair][16 keys];
// - P V: the probabilities as key pairs of the 16 rows, Pp[key pair][16 rows], against a
//   value pair (keys 2 jp and 2 jp + 1 of one channel) broadcast from Vp[key pair][Dv].
// The probabilities are rounded to bfloat16 pairs (as a bf16 matmul of softmax's output
// rounds them); scores, sums and O stay float. (The row-broadcast form that this replaced
// spent half its time outside vdpbf16ps, mostly on per-row reductions.)
namespace bf16_prefill {

constexpr int kLanes = 16;
constexpr int64_t kBK = 64;  // keys per block: Vp and the score tile stay in the L1

// The visible keys of a lane group's rows: [lo, hi) covers every row's span, and every row
// sees [lo_max, hi_min) (empty when some row sees nothing). Pad lanes do not count.
struct GroupSpan {
  int32_t lo, hi, lo_max, hi_min;
};

// Vp[jp][Dv] (Dv: D rounded up to 16): keys 2 jp and 2 jp + 1 of channel d in the low and
// high halves of word jp * Dv + d; a missing key (null) is zeros
inline void pack_value_pairs(uint32_t* vp, const uint16_t* const vs[kBK], int64_t D, int64_t Dv) {
  for (int64_t jp = 0; jp < kBK / 2; ++jp) {
    const uint16_t* lo = vs[2 * jp];
    const uint16_t* hi = vs[2 * jp + 1];
    for (int64_t d = 0; d < Dv; d += 16) {
      const __mmask16 m = d + 16 <= D ? __mmask16(0xffff) : __mmask16((1u << (D - d)) - 1);
      const __m512i a = lo ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, lo + d)) : _mm512_setzero_si512();
      const __m512i b = hi ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, hi + d)) : _mm512_setzero_si512();
      _mm512_storeu_si512(vp + jp * Dv + d, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
    }
  }
}

// Qp[p][16] of one lane group: lane l holds channel pair p of query row q[l] (null: zeros)
inline void pack_query_pairs(uint32_t* qp, const uint16_t* const q[kLanes], int64_t D) {
  const int64_t pairs = (D + 1) / 2;
  for (int64_t p0 = 0; p0 < pairs; p0 += 16) {
    const int64_t ch =
        std::min<int64_t>(32, D - 2 * p0);  // channels of this run (odd D: the last pair's high half is 0)
    const __mmask32 m = ch >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << ch) - 1);
    __m512i r[16];
    for (int l = 0; l < kLanes; ++l) r[l] = q[l] ? _mm512_maskz_loadu_epi16(m, q[l] + 2 * p0) : _mm512_setzero_si512();
    transpose16x16_epi32(r);
    const int64_t n = std::min<int64_t>(16, pairs - p0);
    for (int64_t c = 0; c < n; ++c) _mm512_storeu_si512(qp + (p0 + c) * kLanes, r[c]);
  }
}

// Kt[p][16] of a chunk of 16 keys: word p of key row kr[jj] in lane jj (an odd D's last
// word has a zero high half, never the next row's channel), so that each broadcast below
// is one address plus a constant
inline void pack_key_pairs(uint32_t* kt, const uint16_t* const kr[16], int64_t D) {
  pack_query_pairs(kt, kr, D);  // the same transpose of 32-bit words
}

// s[jj] = the 16 rows' dot products with key jj of the chunk Kt
inline void key_scores(__m512 s[16], const uint32_t* qp, const uint32_t* kt, int64_t pairs) {
#pragma GCC unroll 16
  for (int jj = 0; jj < 16; ++jj) s[jj] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh qv = (__m512bh)_mm512_loadu_si512(qp + p * kLanes);
#pragma GCC unroll 16
    for (int jj = 0; jj < 16; ++jj)
      s[jj] = _mm512_dpbf16_ps(s[jj], (__m512bh)_mm512_set1_epi32(static_cast<int>(kt[p * 16 + jj])), qv);
  }
}

// O^T[d0 .. d0 + 16) of the lane group = corr O^T + sum over key pairs jp < npairs of Pp[jp]
// x the value pairs of those channels (16 accumulators: 32 would leave no register for
// the operands)
inline void accumulate_values(float* ot, __m512 corr, const uint32_t* pp, const uint32_t* vp, int64_t npairs,
                              int64_t Dv, int64_t d0) {
  __m512 acc[16];
#pragma GCC unroll 16
  for (int dd = 0; dd < 16; ++dd) acc[dd] = _mm512_mul_ps(_mm512_loadu_ps(ot + (d0 + dd) * kLanes), corr);
  for (int64_t jp = 0; jp < npairs; ++jp) {
    const __m512bh pv = (__m512bh)_mm512_loadu_si512(pp + jp * kLanes);
    const uint32_t* vrow = vp + jp * Dv + d0;
#pragma GCC unroll 16
    for (int dd = 0; dd < 16; ++dd)
      acc[dd] = _mm512_dpbf16_ps(acc[dd], (__m512bh)_mm512_set1_epi32(static_cast<int>(vrow[dd])), pv);
  }
#pragma GCC unroll 16
  for (int dd = 0; dd < 16; ++dd) _mm512_storeu_ps(ot + (d0 + dd) * kLanes, acc[dd]);
}

// e^(s - base) for s <= base, given base log2(e): exp2_fast of t = s log2(e) - base log2(e),
// one fma, and no clamp (t <= 0, and vscalefps takes any exponent down to zero). A masked
// score (-inf) gives NaN here; the mask that made it replaces the result.
inline __m512 exp_below(__m512 s, __m512 base_log2e) {
  return exp2_fast(_mm512_fmsub_ps(s, _mm512_set1_ps(1.44269504088896341f), base_log2e));
}

}  // namespace bf16_prefill

inline void attention_bf16_lanes(const tnc::AttentionArgs& a, int threads) {
  using namespace bf16_prefill;
  for (int64_t b = 0; b < a.batch; ++b)
    if (a.kv_len[b] >= INT32_MAX) return attention<bf16_t>(a, threads);  // key positions are int32 lanes here
  const int64_t D = a.head_dim, G = a.heads / a.heads_kv, pairs = (D + 1) / 2, Dv = (D + 15) / 16 * 16;
  const int64_t q_tok = a.heads * D, kv_tok = a.heads_kv * D;
  const std::vector<PrefillItem> work = prefill_items(a);
  const int64_t groups_max = (G * kAttnBQ + kLanes - 1) / kLanes;
  const float ninf = -std::numeric_limits<float>::infinity();
  tnc::parallel_for(static_cast<int64_t>(work.size()), 1, threads, [&](int64_t i0, int64_t i1) {
    // per lane group: Qp, O^T, the running max and sum, the visible key span
    const size_t per_group = static_cast<size_t>(pairs * kLanes + Dv * kLanes + 4 * kLanes + 4);
    float* state = scratch(static_cast<size_t>(groups_max) * per_group, 0);
    auto* vp = reinterpret_cast<uint32_t*>(scratch(static_cast<size_t>(kBK / 2 * Dv + kBK * pairs), 1));
    uint32_t* kt = vp + kBK / 2 * Dv;  // the block's keys, Kt[chunk][pair][16]
    float* st = scratch(static_cast<size_t>(kBK * kLanes + kBK / 2 * kLanes), 2);  // score tile, then Pp
    auto* pp = reinterpret_cast<uint32_t*>(st + kBK * kLanes);
    for (int64_t item = i0; item < i1; ++item) {
      const auto [b, hkv, q0] = work[static_cast<size_t>(item)];
      const int64_t bq = std::min(kAttnBQ, a.q_len[b] - q0), rows = G * bq, groups = (rows + kLanes - 1) / kLanes;
      const int64_t qrow0 = a.q_begin[b] + q0;
      // lane l of group g: row r = 16 g + l = head (r / bq) of the KV head, query q0 + r % bq
      auto query = [&](int64_t r) {
        return reinterpret_cast<const uint16_t*>(static_cast<const bf16_t*>(a.q) + (qrow0 + r % bq) * q_tok +
                                                 (hkv * G + r / bq) * D);
      };
      int64_t item_lo = INT64_MAX, item_hi = 0;
      for (int64_t g = 0; g < groups; ++g) {
        float* gs = state + g * per_group;
        auto* qp = reinterpret_cast<uint32_t*>(gs);
        float* ot = gs + pairs * kLanes;
        float* mx = ot + Dv * kLanes;
        auto* lo = reinterpret_cast<int32_t*>(mx + 2 * kLanes);
        auto* hi = lo + kLanes;
        auto* span = reinterpret_cast<int32_t*>(hi + kLanes);  // GroupSpan
        GroupSpan gsp{INT32_MAX, 0, 0, INT32_MAX};
        const uint16_t* q[kLanes];
        for (int l = 0; l < kLanes; ++l) {
          const int64_t r = g * kLanes + l;
          q[l] = r < rows ? query(r) : nullptr;
          const KeySpan seen = r < rows ? visible_keys(a, b, q0 + r % bq) : KeySpan{0, 0};
          lo[l] = static_cast<int32_t>(seen.lo), hi[l] = static_cast<int32_t>(seen.hi);
          if (r >= rows) continue;  // a pad lane: never written out, so never masked for
          gsp.lo_max = std::max(gsp.lo_max, lo[l]), gsp.hi_min = std::min(gsp.hi_min, hi[l]);
          if (seen.hi > seen.lo) gsp.lo = std::min(gsp.lo, lo[l]), gsp.hi = std::max(gsp.hi, hi[l]);
        }
        std::memcpy(span, &gsp, sizeof gsp);
        item_lo = std::min<int64_t>(item_lo, gsp.lo), item_hi = std::max<int64_t>(item_hi, gsp.hi);
        pack_query_pairs(qp, q, D);
        std::fill(ot, ot + Dv * kLanes, 0.f);
        std::fill(mx, mx + kLanes, ninf);
        std::fill(mx + kLanes, mx + 2 * kLanes, 0.f);
      }
      for (int64_t k0 = item_lo; k0 < item_hi; k0 += kBK) {
        const int64_t bk = std::min(kBK, item_hi - k0);
        int64_t rows_k[kBK];
        key_rows(a, b, k0, bk, rows_k);
        const uint16_t* kr[kBK];
        const uint16_t* vr[kBK];
        for (int64_t j = 0; j < kBK; ++j) {
          const bool live = j < bk;
          // a key past the block reads the first one's row, and its score is masked
          kr[j] = reinterpret_cast<const uint16_t*>(static_cast<const bf16_t*>(a.k) + rows_k[live ? j : 0] * kv_tok +
                                                    hkv * D);
          vr[j] =
              live ? reinterpret_cast<const uint16_t*>(static_cast<const bf16_t*>(a.v) + rows_k[j] * kv_tok + hkv * D)
                   : nullptr;
        }
        pack_value_pairs(vp, vr, D, Dv);
        for (int64_t c = 0; c < bk; c += 16) pack_key_pairs(kt + c * pairs, kr + c, D);
        for (int64_t g = 0; g < groups; ++g) {
          float* gs = state + g * per_group;
          const auto* qp = reinterpret_cast<const uint32_t*>(gs);
          float* ot = gs + pairs * kLanes;
          float* mx = ot + Dv * kLanes;
          float* sum = mx + kLanes;
          const auto* lo = reinterpret_cast<const int32_t*>(mx + 2 * kLanes);
          const auto* hi = lo + kLanes;
          GroupSpan gsp;
          std::memcpy(&gsp, hi + kLanes, sizeof gsp);
          const __m512i lov = _mm512_loadu_si512(lo), hiv = _mm512_loadu_si512(hi);
          // the keys of this block any row of the group sees: [j0, j1), in 16-key chunks
          // [c0, c1); without masks when every row sees all of them
          const int64_t j0 = std::clamp<int64_t>(gsp.lo - k0, 0, bk), j1 = std::clamp<int64_t>(gsp.hi - k0, j0, bk);
          if (j1 <= j0) continue;
          const int64_t c0 = j0 / 16 * 16, c1 = (j1 + 15) / 16 * 16;
          const bool whole = gsp.lo_max <= k0 + j0 && gsp.hi_min >= k0 + j1;
          const bool masked = !whole || c0 != j0 || c1 != j1;
          const float scale = a.scale;
          __m512 bmax = _mm512_set1_ps(ninf);
          for (int64_t c = c0; c < c1; c += 16) {
            __m512 s[16];
            key_scores(s, qp, kt + c * pairs, pairs);
#pragma GCC unroll 16
            for (int jj = 0; jj < 16; ++jj) {
              __m512 v = _mm512_mul_ps(s[jj], _mm512_set1_ps(scale));
              if (a.softcap > 0.f) v = vsoftcap(v, a.softcap);
              if (!whole || c + jj < j0 || c + jj >= j1) {
                const __m512i t = _mm512_set1_epi32(static_cast<int>(k0 + c + jj));
                const __mmask16 seen = _mm512_cmpge_epi32_mask(t, lov) & _mm512_cmplt_epi32_mask(t, hiv) &
                                       (c + jj < bk ? __mmask16(0xffff) : __mmask16(0));
                v = _mm512_mask_mov_ps(_mm512_set1_ps(ninf), seen, v);
              }
              bmax = _mm512_max_ps(bmax, v);
              _mm512_storeu_ps(st + (c + jj) * kLanes, v);
            }
          }
          // online softmax, lane-wise: a lane that has seen nothing keeps max -inf, and its
          // exponent base is 0 so that e^-inf stays 0 (never -inf - -inf)
          const __m512 m_old = _mm512_loadu_ps(mx), m_new = _mm512_max_ps(m_old, bmax);
          const __mmask16 live = _mm512_cmp_ps_mask(m_new, _mm512_set1_ps(ninf), _CMP_NEQ_OQ);
          const __m512 base = _mm512_maskz_mov_ps(live, m_new);
          const __m512 corr = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(m_old, _mm512_set1_ps(ninf), _CMP_NEQ_OQ),
                                                  vexp<true>(_mm512_sub_ps(m_old, base)));
          _mm512_storeu_ps(mx, m_new);
          // probabilities of keys c0 .. c1 as bf16 key pairs; a masked score (-inf) gives 0
          const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23,
                                                      7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
          const __m512 base_log2e = _mm512_mul_ps(base, _mm512_set1_ps(1.44269504088896341f));
          __m512 total = _mm512_setzero_ps();
          for (int64_t j = c0; j < c1; j += 2) {
            __m512 e0 = exp_below(_mm512_loadu_ps(st + j * kLanes), base_log2e);
            __m512 e1 = exp_below(_mm512_loadu_ps(st + (j + 1) * kLanes), base_log2e);
            if (masked) {
              e0 = _mm512_maskz_mov_ps(
                  _mm512_cmp_ps_mask(_mm512_loadu_ps(st + j * kLanes), _mm512_set1_ps(ninf), _CMP_NEQ_OQ), e0);
              e1 = _mm512_maskz_mov_ps(
                  _mm512_cmp_ps_mask(_mm512_loadu_ps(st + (j + 1) * kLanes), _mm512_set1_ps(ninf), _CMP_NEQ_OQ), e1);
            }
            total = _mm512_add_ps(total, _mm512_add_ps(e0, e1));
            const __m512i two = (__m512i)_mm512_cvtne2ps_pbh(e1, e0);  // e0's 16 in the low half
            _mm512_storeu_si512(pp + (j - c0) / 2 * kLanes, _mm512_permutexvar_epi16(interleave, two));
          }
          _mm512_storeu_ps(sum, _mm512_fmadd_ps(_mm512_loadu_ps(sum), corr, total));
          const int64_t npairs = (c1 - c0) / 2;
          const uint32_t* vfrom = vp + c0 / 2 * Dv;
          for (int64_t d0 = 0; d0 < Dv; d0 += 16) accumulate_values(ot, corr, pp, vfrom, npairs, Dv, d0);
        }
      }
      // O = O^T's columns / the sums (a row that saw no key: zeros)
      for (int64_t g = 0; g < groups; ++g) {
        float* gs = state + g * per_group;
        const float* ot = gs + pairs * kLanes;
        const __m512 s = _mm512_loadu_ps(gs + pairs * kLanes + Dv * kLanes + kLanes);
        alignas(64) float inv[kLanes];
        _mm512_store_ps(
            inv, _mm512_maskz_div_ps(_mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_GT_OQ), _mm512_set1_ps(1.f), s));
        for (int64_t d0 = 0; d0 < Dv; d0 += 16) {
          __m512i t[16];
          for (int dd = 0; dd < 16; ++dd) t[dd] = _mm512_loadu_si512(ot + (d0 + dd) * kLanes);
          transpose16x16_epi32(t);  // t[l]: channels d0 .. d0 + 15 of lane l
          for (int l = 0; l < kLanes; ++l) {
            const int64_t r = g * kLanes + l;
            if (r >= rows) break;
            bf16_t* dst = static_cast<bf16_t*>(a.o) + (qrow0 + r % bq) * q_tok + (hkv * G + r / bq) * D;
            storec(dst + d0, _mm512_mul_ps(_mm512_castsi512_ps(t[l]), _mm512_set1_ps(inv[l])), D - d0);
          }
        }
      }
    }
  });
}

inline void register_attention_avx512_bf16(tnc::KernelTable& t) {
  t.replace<tnc::AttentionArgs>("attention_decode", tnc::DType::bf16, attention_decode<bf16_t, Avx512Bf16Decode>);
  t.replace<tnc::AttentionArgs>("attention", tnc::DType::bf16, attention_bf16_lanes);
}
