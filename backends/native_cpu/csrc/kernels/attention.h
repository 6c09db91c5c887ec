// The attention family: grouped-query attention over a batch of requests, each op reduced
// to the layout of kernels/attention_args.h (dense [B, S, H, D], packed variable-length
// rows, or a paged KV cache). Prefill is a blocked online softmax over blocks of queries of
// one request and one KV head; decode (one query per request) streams each request's keys
// once. Included inside a per-ISA namespace by kernels/families.h (after kernels/common.h);
// marshalling in bind/attention.cc. The decode path is in kernels/attention_decode.h.
#pragma once
// (no includes of system or project headers here: see kernels/common.h)

// ---------------------------------------------------------------------------------------
// what a query sees, and where a key lives

struct KeySpan {
  int64_t lo, hi;  // keys [lo, hi); empty when hi == lo
};

// Query i of request b: its diagonal is i + kv_len - q_len (bottom-right alignment).
inline KeySpan visible_keys(const tnc::AttentionArgs& a, int64_t b, int64_t i) {
  const int64_t n = a.kv_len[b], diag = i + n - a.q_len[b];
  int64_t lo = 0, hi = n;
  if (a.causal) {
    hi = std::min(hi, diag + 1);
  } else if (a.window_right >= 0) {
    hi = std::min(hi, diag + a.window_right + 1);
  }
  if (a.window_left >= 0) lo = std::max(lo, diag - a.window_left);
  return {lo, std::max(lo, hi)};
}

// The k / v rows of positions t0 .. t0 + n - 1 of request b: consecutive within a page, so
// a paged cache costs one table read and one division per page, not per key.
inline void key_rows(const tnc::AttentionArgs& a, int64_t b, int64_t t0, int64_t n, int64_t* rows) {
  if (a.block_table == nullptr) {
    const int64_t first = a.kv_begin[b] + t0;
    for (int64_t j = 0; j < n; ++j) rows[j] = first + j;
    return;
  }
  for (int64_t j = 0, t = t0; j < n;) {
    const int64_t page = a.block_table[b * a.table_stride + t / a.page_size], at = t % a.page_size;
    const int64_t run = std::min(n - j, a.page_size - at);
    for (int64_t i = 0; i < run; ++i) rows[j + i] = page * a.page_size + at + i;
    j += run;
    t += run;
  }
}

// cap * tanh(s / cap), as 1 - 2 / (e^(2 s / cap) + 1): exact enough at the ends (vexp
// saturates to 0 or a finite huge value) and within a few float ulps of s near 0.
inline F vsoftcap(F s, float cap) {
  const F e = vexp(S::mul(s, S::set1(2.f / cap)));
  const F t = S::sub(S::set1(1.f), S::div(S::set1(2.f), S::add(e, S::set1(1.f))));
  return S::mul(t, S::set1(cap));
}

// ---------------------------------------------------------------------------------------
// prefill: blocked online softmax in float32

constexpr int64_t kAttnBQ = 32;
constexpr int64_t kAttnBK = (64 + W - 1) / W * W;

// How prefill computes its dot products in float: the layouts of the query rows, the key
// block and the value block, the scores of 4 rows x W keys, and the 4-row P V update. The
// query rows are scaled floats [rows][Dp], the key block is transposed to floats
// Kt[D][kAttnBK], the value block is floats V[kAttnBK][Dp], and each is a run of broadcast
// FMAs. (bfloat16 on AVX512-BF16 has its own prefill, with the query rows in the lanes:
// kernels/attention_avx512_bf16.h.)
struct FloatPrefillScores {
  static int64_t key_floats(int64_t D) { return D * kAttnBK; }
  template <class T>
  static void load_query(float* row, const T* src, int64_t D, int64_t Dp, float scale) {
    for (int64_t d = 0; d < D; ++d) row[d] = tnc::to_float(src[d]) * scale;
    for (int64_t d = D; d < Dp; ++d) row[d] = 0.f;
  }
  // the block's key rows transposed to floats Kt[D][kAttnBK]; ks[j] null: a dead key (zeros)
  template <class T>
  static void load_keys(float* Kt, const T* const ks[kAttnBK], int64_t D) {
    for (int64_t j = 0; j < kAttnBK; ++j)
      for (int64_t d = 0; d < D; ++d) Kt[d * kAttnBK + j] = ks[j] ? tnc::to_float(ks[j][d]) : 0.f;
  }
  static int64_t value_floats(int64_t Dp) { return kAttnBK * Dp; }
  // the block's value rows as floats V[kAttnBK][Dp]; vs[j] null: a dead key (zeros)
  template <class T>
  static void load_values(float* V, const T* const vs[kAttnBK], int64_t D, int64_t Dp) {
    for (int64_t j = 0; j < kAttnBK; ++j) {
      float* dst = V + j * Dp;
      if (vs[j] == nullptr) {
        for (int64_t d = 0; d < Dp; ++d) dst[d] = 0.f;
        continue;
      }
      for (int64_t d = 0; d < D; d += W) storec(dst + d, loadc(vs[j] + d, D - d), D - d);
      for (int64_t d = D; d < Dp; ++d) dst[d] = 0.f;
    }
  }
  // o[i][0 .. Dp) += p[i][0 .. bk) . V for four rows (rn of them live)
  static void accumulate(float* const o[4], int rn, const float* const p[4], const float* V, int64_t bk, int64_t Dp) {
    for (int64_t d = 0; d < Dp; d += W) {
      F o0 = S::load(o[0] + d);
      F o1 = rn > 1 ? S::load(o[1] + d) : S::zero();
      F o2 = rn > 2 ? S::load(o[2] + d) : S::zero();
      F o3 = rn > 3 ? S::load(o[3] + d) : S::zero();
      for (int64_t j = 0; j < bk; ++j) {
        const F vv = S::load(V + j * Dp + d);
        o0 = S::fma(S::set1(p[0][j]), vv, o0);
        o1 = S::fma(S::set1(p[1][j]), vv, o1);
        o2 = S::fma(S::set1(p[2][j]), vv, o2);
        o3 = S::fma(S::set1(p[3][j]), vv, o3);
      }
      S::store(o[0] + d, o0);
      if (rn > 1) S::store(o[1] + d, o1);
      if (rn > 2) S::store(o[2] + d, o2);
      if (rn > 3) S::store(o[3] + d, o3);
    }
  }
  // s[i][0] = scores of query row q[i] against keys c .. c + W - 1 of the block
  static constexpr int kKeyVectors = 1;  // vectors of W keys per block() call
  static void block(const float* const q[4], const float* Kt, int64_t c, int64_t D, int64_t, F s[4][kKeyVectors]) {
    F s0 = S::zero(), s1 = S::zero(), s2 = S::zero(), s3 = S::zero();
    for (int64_t d = 0; d < D; ++d) {
      const F kv = S::load(Kt + d * kAttnBK + c);
      s0 = S::fma(S::set1(q[0][d]), kv, s0);
      s1 = S::fma(S::set1(q[1][d]), kv, s1);
      s2 = S::fma(S::set1(q[2][d]), kv, s2);
      s3 = S::fma(S::set1(q[3][d]), kv, s3);
    }
    s[0][0] = s0, s[1][0] = s1, s[2][0] = s2, s[3][0] = s3;
  }
};

// A prefill work item: request, KV head, first query of a block of kAttnBQ queries (all
// G query heads of the KV head).
struct PrefillItem {
  int64_t b, hkv, q0;
};

// The query blocks, request-major, each request's last block first (under a causal mask
// the later blocks see the most keys: claimed first, the long items no longer come last
// and leave one thread working alone)
inline std::vector<PrefillItem> prefill_items(const tnc::AttentionArgs& a) {
  std::vector<PrefillItem> work;
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t hkv = 0; hkv < a.heads_kv; ++hkv)
      for (int64_t blk = (a.q_len[b] + kAttnBQ - 1) / kAttnBQ - 1; blk >= 0; --blk)
        work.push_back({b, hkv, blk * kAttnBQ});
  return work;
}

template <class T>
void attention(const tnc::AttentionArgs& a, int threads) {
  using Scores = FloatPrefillScores;
  const int64_t D = a.head_dim, Dp = (D + W - 1) / W * W, G = a.heads / a.heads_kv;
  const std::vector<PrefillItem> work = prefill_items(a);
  const int64_t q_tok = a.heads * D, kv_tok = a.heads_kv * D;
  tnc::parallel_for(static_cast<int64_t>(work.size()), 1, threads, [&](int64_t i0, int64_t i1) {
    const int64_t rows_max = G * kAttnBQ;
    float* Q = scratch(static_cast<size_t>(rows_max * Dp + rows_max * Dp + rows_max * kAttnBK + 2 * rows_max), 0);
    float* O = Q + rows_max * Dp;
    float* P = O + rows_max * Dp;
    float* Mx = P + rows_max * kAttnBK;
    float* L = Mx + rows_max;
    float* Kt = scratch(static_cast<size_t>(Scores::key_floats(D)), 1);
    float* V = scratch(static_cast<size_t>(Scores::value_floats(Dp)), 2);
    for (int64_t item = i0; item < i1; ++item) {
      const auto [b, hkv, q0] = work[static_cast<size_t>(item)];
      const int64_t bq = std::min(kAttnBQ, a.q_len[b] - q0);
      const int64_t rows = G * bq, qrow0 = a.q_begin[b] + q0;
      for (int64_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < bq; ++i) {
          const T* src = static_cast<const T*>(a.q) + (qrow0 + i) * q_tok + (hkv * G + g) * D;
          Scores::load_query(Q + (g * bq + i) * Dp, src, D, Dp, a.scale);
        }
      std::fill(Mx, Mx + rows, -std::numeric_limits<float>::infinity());
      std::fill(L, L + rows, 0.f);
      std::fill(O, O + rows * Dp, 0.f);
      // the keys any query of the block sees (both bounds grow with the query index)
      const int64_t kv_lo = visible_keys(a, b, q0).lo, kv_hi = visible_keys(a, b, q0 + bq - 1).hi;
      for (int64_t k0 = kv_lo; k0 < kv_hi; k0 += kAttnBK) {
        const int64_t bk = std::min(kAttnBK, kv_hi - k0);
        int64_t rows_k[kAttnBK];
        key_rows(a, b, k0, bk, rows_k);
        const T* ks[kAttnBK];
        const T* vs[kAttnBK];
        for (int64_t j = 0; j < kAttnBK; ++j) {
          const int64_t tok = j < bk ? rows_k[j] * kv_tok + hkv * D : 0;
          ks[j] = j < bk ? static_cast<const T*>(a.k) + tok : nullptr;
          vs[j] = j < bk ? static_cast<const T*>(a.v) + tok : nullptr;
        }
        Scores::load_keys(Kt, ks, D);
        Scores::load_values(V, vs, D, Dp);
        // scores, four query rows at a time
        for (int64_t r0 = 0; r0 < rows; r0 += 4) {
          const float* q[4];
          for (int i = 0; i < 4; ++i) q[i] = Q + std::min(r0 + i, rows - 1) * Dp;
          for (int64_t c = 0; c < kAttnBK; c += Scores::kKeyVectors * W) {
            F s[4][Scores::kKeyVectors];
            Scores::block(q, Kt, c, D, Dp, s);
            for (int i = 0; i < 4 && r0 + i < rows; ++i)
              for (int v = 0; v < Scores::kKeyVectors; ++v) {
                F sv = s[i][v];  // scaled: the query rows carry the scale
                if (a.softcap > 0.f) sv = vsoftcap(sv, a.softcap);
                S::store(P + (r0 + i) * kAttnBK + c + v * W, sv);
              }
          }
        }
        // online softmax per row, over the keys that row sees
        for (int64_t r = 0; r < rows; ++r) {
          float* p = P + r * kAttnBK;
          const KeySpan seen = visible_keys(a, b, q0 + r % bq);
          const int64_t j_lo = std::clamp<int64_t>(seen.lo - k0, 0, bk),
                        j_hi = std::clamp<int64_t>(seen.hi - k0, j_lo, bk);
          for (int64_t j = 0; j < j_lo; ++j) p[j] = -std::numeric_limits<float>::infinity();
          for (int64_t j = j_hi; j < kAttnBK; ++j) p[j] = -std::numeric_limits<float>::infinity();
          F row_max = S::load(p);
          for (int64_t j = W; j < kAttnBK; j += W) row_max = S::max(row_max, S::load(p + j));
          const float mx = std::max(Mx[r], S::reduce_max(row_max));
          if (mx == -std::numeric_limits<float>::infinity()) {  // nothing visible yet in this row
            for (int64_t j = 0; j < kAttnBK; ++j) p[j] = 0.f;
            continue;
          }
          const float corr = std::exp(Mx[r] - mx);
          Mx[r] = mx;
          const F m = S::set1(mx);
          F sum = S::zero();
          for (int64_t j = 0; j < kAttnBK; j += W) {
            const F e = vexp(S::sub(S::load(p + j), m));
            S::store(p + j, e);
            sum = S::add(sum, e);
          }
          L[r] = L[r] * corr + S::reduce_add(sum);
          if (corr != 1.f) {
            const F vc = S::set1(corr);
            float* o = O + r * Dp;
            for (int64_t d = 0; d < Dp; d += W) S::store(o + d, S::mul(S::load(o + d), vc));
          }
        }
        // O += P V, four rows at a time
        for (int64_t r0 = 0; r0 < rows; r0 += 4) {
          const int rn = static_cast<int>(std::min<int64_t>(4, rows - r0));
          const float* p[4];
          float* o[4];
          for (int i = 0; i < 4; ++i) {
            p[i] = P + std::min(r0 + i, rows - 1) * kAttnBK;
            o[i] = O + std::min(r0 + i, rows - 1) * Dp;
          }
          Scores::accumulate(o, rn, p, V, bk, Dp);
        }
      }
      for (int64_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < bq; ++i) {
          const int64_t r = g * bq + i;
          const F inv = S::set1(L[r] > 0.f ? 1.f / L[r] : 0.f);
          T* dst = static_cast<T*>(a.o) + (qrow0 + i) * q_tok + (hkv * G + g) * D;
          for (int64_t d = 0; d < D; d += W) storec(dst + d, S::mul(S::load(O + r * Dp + d), inv), D - d);
        }
    }
  });
}

// ---------------------------------------------------------------------------------------
// decode

#include "kernels/attention_decode.h"

inline void register_attention(tnc::KernelTable& t) {
  for_each_float_type([&]<class T>(tnc::DType d) {
    t.add<tnc::AttentionArgs>("attention", d, attention<T>);
    t.add<tnc::AttentionArgs>("attention_decode", d, attention_decode<T>);
  });
}
