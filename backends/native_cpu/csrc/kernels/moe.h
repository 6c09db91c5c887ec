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
//   experts' gate and up rows once, dotting each row with the tokens that chose its expert
//   (the row is read once for all of them) and writing act(gate) * up; a second region
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
constexpr int64_t kMoeGateRows = 32;   // decode: gate (and up) rows per task
constexpr int64_t kMoeDownCols = 128;  // decode: output columns (w_down rows) per task

// Weights of `count` elements asked for ahead of their dots, one cache line at a time.
// Within a forward run of rows the hardware prefetcher keeps up (as for the GEMV); the
// decode tasks ask only where the next rows are elsewhere (gate -> up rows, one expert or
// task -> the next), where it would start over.
template <class T>
inline void prefetch_row(const T* p, int64_t count) {
  const char* c = reinterpret_cast<const char*>(p);
  const int64_t bytes = count * static_cast<int64_t>(sizeof(T));
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(c + i, 0, 3);
}

// ---------------------------------------------------------------------------------------
// routing

// a ranks above b: larger, or NaN over a number (torch.sort's descending order). Equal
// values do not: scanning ids upwards keeps the lower one.
inline bool ranks_above(float a, float b) { return a > b || (a != a && b == b); }

// Floats a router needs per token: scores, selection values, and those of the best kept.
inline size_t route_scratch(int64_t experts, int64_t top_k) { return static_cast<size_t>(2 * (experts + W) + top_k); }

// One token: logits[E] -> weights[K] (float32) and ids[K], descending by selection value.
template <class T>
inline void route_one(const T* logits, const float* bias, int64_t E, int64_t K, tnc::MoeScoring scoring,
                      bool renormalize, float* work, float* weights, int32_t* ids) {
  float* scores = work;
  float* select = work + E + W;  // the logits, unless a bias makes it sigmoid + bias
  float* kept_value = select + E + W;
  // the logits as float, their max, and whether any is NaN or infinite (x - x is then NaN)
  F most = S::set1(-std::numeric_limits<float>::infinity()), special = S::zero();
  for (int64_t e = 0; e < E; e += W) {
    const F v = loadc(logits + e, E - e);
    storec(select + e, v, E - e);
    most = S::max(most, loadc(logits + e, E - e, -std::numeric_limits<float>::infinity()));
    special = S::add(special, S::sub(v, v));
  }
  const bool finite = S::reduce_add(special) == 0.f;
  float inv_sum = 1.f;
  if (scoring == tnc::MoeScoring::softmax) {
    const F top = S::set1(finite ? S::reduce_max(most) : max_run(select, E));
    for (int64_t e = 0; e < E; e += W) storec(scores + e, vexp<false>(S::sub(loadc(select + e, E - e), top)), E - e);
    inv_sum = 1.f / sum_run(scores, E);
  } else {
    for (int64_t e = 0; e < E; e += W)
      storec(scores + e, vrcp<false>(S::add(S::set1(1.f), vexp_neg<false>(loadc(select + e, E - e)))), E - e);
  }
  if (bias != nullptr)
    for (int64_t e = 0; e < E; e += W)
      storec(select + e, S::add(loadc(scores + e, E - e), loadc(bias + e, E - e)), E - e);
  // one pass over the experts keeping the best K so far in order (ids[0..kept)); an
  // expert enters only if it ranks above the last kept one, and goes after every kept one
  // it does not rank above: equal values keep the lower id first. Past the first K experts
  // most fail the one comparison with the last kept (about K ln(E/K) enter).
  // (Values are kept beside the ids: comparing through select[ids[i]] made every step of
  // an insertion two dependent loads.)
  int64_t kept = 0;
  auto insert = [&](int64_t e, float v) {
    int64_t at = kept < K ? kept++ : K - 1;
    for (; at > 0 && ranks_above(v, kept_value[at - 1]); --at) {
      ids[at] = ids[at - 1];
      kept_value[at] = kept_value[at - 1];
    }
    ids[at] = static_cast<int32_t>(e);
    kept_value[at] = v;
  };
  if (finite && bias == nullptr) {  // no NaN to rank: one comparison with the last kept, in a register
    for (int64_t e = 0; e < K; ++e) insert(e, select[e]);
    float last = kept_value[K - 1];
    for (int64_t e = K; e < E; ++e) {
      const float v = select[e];
      if (v > last) {
        insert(e, v);
        last = kept_value[K - 1];
      }
    }
  }
  for (int64_t e = kept == K ? E : 0; e < E; ++e) {  // the general case (NaN ranks above numbers)
    if (kept < K || ranks_above(select[e], kept_value[K - 1])) insert(e, select[e]);
  }
  float sum = 0.f;
  for (int64_t k = 0; k < K; ++k) {
    weights[k] = scores[ids[k]] * inv_sum;
    sum += weights[k];
  }
  if (renormalize)
    for (int64_t k = 0; k < K; ++k) weights[k] /= sum;
}

template <class T>
void route_tokens(const T* logits, const float* bias, int64_t tokens, int64_t E, int64_t K, tnc::MoeScoring scoring,
                  bool renormalize, float* weights, int32_t* ids, int threads) {
  tnc::parallel_for(tokens, std::max<int64_t>(1, 4096 / std::max<int64_t>(E, 1)), threads, [&](int64_t t0, int64_t t1) {
    float* work = scratch(route_scratch(E, K), 0);
    for (int64_t t = t0; t < t1; ++t)
      route_one(logits + t * E, bias, E, K, scoring, renormalize, work, weights + t * K, ids + t * K);
  });
}

template <class T>
void fused_topk(const tnc::TopKArgs& a, int threads) {
  route_tokens(static_cast<const T*>(a.logits), a.bias, a.tokens, a.experts, a.top_k, a.scoring, a.renormalize,
               a.weights, a.ids, threads);
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

// The decode path's dots of two weight rows with up to kMoeDecodeTokens activation rows:
// activations widened to float and zero-padded to whole pairs of vectors, the gemm family's
// skinny_nt_block over the two rows (one accumulator per activation row and weight row);
// where the ISA reads T in pairs (bfloat16 on AVX2), activations go to pair order once
// filled (arrange()).
template <class T>
struct WidenedDecodeRows {
  using A = float;
  static constexpr bool kPairs = kPairsPermute<T>;
  static int64_t padded(int64_t k) { return (k + 2 * W - 1) / (2 * W) * (2 * W); }
  static A from_storage(T v) { return tnc::to_float(v); }
  static A rounded(float v) { return tnc::to_float(tnc::from_float<T>(v)); }
  static void arrange(A* rows, int64_t count, int64_t kp) {
    if constexpr (kPairs) to_pair_order<T>(rows, count, kp);
  }
  // out[r][j]: activation row r with weight rows row and row + ldb (nb = 1: the first only)
  template <int MR>
  static void dot2(const A* ap, int64_t kp, const T* row, int64_t ldb, int64_t k, int nb, float out[MR][2]) {
    skinny_nt_block<T, MR, 2, kPairs>(ap, kp, row, ldb, k, nb, out);
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
  float* work = moe_array<float>(static_cast<int64_t>(route_scratch(E, K)), 2);
  for (int64_t t = 0; t < tokens; ++t)
    route_one(a.logits + t * E, a.bias, E, K, a.scoring, a.renormalize, work, weights + t * K, ids + t * K);
  // the distinct experts chosen, in the order first chosen; expert u was chosen by
  // count[u] tokens, token_of[u * kMoeDecodeTokens + s] with weight share[...] (s < count[u])
  constexpr int64_t kT = kMoeDecodeTokens;
  int32_t* experts = moe_array<int32_t>(tokens * K, 3);
  int32_t* count = moe_array<int32_t>(tokens * K, 4);
  int32_t* token_of = moe_array<int32_t>(2 * tokens * K * kT, 5);
  float* share = reinterpret_cast<float*>(token_of + tokens * K * kT);
  int64_t used = 0;
  for (int64_t i = 0; i < tokens * K; ++i) {
    int64_t u = 0;
    while (u < used && experts[u] != ids[i]) ++u;
    if (u == used) experts[used] = ids[i], count[used++] = 0;
    token_of[u * kT + count[u]] = static_cast<int32_t>(i / K);
    share[u * kT + count[u]++] = weights[i];
  }
  // each expert's activations: the rows of the tokens that chose it (count[u] of them), and
  // act(gate) * up for those tokens; both padded with zeros
  A* xa = reinterpret_cast<A*>(scratch(static_cast<size_t>(used * kT * kph) * sizeof(A) / sizeof(float) + W, 0));
  for (int64_t u = 0; u < used; ++u)
    for (int64_t s = 0; s < count[u]; ++s) {
      const T* src = x + static_cast<int64_t>(token_of[u * kT + s]) * H;
      A* dst = xa + (u * kT + s) * kph;
      for (int64_t i = 0; i < kph; ++i) dst[i] = i < H ? Rows::from_storage(src[i]) : A{};
    }
  for (int64_t u = 0; u < used; ++u) Rows::arrange(xa + u * kT * kph, count[u], kph);
  A* ha = reinterpret_cast<A*>(scratch(static_cast<size_t>(used * kT * kpf) * sizeof(A) / sizeof(float) + W, 1));
  for (int64_t r = 0; r < used * kT; ++r)
    for (int64_t i = Fz; i < kpf; ++i) ha[r * kpf + i] = A{};

  // gate and up rows: blocks of kMoeGateRows rows of one expert; a block's gate rows, then
  // its up rows, each a forward run of memory, two rows at a time, dotted with the tokens
  // that chose the expert only
  const int64_t blocks = (Fz + kMoeGateRows - 1) / kMoeGateRows;
  tnc::parallel_for(used * blocks, 1, threads, [&](int64_t i0, int64_t i1) {
    alignas(64) float dots[2][kT][kMoeGateRows + 16];  // [gate | up][token of the expert][row]
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t u = item / blocks, j0 = (item % blocks) * kMoeGateRows, rows = std::min(kMoeGateRows, Fz - j0);
      const T* w = wgu + static_cast<int64_t>(experts[u]) * 2 * Fz * H;
      const A* xu = xa + u * kT * kph;
      with_decode_rows(count[u], [&](auto mr) {
        constexpr int MR = decltype(mr)::value;
        for (int half = 0; half < 2; ++half) {  // gate rows j0.., then up rows Fz + j0..
          const T* first = w + (half * Fz + j0) * H;
          for (int64_t j = 0; j < rows; j += 2) {
            const int nb = static_cast<int>(std::min<int64_t>(2, rows - j));
            if (j + 2 >= rows) {  // the next rows are elsewhere: this block's up rows, or the next task's gate rows
              if (half == 0) {
                prefetch_row(w + (Fz + j0) * H, 2 * H);
              } else if (item + 1 < i1) {
                const int64_t nu = (item + 1) / blocks, nj = ((item + 1) % blocks) * kMoeGateRows;
                prefetch_row(wgu + static_cast<int64_t>(experts[nu]) * 2 * Fz * H + nj * H, 2 * H);
              }
            }
            float d[MR][2];
            Rows::template dot2<MR>(xu, kph, first + j * H, H, H, nb, d);
            for (int r = 0; r < MR; ++r)
              for (int c = 0; c < nb; ++c) dots[half][r][j + c] = d[r][c];
          }
        }
      });
      for (int64_t r = 0; r < count[u]; ++r) {
        alignas(64) float h[kMoeGateRows + 16];
        for (int64_t j = 0; j < rows; j += W)
          storec(h + j, S::mul(unary_apply<T, Act>(loadc(dots[0][r] + j, rows - j)), loadc(dots[1][r] + j, rows - j)),
                 rows - j);
        A* dst = ha + (u * kT + r) * kpf + j0;
        for (int64_t j = 0; j < rows; ++j) dst[j] = Rows::rounded(h[j]);
      }
    }
  });
  for (int64_t u = 0; u < used; ++u) Rows::arrange(ha + u * kT * kpf, count[u], kpf);
  // down rows: each thread owns blocks of output columns and reads those rows of every
  // chosen expert's w_down (a forward run per expert), two rows at a time
  const int64_t col_blocks = (H + kMoeDownCols - 1) / kMoeDownCols;
  tnc::parallel_for(col_blocks, 1, threads, [&](int64_t b0, int64_t b1) {
    alignas(64) float acc[kT][kMoeDownCols];
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t c0 = blk * kMoeDownCols, cols = std::min(kMoeDownCols, H - c0);
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t c = 0; c < kMoeDownCols; ++c) acc[t][c] = 0.f;
      auto row = [&](int64_t u, int64_t c) { return wd + static_cast<int64_t>(experts[u]) * H * Fz + (c0 + c) * Fz; };
      for (int64_t u = 0; u < used; ++u) {
        const A* hu = ha + u * kT * kpf;
        with_decode_rows(count[u], [&](auto mr) {
          constexpr int MR = decltype(mr)::value;
          for (int64_t c = 0; c < cols; c += 2) {
            const int nb = static_cast<int>(std::min<int64_t>(2, cols - c));
            if (c + 2 >= cols && u + 1 < used) prefetch_row(row(u + 1, 0), 2 * Fz);  // the next expert's run
            float y[MR][2];
            Rows::template dot2<MR>(hu, kpf, row(u, c), Fz, Fz, nb, y);
            for (int r = 0; r < MR; ++r) {
              float* dst = acc[token_of[u * kT + r]] + c;
              const float wr = share[u * kT + r];
              for (int j = 0; j < nb; ++j) dst[j] += wr * y[r][j];
            }
          }
        });
      }
      const F scale = S::set1(a.scale);
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t c = 0; c < cols; c += W)
          storec(out + t * H + c0 + c, S::mul(scale, loadc(acc[t] + c, cols - c)), cols - c);
    }
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
  auto expert_gemm = [&](const T* lhs, const T* weight, T* result, int64_t rows, int64_t n, int64_t k,
                         int gemm_threads) {
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
    a.gemm(g, gemm_threads);
  };
  // Each expert's GEMMs are small (about T K / E rows): the experts are spread over the
  // threads, each GEMM on one thread, so no parallel region is paid per GEMM.
  auto each_expert = [&](auto&& run) {
    tnc::parallel_for(E, 1, threads, [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1; ++e)
        if (start[e + 1] > start[e]) run(e, start[e + 1] - start[e]);
    });
  };
  each_expert([&](int64_t e, int64_t rows) {
    expert_gemm(xs + start[e] * H, wgu + e * 2 * Fz * H, gu + start[e] * 2 * Fz, rows, 2 * Fz, H, 1);
  });
  tnc::parallel_for(pairs, row_grain(Fz), threads, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* gate = gu + r * 2 * Fz;
      T* h = hs + r * Fz;
      for (int64_t j = 0; j < Fz; j += W)
        storec(h + j, S::mul(unary_apply<T, Act>(loadc(gate + j, Fz - j)), loadc(gate + Fz + j, Fz - j)), Fz - j);
    }
  });
  each_expert([&](int64_t e, int64_t rows) {
    expert_gemm(hs + start[e] * Fz, wd + e * H * Fz, ys + start[e] * H, rows, H, Fz, 1);
  });
  // the weighted sum, one token per task: its output row is written by one thread only
  tnc::parallel_for(tokens, std::max<int64_t>(1, row_grain(H) / std::max<int64_t>(K, 1)), threads,
                    [&](int64_t t0, int64_t t1) {
                      float* acc = scratch(static_cast<size_t>(H + W), 0);
                      const F scale = S::set1(a.scale);
                      for (int64_t t = t0; t < t1; ++t) {
                        for (int64_t c = 0; c < H; c += W) storec(acc + c, S::zero(), H - c);
                        for (int64_t k = 0; k < K; ++k) {
                          const F w = S::set1(weights[t * K + k]);
                          const T* y = ys + static_cast<int64_t>(row_of[t * K + k]) * H;
                          for (int64_t c = 0; c < H; c += W)
                            storec(acc + c, S::fma(w, loadc(y + c, H - c), loadc(acc + c, H - c)), H - c);
                        }
                        for (int64_t c = 0; c < H; c += W)
                          storec(out + t * H + c, S::mul(scale, loadc(acc + c, H - c)), H - c);
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
  t.add<tnc::MoeArgs>("fused_moe", tnc::DType::f16, fused_moe<half_t, Silu>,
                      static_cast<int>(tnc::MoeActivation::silu_and_mul));
  t.add<tnc::MoeArgs>("fused_moe", tnc::DType::f16, fused_moe<half_t, Gelu>,
                      static_cast<int>(tnc::MoeActivation::gelu_and_mul));
  t.add<tnc::MoeArgs>("fused_moe", tnc::DType::bf16, fused_moe<bf16_t, Silu>,
                      static_cast<int>(tnc::MoeActivation::silu_and_mul));
  t.add<tnc::MoeArgs>("fused_moe", tnc::DType::bf16, fused_moe<bf16_t, Gelu>,
                      static_cast<int>(tnc::MoeActivation::gelu_and_mul));
}
