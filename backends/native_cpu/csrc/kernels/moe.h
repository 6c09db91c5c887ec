// The moe family: the router (FusedTopKOp) and the MoE block (FusedMoeFwdOp: routing, the
// selected experts, their weighted sum). Included inside a per-ISA namespace by
// kernels/families.h after kernels/gemm*.h and kernels/elementwise.h, whose skinny dot
// products and activations it uses; marshalling in bind/moe.cc.
//
// Routing (src/tileops/manifest/moe.yaml): scores are softmax over a token's logits (float32,
// accurate exp) or their sigmoid; the top_k experts by selection value are taken in
// descending order, a tie going to the lower id. The selection value is the logit itself
// where no bias is given (both scores are monotonic in it), else sigmoid + bias; weights
// are the unbiased scores, renormalised over the top_k on request.
//
// The block has two paths, both reading only the experts some token chose:
// - decode (at most kMoeDecodeTokens tokens): one parallel region streams the selected
//   experts' gate and up rows once, dotting each row with every token (a row is read from
//   memory once, the other tokens' dots hit L1) and writing act(gate) * up; a second region
//   splits the hidden dim over threads, each streaming its rows of every selected expert's
//   w_down and accumulating the weighted sum of its output columns in float32 (each output
//   element is owned by one thread). The dot of one weight row is the policy `Rows`
//   (generic: kernels/gemm_skinny.h's skinny_nt_block; AVX-512 BF16: kernels/moe_avx512_bf16.h).
// - prefill: the (token, slot) pairs are grouped by expert with a counting sort, the token
//   rows gathered, and each chosen expert runs the table's GEMM of this dtype (MoeArgs::gemm:
//   the packed, direct-NT or skinny paths of the gemm family) for gate_up, then one region
//   applies act(gate) * up to every row, each expert's down GEMM follows, and the weighted
//   sum is taken per token (one thread per output row) in float32.
// The intermediate act(gate) * up is rounded to the storage type on both paths, as the
// prefill GEMMs' results are.
#pragma once
// (no includes here on purpose: see kernels/common.h)

constexpr int64_t kMoeDecodeTokens = 4;

// ---------------------------------------------------------------------------------------
// routing

// a ranks above b: larger, or NaN over a number (torch.sort's descending order). Equal
// values do not: scanning ids upwards keeps the lower one.
inline bool ranks_above(float a, float b) { return a > b || (a != a && b == b); }

// Floats a router needs per token: scores, selection values, taken flags.
inline size_t route_scratch(int64_t experts) { return static_cast<size_t>(3 * (experts + W)); }

// One token: logits[E] -> weights[K] (float32) and ids[K], descending by selection value.
template <class T>
inline void route_one(const T* logits, const float* bias, int64_t E, int64_t K, tnc::MoeScoring scoring, bool renormalize,
                      float* work, float* weights, int32_t* ids) {
  float* scores = work;
  float* select = work + E + W;
  float* taken = select + E + W;
  for (int64_t e = 0; e < E; e += W) storec(scores + e, loadc(logits + e, E - e), E - e);
  if (bias == nullptr) std::memcpy(select, scores, static_cast<size_t>(E) * sizeof(float));
  float inv_sum = 1.f;
  if (scoring == tnc::MoeScoring::softmax) {
    const F top = S::set1(max_run(scores, E));
    for (int64_t e = 0; e < E; e += W) storec(scores + e, vexp<false>(S::sub(loadc(scores + e, E - e), top)), E - e);
    inv_sum = 1.f / sum_run(scores, E);
  } else {
    for (int64_t e = 0; e < E; e += W)
      storec(scores + e, vrcp<false>(S::add(S::set1(1.f), vexp_neg<false>(loadc(scores + e, E - e)))), E - e);
  }
  if (bias != nullptr)
    for (int64_t e = 0; e < E; ++e) select[e] = scores[e] + bias[e];
  for (int64_t e = 0; e < E; ++e) taken[e] = 0.f;
  float sum = 0.f;
  for (int64_t k = 0; k < K; ++k) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e)
      if (taken[e] == 0.f && (best < 0 || ranks_above(select[e], select[best]))) best = e;
    taken[best] = 1.f;
    ids[k] = static_cast<int32_t>(best);
    weights[k] = scores[best] * inv_sum;
    sum += weights[k];
  }
  if (renormalize)
    for (int64_t k = 0; k < K; ++k) weights[k] /= sum;
}

template <class T>
void route_tokens(const T* logits, const float* bias, int64_t tokens, int64_t E, int64_t K, tnc::MoeScoring scoring,
                  bool renormalize, float* weights, int32_t* ids, int threads) {
  tnc::parallel_for(tokens, std::max<int64_t>(1, 4096 / std::max<int64_t>(E, 1)), threads, [&](int64_t t0, int64_t t1) {
    float* work = scratch(route_scratch(E), 0);
    for (int64_t t = t0; t < t1; ++t)
      route_one(logits + t * E, bias, E, K, scoring, renormalize, work, weights + t * K, ids + t * K);
  });
}

template <class T>
void fused_topk(const tnc::TopKArgs& a, int threads) {
  route_tokens(static_cast<const T*>(a.logits), a.bias, a.tokens, a.experts, a.top_k, a.scoring, a.renormalize, a.weights,
               a.ids, threads);
}

// ---------------------------------------------------------------------------------------
// the MoE block

// Byte buffers of the block on the calling thread, kept between calls (so a warm call
// takes no page faults); apart from scratch(), which the GEMMs it calls use.
inline void* moe_buffer(size_t bytes, int slot) {
  thread_local std::vector<uint64_t> buffers[6];
  std::vector<uint64_t>& b = buffers[slot];
  if (b.size() * sizeof(uint64_t) < bytes + 64) b.resize(bytes / sizeof(uint64_t) + 16);
  return b.data();
}
template <class U>
inline U* moe_array(int64_t count, int slot) {
  return static_cast<U*>(moe_buffer(static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(U), slot));
}

// The decode path's dot of one weight row with up to kMoeDecodeTokens activation rows:
// activations widened to float and zero-padded to whole vectors, skinny_nt_block of the
// gemm family per row (one accumulator per activation row).
template <class T>
struct WidenedDecodeRows {
  using A = float;
  static int64_t padded(int64_t k) { return (k + W - 1) / W * W; }
  static A from_storage(T v) { return tnc::to_float(v); }
  static A rounded(float v) { return tnc::to_float(tnc::from_float<T>(v)); }
  template <int MR>
  static void dot(const A* ap, int64_t kp, const T* row, int64_t k, float out[MR]) {
    float o[MR][1];
    skinny_nt_block<T, MR, 1>(ap, kp, row, k, k, 1, o);
    for (int r = 0; r < MR; ++r) out[r] = o[r][0];
  }
};

template <class Fn>
inline void with_decode_rows(int64_t m, Fn&& fn) {
  switch (m) {
    case 1: fn(std::integral_constant<int, 1>{}); break;
    case 2: fn(std::integral_constant<int, 2>{}); break;
    case 3: fn(std::integral_constant<int, 3>{}); break;
    default: fn(std::integral_constant<int, 4>{}); break;
  }
}

template <class T, class Act, class Rows>
void moe_decode(const tnc::MoeArgs& a, int threads) {
  using A = typename Rows::A;
  const int64_t tokens = a.tokens, E = a.experts, K = a.top_k, H = a.hidden, Fz = a.ffn;
  const int64_t kph = Rows::padded(H), kpf = Rows::padded(Fz);
  const T* x = static_cast<const T*>(a.x);
  const T* wgu = static_cast<const T*>(a.w_gate_up);
  const T* wd = static_cast<const T*>(a.w_down);
  T* out = static_cast<T*>(a.out);

  // routing, on this thread: a handful of tokens
  float* weights = moe_array<float>(tokens * K, 0);
  int32_t* ids = moe_array<int32_t>(tokens * K, 1);
  float* work = moe_array<float>(static_cast<int64_t>(route_scratch(E)), 2);
  for (int64_t t = 0; t < tokens; ++t)
    route_one(a.logits + t * E, a.bias, E, K, a.scoring, a.renormalize, work, weights + t * K, ids + t * K);
  // the distinct experts chosen, in the order first chosen; share[u * tokens + t] is token
  // t's weight for expert u and chosen[...] whether t chose it at all
  int32_t* experts = moe_array<int32_t>(tokens * K, 3);
  float* share = moe_array<float>(tokens * K * tokens, 4);
  uint8_t* chosen = moe_array<uint8_t>(tokens * K * tokens, 5);
  int64_t used = 0;
  for (int64_t i = 0; i < tokens * K; ++i) {
    int64_t u = 0;
    while (u < used && experts[u] != ids[i]) ++u;
    if (u == used) {
      experts[used++] = ids[i];
      for (int64_t t = 0; t < tokens; ++t) share[u * tokens + t] = 0.f, chosen[u * tokens + t] = 0;
    }
    share[u * tokens + i / K] += weights[i];
    chosen[u * tokens + i / K] = 1;
  }
  // the tokens as the dot's activations, and act(gate) * up per (expert, token), padded
  A* xa = reinterpret_cast<A*>(scratch(static_cast<size_t>(tokens * kph) * sizeof(A) / sizeof(float) + W, 0));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < kph; ++i) xa[t * kph + i] = i < H ? Rows::from_storage(x[t * H + i]) : A{};
  A* ha = reinterpret_cast<A*>(scratch(static_cast<size_t>(used * tokens * kpf) * sizeof(A) / sizeof(float) + W, 1));
  for (int64_t r = 0; r < used * tokens; ++r)
    for (int64_t i = Fz; i < kpf; ++i) ha[r * kpf + i] = A{};

  with_decode_rows(tokens, [&](auto mr) {
    constexpr int MR = decltype(mr)::value;
    // gate and up rows: blocks of kRows rows of one expert, each row read once
    constexpr int64_t kRows = 16;
    const int64_t blocks = (Fz + kRows - 1) / kRows;
    tnc::parallel_for(used * blocks, 1, threads, [&](int64_t i0, int64_t i1) {
      alignas(64) float gate[MR][kRows + 16], up[MR][kRows + 16];
      for (int64_t item = i0; item < i1; ++item) {
        const int64_t u = item / blocks, j0 = (item % blocks) * kRows, rows = std::min(kRows, Fz - j0);
        const T* w = wgu + static_cast<int64_t>(experts[u]) * 2 * Fz * H;
        for (int64_t j = 0; j < rows; ++j) {
          float g[MR], v[MR];
          Rows::template dot<MR>(xa, kph, w + (j0 + j) * H, H, g);
          Rows::template dot<MR>(xa, kph, w + (Fz + j0 + j) * H, H, v);
          for (int r = 0; r < MR; ++r) gate[r][j] = g[r], up[r][j] = v[r];
        }
        for (int r = 0; r < MR; ++r) {
          alignas(64) float h[kRows + 16];
          for (int64_t j = 0; j < rows; j += W)
            storec(h + j, S::mul(unary_apply<T, Act>(loadc(gate[r] + j, rows - j)), loadc(up[r] + j, rows - j)), rows - j);
          A* dst = ha + (u * tokens + r) * kpf + j0;
          for (int64_t j = 0; j < rows; ++j) dst[j] = Rows::rounded(h[j]);
        }
      }
    });
    // down rows: each thread owns blocks of output columns and reads those rows of every
    // chosen expert's w_down
    constexpr int64_t kCols = 32;
    const int64_t col_blocks = (H + kCols - 1) / kCols;
    tnc::parallel_for(col_blocks, 1, threads, [&](int64_t b0, int64_t b1) {
      alignas(64) float acc[MR][kCols];
      for (int64_t blk = b0; blk < b1; ++blk) {
        const int64_t c0 = blk * kCols, cols = std::min(kCols, H - c0);
        for (int r = 0; r < MR; ++r)
          for (int64_t c = 0; c < kCols; ++c) acc[r][c] = 0.f;
        for (int64_t u = 0; u < used; ++u) {
          const T* w = wd + static_cast<int64_t>(experts[u]) * H * Fz;
          const A* hu = ha + u * tokens * kpf;
          for (int64_t c = 0; c < cols; ++c) {
            float y[MR];
            Rows::template dot<MR>(hu, kpf, w + (c0 + c) * Fz, Fz, y);
            for (int r = 0; r < MR; ++r)
              if (chosen[u * tokens + r]) acc[r][c] += share[u * tokens + r] * y[r];
          }
        }
        const F scale = S::set1(a.scale);
        for (int r = 0; r < MR; ++r)
          for (int64_t c = 0; c < cols; c += W) storec(out + r * H + c0 + c, S::mul(scale, loadc(acc[r] + c, cols - c)), cols - c);
      }
    });
  });
}

template <class T, class Act>
void moe_prefill(const tnc::MoeArgs& a, int threads) {
  const int64_t tokens = a.tokens, E = a.experts, K = a.top_k, H = a.hidden, Fz = a.ffn, pairs = tokens * K;
  const T* x = static_cast<const T*>(a.x);
  const T* wgu = static_cast<const T*>(a.w_gate_up);
  const T* wd = static_cast<const T*>(a.w_down);
  T* out = static_cast<T*>(a.out);

  float* weights = moe_array<float>(pairs, 0);
  int32_t* ids = moe_array<int32_t>(pairs, 1);
  route_tokens(a.logits, a.bias, tokens, E, K, a.scoring, a.renormalize, weights, ids, threads);

  // counting sort of the (token, slot) pairs by expert: rows [start[e], start[e + 1]) of
  // the gathered buffers are expert e's, in token order; row_of[pair] is the pair's row
  int64_t* start = moe_array<int64_t>(E + 1, 2);
  int32_t* row_of = moe_array<int32_t>(2 * pairs, 3);
  int32_t* pair_at = row_of + pairs;
  for (int64_t e = 0; e <= E; ++e) start[e] = 0;
  for (int64_t i = 0; i < pairs; ++i) ++start[ids[i] + 1];
  for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
  {
    int64_t* next = moe_array<int64_t>(E, 4);
    for (int64_t e = 0; e < E; ++e) next[e] = start[e];
    for (int64_t i = 0; i < pairs; ++i) {
      const int64_t row = next[ids[i]]++;
      row_of[i] = static_cast<int32_t>(row);
      pair_at[row] = static_cast<int32_t>(i);
    }
  }
  // one buffer: gathered tokens [pairs, H], gate_up [pairs, 2F], act [pairs, F], down [pairs, H]
  T* xs = moe_array<T>(pairs * (2 * H + 3 * Fz), 5);
  T* gu = xs + pairs * H;
  T* hs = gu + pairs * 2 * Fz;
  T* ys = hs + pairs * Fz;
  tnc::parallel_for(pairs, row_grain(H), threads, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      std::memcpy(xs + r * H, x + (pair_at[r] / K) * H, static_cast<size_t>(H) * sizeof(T));
  });
  auto expert_gemm = [&](const T* lhs, const T* weight, T* result, int64_t rows, int64_t n, int64_t k) {
    tnc::GemmArgs g{};
    g.a = lhs;
    g.b = weight;
    g.d = result;
    g.batch = 1;
    g.m = rows;
    g.n = n;
    g.k = k;
    g.a_row = k;
    g.a_col = 1;
    g.b_row = 1;  // weight [n, k]: element (kk, j) of B = weight^T at j * k + kk
    g.b_col = k;
    a.gemm(g, threads);
  };
  for (int64_t e = 0; e < E; ++e) {
    const int64_t rows = start[e + 1] - start[e];
    if (rows > 0) expert_gemm(xs + start[e] * H, wgu + e * 2 * Fz * H, gu + start[e] * 2 * Fz, rows, 2 * Fz, H);
  }
  tnc::parallel_for(pairs, row_grain(Fz), threads, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* gate = gu + r * 2 * Fz;
      T* h = hs + r * Fz;
      for (int64_t j = 0; j < Fz; j += W)
        storec(h + j, S::mul(unary_apply<T, Act>(loadc(gate + j, Fz - j)), loadc(gate + Fz + j, Fz - j)), Fz - j);
    }
  });
  for (int64_t e = 0; e < E; ++e) {
    const int64_t rows = start[e + 1] - start[e];
    if (rows > 0) expert_gemm(hs + start[e] * Fz, wd + e * H * Fz, ys + start[e] * H, rows, H, Fz);
  }
  // the weighted sum, one token per task: its output row is written by one thread only
  tnc::parallel_for(tokens, std::max<int64_t>(1, row_grain(H) / std::max<int64_t>(K, 1)), threads, [&](int64_t t0, int64_t t1) {
    float* acc = scratch(static_cast<size_t>(H + W), 0);
    const F scale = S::set1(a.scale);
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t c = 0; c < H; c += W) storec(acc + c, S::zero(), H - c);
      for (int64_t k = 0; k < K; ++k) {
        const F w = S::set1(weights[t * K + k]);
        const T* y = ys + static_cast<int64_t>(row_of[t * K + k]) * H;
        for (int64_t c = 0; c < H; c += W) storec(acc + c, S::fma(w, loadc(y + c, H - c), loadc(acc + c, H - c)), H - c);
      }
      for (int64_t c = 0; c < H; c += W) storec(out + t * H + c, S::mul(scale, loadc(acc + c, H - c)), H - c);
    }
  });
}

template <class T, class Act, class Rows = WidenedDecodeRows<T>>
void fused_moe(const tnc::MoeArgs& a, int threads) {
  if (a.tokens == 0) return;
  if (a.tokens <= kMoeDecodeTokens) {
    moe_decode<T, Act, Rows>(a, threads);
    return;
  }
  moe_prefill<T, Act>(a, threads);
}

// ---------------------------------------------------------------------------------------

inline void register_moe(tnc::KernelTable& t) {
  for_each_float_type([&]<class T>(tnc::DType d) { t.add<tnc::TopKArgs>("fused_topk", d, fused_topk<T>); });
  t.add<tnc::MoeArgs>("fused_moe", tnc::DType::f16, fused_moe<half_t, Silu>, static_cast<int>(tnc::MoeActivation::silu_and_mul));
  t.add<tnc::MoeArgs>("fused_moe", tnc::DType::f16, fused_moe<half_t, Gelu>, static_cast<int>(tnc::MoeActivation::gelu_and_mul));
  t.add<tnc::MoeArgs>("fused_moe", tnc::DType::bf16, fused_moe<bf16_t, Silu>, static_cast<int>(tnc::MoeActivation::silu_and_mul));
  t.add<tnc::MoeArgs>("fused_moe", tnc::DType::bf16, fused_moe<bf16_t, Gelu>, static_cast<int>(tnc::MoeActivation::gelu_and_mul));
}
