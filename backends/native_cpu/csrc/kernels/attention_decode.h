// The attention family's decode path: one query per request, each request's keys streamed
// once. Included by kernels/attention.h, inside the per-ISA namespace and after the
// family's shared helpers (visible_keys, key_rows, vsoftcap).
#pragma once
// (no includes here on purpose: see kernels/common.h)

// How decode computes its dot products, here in float: the query rows are scaled floats
// [H][Dp]; a register block of partial dot products (kKeys keys x 4 query heads, one K row
// load serving four heads) is a run of broadcast-free FMAs; P V accumulates the float
// probabilities [H][W] into float rows of O. Channels are read as load_pair reads them
// (2W at a time; for bfloat16 on AVX2, even channels in one vector and odd ones in the
// other, widened by a shift and a mask instead of a cross-lane widening), so the query and
// O rows keep that order (o_index) and only the final write puts channels back in order.
// The register blocks are sized by the ISA's registers: with 16 (AVX2), blocks of 4 keys x
// 4 heads of scores and 4 heads x 4 vectors of P V kept some accumulators on the stack
// inside their loops, so there the blocks are 2 keys and one pair of vectors. An
// ISA extension
// (kernels/attention_avx512_bf16.h) keeps bfloat16 operands instead, with its own query,
// probability and O layouts; attention_decode sees them only through these members.
template <class T>
struct FloatDecode {
  static constexpr bool kScaled = true;  // scores() returns scaled dot products
  static constexpr int kKeys = S::kRegisters >= 32 ? 4 : 2;            // keys of a block of scores
  static constexpr int kValuePairs = S::kRegisters >= 32 ? 2 : 1;      // pairs of vectors of a P V block
  static constexpr int64_t kPair = 2 * W;                               // channels load_pair reads
  static int64_t o_stride(int64_t D) { return (D + kPair - 1) / kPair * kPair; }
  // where channel d sits in a row of Q or O: load_pair's lane order
  static int64_t o_index(int64_t d) {
    if constexpr (kPairsPermute<T>) {
      const int64_t r = d % kPair;
      return d - r + (r % 2) * W + r / 2;
    } else {
      return d;
    }
  }
  static int64_t query_floats(int64_t H, int64_t D) { return H * o_stride(D); }
  static void load_query(float* q, int64_t h, const T* src, int64_t D, float scale) {
    float* row = q + h * o_stride(D);
    const F s = S::set1(scale);
    for (int64_t d = 0; d < D; d += kPair) {
      F lo, hi;
      load_channels(src, d, D, lo, hi);
      S::store(row + d, S::mul(lo, s));
      S::store(row + d + W, S::mul(hi, s));
    }
  }
  // channels [d, d + 2W) of row p as load_pair gives them; zeros past D (a row's last
  // channels: the memory after them may be another head's, or the end of the cache)
  static void load_channels(const T* p, int64_t d, int64_t D, F& a, F& b) {
    if (D - d >= kPair) {
      load_pair(p + d, a, b);
      return;
    }
    alignas(64) T part[kPair] = {};
    std::copy_n(p + d, D - d, part);
    load_pair(static_cast<const T*>(part), a, b);
  }
  // How scores() and accumulate() read the pair at channel `at` of a row: whole pairs
  // straight from it, a row's last pair through load_channels.
  struct WholePair {
    void operator()(const T* p, int64_t at, F& lo, F& hi) const { load_pair(p + at, lo, hi); }
  };
  struct LastPair {
    int64_t D;
    void operator()(const T* p, int64_t at, F& lo, F& hi) const { load_channels(p, at, D, lo, hi); }
  };
  // acc[jj][i]: W lanes of partial dot products of key kr[jj] with query head h0 + i
  // (heads past gn repeat the last live one)
  static void scores(const float* q, int64_t h0, int gn, const T* const kr[kKeys], int64_t D, F acc[kKeys][4]) {
    const int64_t Dp = o_stride(D), whole = D / kPair * kPair;
    const float* qr[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) qr[i] = q + (h0 + std::min(i, gn - 1)) * Dp;
#pragma GCC unroll 4
    for (int jj = 0; jj < kKeys; ++jj)
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) acc[jj][i] = S::zero();
    // each half of the pair: the 4 heads' query vectors loaded once for every key
    auto step = [&](int64_t d, auto load) {
      F k[kKeys][2];
#pragma GCC unroll 4
      for (int jj = 0; jj < kKeys; ++jj) load(kr[jj], d, k[jj][0], k[jj][1]);
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        F qv[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) qv[i] = S::load(qr[i] + d + half * W);
#pragma GCC unroll 4
        for (int jj = 0; jj < kKeys; ++jj)
#pragma GCC unroll 4
          for (int i = 0; i < 4; ++i) acc[jj][i] = S::fma(qv[i], k[jj][half], acc[jj][i]);
      }
    };
    int64_t d = 0;
    for (; d < whole; d += kPair) step(d, WholePair{});
    if (d < Dp) step(d, LastPair{D});
  }
  static int64_t prob_floats(int64_t H) { return H * W; }
  static void store_probs(float* P, int64_t h, F p) { S::store(P + h * W, p); }
  // O rows h0 .. h0 + gn - 1 += P[h][j] V[row[j]] over keys j0 <= j < j1, in register
  // blocks of (4 heads x kValuePairs pairs of vectors); a dead head repeats the last live
  // one (same row, same sums, so its store is harmless: a conditional one made GCC keep acc
  // in memory)
  static void accumulate(float* O, int64_t h0, int gn, const float* P, const T* vbase, const int64_t* row, int j0,
                         int j1, int64_t kv_tok, int64_t D) {
    const int64_t Dp = o_stride(D);
    constexpr int64_t kBlock = kValuePairs * kPair;
    int64_t d0 = 0;
    for (; d0 + kBlock <= D; d0 += kBlock)
      accumulate_block<kValuePairs>(O, h0, gn, P, vbase, row, j0, j1, kv_tok, d0, Dp, WholePair{});
    for (; d0 < Dp; d0 += kPair)  // the last channels, a pair at a time
      accumulate_block<1>(O, h0, gn, P, vbase, row, j0, j1, kv_tok, d0, Dp, LastPair{D});
  }
  template <int Pairs, class Load>
  static void accumulate_block(float* O, int64_t h0, int gn, const float* P, const T* vbase, const int64_t* row, int j0,
                               int j1, int64_t kv_tok, int64_t d0, int64_t Dp, Load load) {
    const float* prow[4];
    float* orow[4];
    F acc[4][2 * Pairs];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const int64_t h = h0 + std::min(i, gn - 1);
      prow[i] = P + h * W;
      orow[i] = O + h * Dp + d0;
#pragma GCC unroll 4
      for (int v = 0; v < 2 * Pairs; ++v) acc[i][v] = S::load(orow[i] + v * W);
    }
    for (int j = j0; j < j1; ++j) {
      const T* vr = vbase + row[j] * kv_tok;
      F vv[2 * Pairs];
#pragma GCC unroll 2
      for (int c = 0; c < Pairs; ++c) load(vr, d0 + c * kPair, vv[2 * c], vv[2 * c + 1]);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const F pj = S::set1(prow[i][j]);
#pragma GCC unroll 4
        for (int v = 0; v < 2 * Pairs; ++v) acc[i][v] = S::fma(pj, vv[v], acc[i][v]);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < 2 * Pairs; ++v) S::store(orow[i] + v * W, acc[i][v]);
  }
};

// Finishes a register block of decode scores: the 4 x Keys vectors of partial dot products
// (acc[jj][i]: key j0 + jj, head h0 + i) are summed by transpose-adds of W rows taken head
// by head, and head i's jn dot products go to Sc[h0 + i][j0, j0 + jn). (Keeping the
// vectors for one transpose-add per head later took a buffer of H x W x W floats, the
// whole L1 at 32 heads, written and read back once per block.)
template <int Keys>
inline void finish_scores(const F (&acc)[Keys][4], float* Sc, int64_t h0, int gn, int j0, int jn) {
  constexpr int kRows = 4 * Keys;
  static_assert(kRows % W == 0, "a block of scores is whole transpose-adds");
  F rows[kRows];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
#pragma GCC unroll 4
    for (int jj = 0; jj < Keys; ++jj) rows[i * Keys + jj] = acc[jj][i];
  alignas(64) float sums[kRows];
  for (int t = 0; t < kRows; t += W) S::store(sums + t, S::transpose_add(rows + t));
  // all Keys lanes where a row of Sc has them (one short move, not a loop of jn): the lanes
  // of dead keys (j0 + jn and on) hold a live key's repeat and are masked by the softmax
  const int n = W >= Keys ? Keys : jn;
  for (int i = 0; i < gn; ++i) std::copy_n(sums + Keys * i, n, Sc + (h0 + i) * W + j0);
}

// Asks for the bytes [p, p + bytes) to be brought into the L2 (a software prefetch per
// cache line; locality 2 is prefetcht1 on x86).
inline void prefetch_l2(const void* p, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(static_cast<const char*>(p) + at, 0, 2);
}

// Decode: one query per request (every q_len is 1). Memory-bound on K and V, which are
// streamed once: a task owns a range of the positions one request sees and walks it in
// blocks of W positions. Within a block, work follows the addresses: scores for a few keys at a
// time over every KV head (a token's row holds every KV head: 4 rows are read front to
// back), then the online softmax of every head, then P V over the block's keys (up to 16)
// for every KV head, so that K and V are each read as a few forward streams. Every query
// head of a group is served by the same load of a K or V row; each register block's dot
// products are finished by one transpose-add (finish_scores: no horizontal reduction per
// key); the softmax is vectorised over the block's keys and rescales O only when a head's
// maximum grows.
// The keys two blocks ahead are prefetched into the L2 in small pieces between the
// register blocks that read the same rows of this block, so memory is busy while the core
// computes. (Prefetches to the L1, or touching the next block before computing it, left
// memory idle during the arithmetic; head-major order kept the stream prefetchers idle.)
// Positions are split when the batch alone cannot keep every thread busy; the splits are
// merged at the end.
template <class T, class Policy = FloatDecode<T>>
void attention_decode(const tnc::AttentionArgs& a, int threads) {
  constexpr int kKeys = Policy::kKeys;
  const int64_t D = a.head_dim, G = a.heads / a.heads_kv, H = a.heads, Hkv = a.heads_kv;
  const int64_t groups = a.batch * Hkv, ostride = Policy::o_stride(D);
  int64_t N = 0, fewest = std::numeric_limits<int64_t>::max();  // the most and fewest positions a request sees
  for (int64_t b = 0; b < a.batch; ++b) {
    const KeySpan seen = visible_keys(a, b, 0);
    N = std::max(N, seen.hi - seen.lo);
    fewest = std::min(fewest, seen.hi - seen.lo);
  }
  int64_t splits = 1;
  if (a.batch < 4 * threads) {
    // requests of one length: the fewest splits that give every thread the same work (each
    // split loads every query row and is merged, so more splits only cost time); uneven
    // lengths: 4 items a thread, so that a thread done
    // with a short request takes another
    const int64_t even = threads / std::gcd<int64_t>(a.batch, threads);
    const int64_t want = fewest == N ? even : (4 * threads + a.batch - 1) / a.batch;
    splits = std::max<int64_t>(1, std::min<int64_t>(want, N * groups / (256 * a.batch)));
  }
  // each split's (max, denominator, O) per head, merged below; one split per request writes
  // its result directly (no buffer, no second parallel region)
  const int64_t part_stride = ostride + 2;
  std::vector<float> parts(splits > 1 ? static_cast<size_t>(groups * splits * G * part_stride) : 0);
  const int64_t kv_tok = Hkv * D, slice_bytes = D * static_cast<int64_t>(sizeof(T));
  constexpr int kPrefetchBlocks = 2;  // how far ahead, in blocks of W positions
  // keys per P V pass over the KV heads: every O row is loaded and stored once per pass
  // (16 rather than 8: half the loads and stores of O per block)
  constexpr int kValueKeys = 16;
  // a head's output row: its O row (in the policy's channel order) over the softmax sum l
  // (gathered into channel order 64 at a time, then scaled and converted by vectors: a
  // scalar conversion per channel was a visible share of a call at short lengths). The
  // order repeats every 64 channels (its period, 2W or 32, divides 64), so one table of it
  // serves every run: computing o_index per channel dominated a decode call over few
  // cached positions.
  alignas(64) int32_t order[64];
  for (int d = 0; d < 64; ++d) order[d] = static_cast<int32_t>(Policy::o_index(d));
  auto store_head = [D, &order](const float* o, float l, T* dst) {
    const F inv = S::set1(l > 0.f ? 1.f / l : 0.f);
    alignas(64) float row[64];
    for (int64_t d0 = 0; d0 < D; d0 += 64) {
      const int64_t n = std::min<int64_t>(64, D - d0);
      for (int64_t d = 0; d < n; ++d) row[d] = o[d0 + order[d]];
      for (int64_t d = 0; d < n; d += W) storec(dst + d0 + d, S::mul(loadc(row + d, n - d), inv), n - d);
    }
  };
  tnc::parallel_for(a.batch * splits, 1, threads, [&](int64_t i0, int64_t i1) {
    float* Q = scratch(
        static_cast<size_t>(Policy::query_floats(H, D) + H * ostride + 2 * H * W + H + Policy::prob_floats(H)), 0);
    float* O = Q + Policy::query_floats(H, D);
    float* Sc = O + H * ostride;  // [H][W]: each head's scores of the block's keys
    float* lsum = Sc + H * W;     // [H][W]: each head's softmax denominator, by lane
    float* mx = lsum + H * W;       // [H]: each head's running maximum
    float* P = mx + H;              // the block's probabilities, in the policy's layout
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t b = item / splits, sp = item % splits;
      const KeySpan seen = visible_keys(a, b, 0);
      const int64_t span = (seen.hi - seen.lo + splits - 1) / splits;
      const int64_t n0 = seen.lo + sp * span, n1 = std::min(seen.hi, n0 + span);
      for (int64_t h = 0; h < H; ++h) {
        Policy::load_query(Q, h, static_cast<const T*>(a.q) + (a.q_begin[b] * H + h) * D, D, a.scale);
        std::fill(O + h * ostride, O + (h + 1) * ostride, 0.f);
        mx[h] = -std::numeric_limits<float>::infinity();
        std::fill(lsum + h * W, lsum + (h + 1) * W, 0.f);
      }
      int64_t row[W], ahead[W];  // cache rows of this block's keys and of the block prefetched
      // the blocks before the first one the loop prefetches: asked for now, all at once
      // (a decode step's keys are cold, its weights having streamed through the caches)
      for (int64_t k0 = n0; k0 < std::min(n1, n0 + kPrefetchBlocks * W); k0 += W) {
        const int bk = static_cast<int>(std::min<int64_t>(W, n1 - k0));
        key_rows(a, b, k0, bk, ahead);
        for (int j = 0; j < bk; ++j) {
          prefetch_l2(static_cast<const T*>(a.k) + ahead[j] * kv_tok, Hkv * slice_bytes);
          prefetch_l2(static_cast<const T*>(a.v) + ahead[j] * kv_tok, Hkv * slice_bytes);
        }
      }
      for (int64_t k0 = n0; k0 < n1; k0 += W) {
        const int bk = static_cast<int>(std::min<int64_t>(W, n1 - k0));
        const int na = static_cast<int>(std::clamp<int64_t>(n1 - k0 - kPrefetchBlocks * W, 0, W));
        key_rows(a, b, k0, bk, row);
        key_rows(a, b, k0 + kPrefetchBlocks * W, na, ahead);
        if (bk < W)  // lanes of dead keys are masked below; keep them finite
          std::fill(Sc, Sc + H * W, 0.f);
        // scores: kKeys keys at a time, every KV head (each of their rows read front to back)
        for (int j0 = 0; j0 < bk; j0 += kKeys) {
          const int jn = std::min(kKeys, bk - j0);
          for (int64_t hkv = 0; hkv < Hkv; ++hkv) {
            for (int jj = j0; jj < std::min(j0 + kKeys, na); ++jj)
              prefetch_l2(static_cast<const T*>(a.k) + ahead[jj] * kv_tok + hkv * D, slice_bytes);
            const T* kr[kKeys];
            for (int jj = 0; jj < kKeys; ++jj)
              kr[jj] = static_cast<const T*>(a.k) + row[j0 + std::min(jj, jn - 1)] * kv_tok + hkv * D;
            for (int64_t g0 = 0; g0 < G; g0 += 4) {
              const int gn = static_cast<int>(std::min<int64_t>(4, G - g0));
              const int64_t h0 = hkv * G + g0;
              F acc[kKeys][4];
              Policy::scores(Q, h0, gn, kr, D, acc);
              finish_scores<kKeys>(acc, Sc, h0, gn, j0, jn);
            }
          }
        }
        // online softmax of every head over the block, vectorised over its keys
        for (int64_t h = 0; h < H; ++h) {
          F s = S::load(Sc + h * W);
          if constexpr (!Policy::kScaled) s = S::mul(s, S::set1(a.scale));
          if (a.softcap > 0.f) s = vsoftcap(s, a.softcap);
          if (bk < W) {
            alignas(64) float lanes[W];
            S::store(lanes, s);
            s = S::load_n(static_cast<const float*>(lanes), bk, -std::numeric_limits<float>::infinity());
          }
          const float blk_max = S::reduce_max(s);
          if (blk_max > mx[h]) {  // a new maximum: rescale what came before
            const float corr = mx[h] == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(mx[h] - blk_max);
            mx[h] = blk_max;
            const F vc = S::set1(corr);
            S::store(lsum + h * W, S::mul(S::load(lsum + h * W), vc));
            float* o = O + h * ostride;
            for (int64_t d = 0; d < ostride; d += W) S::store(o + d, S::mul(S::load(o + d), vc));
          }
          const F p = vexp<kHalfT<T>>(S::sub(s, S::set1(mx[h])));  // half results: the fast exp
          S::store(lsum + h * W, S::add(S::load(lsum + h * W), p));
          Policy::store_probs(P, h, p);
        }
        // O += P V: kValueKeys keys at a time, every KV head
        for (int j0 = 0; j0 < bk; j0 += kValueKeys) {
          const int j1 = std::min(bk, j0 + kValueKeys);
          for (int64_t hkv = 0; hkv < Hkv; ++hkv) {
            for (int jj = j0; jj < std::min(j1, na); ++jj)
              prefetch_l2(static_cast<const T*>(a.v) + ahead[jj] * kv_tok + hkv * D, slice_bytes);
            const T* vbase = static_cast<const T*>(a.v) + hkv * D;
            for (int64_t g0 = 0; g0 < G; g0 += 4)
              Policy::accumulate(O, hkv * G + g0, static_cast<int>(std::min<int64_t>(4, G - g0)), P, vbase, row, j0, j1,
                                 kv_tok, D);
          }
        }
      }
      for (int64_t h = 0; h < H; ++h) {
        const float l = S::reduce_add(S::load(lsum + h * W));
        if (splits == 1) {
          store_head(O + h * ostride, l, static_cast<T*>(a.o) + (a.q_begin[b] * H + h) * D);
          continue;
        }
        const int64_t grp = b * Hkv + h / G, g = h % G;
        float* part = parts.data() + ((grp * splits + sp) * G + g) * part_stride;
        part[0] = mx[h];
        part[1] = l;
        std::copy(O + h * ostride, O + (h + 1) * ostride, part + 2);
      }
    }
  });
  if (splits == 1) return;
  // merge the splits of each (sequence, head): in a stack buffer, or for a head_dim above
  // 1024 in the thread's scratch (free again once the region above is done)
  auto merge = [&](int64_t hg, float* acc) {
    const int64_t grp = hg / G, g = hg % G;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t sp = 0; sp < splits; ++sp)
      m = std::max(m, parts[static_cast<size_t>(((grp * splits + sp) * G + g) * part_stride)]);
    float l = 0.f;
    std::fill(acc, acc + ostride, 0.f);
    for (int64_t sp = 0; sp < splits; ++sp) {
      const float* part = parts.data() + ((grp * splits + sp) * G + g) * part_stride;
      if (part[1] == 0.f) continue;
      const float w = std::exp(part[0] - m);
      l += part[1] * w;
      for (int64_t d = 0; d < ostride; ++d) acc[d] += part[2 + d] * w;
    }
    const int64_t b = grp / Hkv, hkv = grp % Hkv;
    store_head(acc, l, static_cast<T*>(a.o) + (a.q_begin[b] * a.heads + hkv * G + g) * D);
  };
  tnc::parallel_for(groups * G, 64, threads, [&](int64_t h0, int64_t h1) {
    for (int64_t hg = h0; hg < h1; ++hg) {
      if (ostride <= 1024) {
        float acc[1024];
        merge(hg, acc);
      } else {
        merge(hg, scratch(static_cast<size_t>(ostride), 0));
      }
    }
  });
}
