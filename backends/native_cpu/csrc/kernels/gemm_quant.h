// The quant family: GEMMs over GGUF rows of GGML blocks (GemmGgufFwdOp) and over 4-bit
// groups (GemmW4A16FwdOp), and lookups in a GGUF embedding table (EmbeddingGgufFwdOp).
// Written once over Simd; the ISA files replace the decode's row dots
// (kernels/gemm_quant_avx2.h, gemm_quant_avx512_vnni.h) and, on AVX-512 BF16, the prefill
// (gemm_quant_avx512_bf16.h), all through the drivers here.
//
// Decode (m <= kQuantDecodeMaxM): each activation row is quantized once per call to 8-bit
// blocks of 32 (a float scale each: kernels/quant_blocks.h), and each weight row is read
// once, as stored, by integer dot products against those codes: a weight row's bytes are
// the whole traffic of a decode step, so what matters is reading them at the memory's
// pace. Prefill: weights are dequantized a panel at a time into the float (or, on AVX-512
// BF16, bfloat16) panels the GEMM micro-kernels multiply, once per call.
// Included inside a per-ISA namespace by kernels/families.h; marshalling in bind/quant.cc.
#pragma once
// (no includes here on purpose: see kernels/common.h)

// Up to this many activation rows take the integer decode path; more, the panel GEMM.
constexpr int64_t kQuantDecodeMaxM = 16;

// ---------------------------------------------------------------------------------------
// the decode driver: quantize the activation, then row dots over N split among threads

// A decoder (the ISA's or the scalar one below) reads the activation in `layout` and gives
// `dot<MR>(j, act, r0, out)`: the dots of weight row j with activation rows r0..r0+MR-1.
// Rows of W are read in blocks of kQuantBlockRows against every group of four activation
// rows, so with more than four rows a block is read from memory once and from cache after.
constexpr int64_t kQuantBlockRows = 16;

template <class T, class Dec>
void quant_gemv(const T* A, int64_t m, int64_t k, T* D, int64_t n, const Dec& dec, int threads) {
  const QAct act = quantize_act(A, k, m, k, dec.layout);
  // two contiguous ranges of rows a thread: each range starts a cold stream (its prefetch
  // has not run ahead yet), so fewer, longer ranges read faster; two still even out a
  // thread that started late
  const int64_t grain = std::max<int64_t>(1, (n + 2 * threads - 1) / (2 * threads));
  tnc::parallel_for(n, grain, threads, [&](int64_t j0, int64_t j1) {
    for (int64_t jb = j0; jb < j1; jb += kQuantBlockRows) {
      const int64_t je = std::min(j1, jb + kQuantBlockRows);
      for (int64_t r0 = 0; r0 < m; r0 += 4) {
        const auto rows = [&]<int MR>() {
          float out[MR];
          for (int64_t j = jb; j < je; ++j) {
            dec.template dot<MR>(j, act, r0, out);
            for (int r = 0; r < MR; ++r) D[(r0 + r) * n + j] = tnc::from_float<T>(out[r]);
          }
        };
        switch (std::min<int64_t>(4, m - r0)) {
          case 1: rows.template operator()<1>(); break;
          case 2: rows.template operator()<2>(); break;
          case 3: rows.template operator()<3>(); break;
          default: rows.template operator()<4>(); break;
        }
      }
    }
  });
}

// ---------------------------------------------------------------------------------------
// the scalar decoders: the baseline build's, and the arithmetic the vector ones reproduce

// sum of c[i] * a[i] over n codes
inline int idot(const int* c, const int8_t* a, int n) {
  int s = 0;
  for (int i = 0; i < n; ++i) s += c[i] * a[i];
  return s;
}

// A row of GGML blocks of type G against activation codes in natural order, lanes of 32
// (16 for Q6_K, whose scales are per 16). Per lane: W * (da * dot) + M * ds, where W is the
// weight's scale, M its offset (Q4_1's m, the K-quants' -dmin * min) and the codes' own
// offsets (Q4_0's 8, Q6_K's 32) are taken off through ds = da * (the lane's code sum).
template <GgmlType G>
inline float gguf_row_dot(const uint8_t* b, const int8_t* q, const float* da, const float* ds, int64_t k) {
  constexpr int64_t BS = ggml_block_size(G), TS = ggml_type_size(G);
  float acc = 0.f;
  int c[256];
  for (int64_t kk = 0; kk < k; kk += BS, b += TS, q += BS) {
    const int64_t lane = kk / (G == GgmlType::q6_k ? 16 : 32);
    if constexpr (G == GgmlType::q8_0) {
      for (int i = 0; i < 32; ++i) c[i] = static_cast<int8_t>(b[2 + i]);
      acc += half_at(b) * (da[lane] * static_cast<float>(idot(c, q, 32)));
    } else if constexpr (G == GgmlType::q4_0 || G == GgmlType::q4_1) {
      const int off = G == GgmlType::q4_0 ? 2 : 4;
      for (int i = 0; i < 16; ++i) {
        c[i] = b[off + i] & 15;
        c[i + 16] = b[off + i] >> 4;
      }
      const float d = half_at(b), dot = da[lane] * static_cast<float>(idot(c, q, 32));
      acc += G == GgmlType::q4_0 ? d * dot - 8.f * d * ds[lane] : d * dot + half_at(b + 2) * ds[lane];
    } else if constexpr (G == GgmlType::q4_k || G == GgmlType::q5_k) {
      const float d = half_at(b), dmin = half_at(b + 2);
      const uint8_t* qs = b + (G == GgmlType::q4_k ? 16 : 48);
      for (int j = 0; j < 8; ++j) {
        for (int l = 0; l < 32; ++l) {
          c[32 * j + l] = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
          if constexpr (G == GgmlType::q5_k) c[32 * j + l] |= ((b[16 + l] >> j) & 1) << 4;
        }
        int sc, mn;
        k4_scale_min(b + 4, j, sc, mn);
        acc += d * static_cast<float>(sc) * (da[lane + j] * static_cast<float>(idot(c + 32 * j, q + 32 * j, 32))) -
               dmin * static_cast<float>(mn) * ds[lane + j];
      }
    } else {  // Q6_K
      for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l) {
          const uint8_t* ql = b + 64 * h;
          const int qh = b[128 + 32 * h + l];
          c[128 * h + l] = (ql[l] & 15) | ((qh & 3) << 4);
          c[128 * h + 32 + l] = (ql[l + 32] & 15) | (((qh >> 2) & 3) << 4);
          c[128 * h + 64 + l] = (ql[l] >> 4) | (((qh >> 4) & 3) << 4);
          c[128 * h + 96 + l] = (ql[l + 32] >> 4) | (((qh >> 6) & 3) << 4);
        }
      const float d = half_at(b + 208);
      for (int g = 0; g < 16; ++g) {
        const float w = d * static_cast<float>(static_cast<int8_t>(b[192 + g]));
        acc += w * (da[lane + g] * static_cast<float>(idot(c + 16 * g, q + 16 * g, 16))) - 32.f * w * ds[lane + g];
      }
    }
  }
  return acc;
}

template <GgmlType G>
struct ScalarGgufDec {
  const uint8_t* w;
  int64_t row_bytes, k;
  ActLayout layout{G == GgmlType::q6_k ? 16 : 32, 32, ActOrder::natural};
  template <int MR>
  void dot(int64_t j, const QAct& a, int64_t r0, float* out) const {
    for (int r = 0; r < MR; ++r) {
      const int64_t row = r0 + r;
      out[r] =
          gguf_row_dot<G>(w + j * row_bytes, a.q + row * a.q_stride, a.da + row * a.lanes, a.ds + row * a.lanes, k);
    }
  }
};

// A 4-bit row (group a multiple of 32) against codes in natural order: per block of 32,
// scale * (da * dot - zero * ds).
struct ScalarW4Dec {
  const tnc::GemmW4A16Args* g;
  ActLayout layout{32, 32, ActOrder::natural};
  static bool serves(int64_t group) { return group % 32 == 0; }
  template <int MR>
  void dot(int64_t j, const QAct& a, int64_t r0, float* out) const {
    const int64_t groups = g->k / g->group;
    const uint8_t* row = g->w + j * (g->k / 2);
    const uint8_t* zero = g->zero + j * groups;
    int c[32];
    for (int r = 0; r < MR; ++r) out[r] = 0.f;
    for (int64_t b = 0; b < g->k / 32; ++b) {
      const int64_t gi = b * 32 / g->group;
      const float s = g->scale_f16 ? tnc::to_float(static_cast<const half_t*>(g->scale)[j * groups + gi])
                                   : static_cast<const float*>(g->scale)[j * groups + gi];
      for (int i = 0; i < 32; ++i) c[i] = (row[16 * b + i / 2] >> (4 * (i % 2))) & 15;
      for (int r = 0; r < MR; ++r) {
        const int64_t row_a = r0 + r;
        const float dot = static_cast<float>(idot(c, a.q + row_a * a.q_stride + 32 * b, 32));
        out[r] += s * (a.da[row_a * a.lanes + b] * dot - static_cast<float>(zero[gi]) * a.ds[row_a * a.lanes + b]);
      }
    }
  }
};

// ---------------------------------------------------------------------------------------
// weights as float rows: dequantized one row at a time and dotted with the float activation
// (F16/BF16/F32 rows of another dtype than the activation's, and 4-bit groups that are not
// multiples of 32), and as float panels for the blocked GEMM (prefill on every build but
// AVX-512 BF16's)

// deq(j, k0, k1, out): weights [k0, k1) of row j as float
template <class T, class Deq>
void dequant_gemv(const T* A, int64_t m, int64_t k, T* D, int64_t n, const Deq& deq, int threads) {
  float* af = scratch(static_cast<size_t>(m * k + W), 0);
  for (int64_t i = 0; i < m * k; ++i) af[i] = tnc::to_float(A[i]);
  tnc::parallel_for(n, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, k)), threads, [&](int64_t j0, int64_t j1) {
    float* wrow = scratch(static_cast<size_t>(k + W), 1);
    for (int64_t j = j0; j < j1; ++j) {
      deq(j, 0, k, wrow);
      for (int64_t r = 0; r < m; ++r) {
        const float* x = af + r * k;
        F acc = S::zero();
        int64_t i = 0;
        for (; i + W <= k; i += W) acc = S::fma(S::load(x + i), S::load(wrow + i), acc);
        float s = S::reduce_add(acc);
        for (; i < k; ++i) s += x[i] * wrow[i];
        D[r * n + j] = tnc::from_float<T>(s);
      }
    }
  });
}

template <class T, class Deq>
void dequant_gemm_blocked(const T* A, int64_t m, int64_t k, T* D, int64_t n, const Deq& deq, int threads) {
  tnc::GemmArgs g{};
  g.m = m;
  g.n = n;
  g.k = k;
  g.a_row = k;
  g.a_col = 1;
  gemm_blocked(g, A, D, threads, [&](float* dst, int64_t col0, int64_t cols, int64_t pc, int64_t kc) {
    float* rows = scratch(static_cast<size_t>(kNR * kc + W), 0);
    for (int64_t j = 0; j < cols; ++j) deq(col0 + j, pc, pc + kc, rows + j * kc);
    for (int64_t kk = 0; kk < kc; ++kk)
      for (int64_t j = 0; j < kNR; ++j) dst[kk * kNR + j] = j < cols ? rows[j * kc + kk] : 0.f;
  });
}

template <GgmlType G>
struct GgufDeq {
  const uint8_t* w;
  int64_t row_bytes;
  void operator()(int64_t j, int64_t k0, int64_t k1, float* out) const {
    dequant_row<G>(w + j * row_bytes, k0, k1, out);
  }
};

struct W4Deq {
  const tnc::GemmW4A16Args* g;
  void operator()(int64_t j, int64_t k0, int64_t k1, float* out) const {
    const int64_t groups = g->k / g->group;
    const void* scale = static_cast<const char*>(g->scale) + j * groups * (g->scale_f16 ? 2 : 4);
    dequant_w4_row(g->w + j * (g->k / 2), scale, g->scale_f16, g->zero + j * groups, g->group, k0, k1, out);
  }
};

// d [m, n] = a [m, k] @ b [n, k].T by a table's GEMM (rows of a and b contiguous)
inline void gemm_nt(tnc::KernelFn<tnc::GemmArgs> gemm, const void* a, const void* b, void* d, int64_t m, int64_t n,
                    int64_t k, int threads) {
  tnc::GemmArgs g{};
  g.a = a;
  g.b = b;
  g.d = d;
  g.batch = 1;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a_row = k;
  g.a_col = 1;
  g.b_row = 1;
  g.b_col = k;
  gemm(g, threads);
}

// The prefill of a build: its panel GEMM over dequantized weights, in float32.
struct BlockedPrefill {
  template <class T, class Deq>
  static void run(const T* A, int64_t m, int64_t k, T* D, int64_t n, const Deq& deq, tnc::KernelFn<tnc::GemmArgs>,
                  int threads) {
    dequant_gemm_blocked(A, m, k, D, n, deq, threads);
  }
};

// The prefill of builds whose bfloat16 GEMM outruns float32 FMAs (AVX-512 BF16's
// vdpbf16ps, twice the rate): bfloat16 activations meet weights dequantized to bfloat16
// (the one extra rounding, as a bfloat16 checkpoint has) a chunk of rows at a time, in the
// table's GEMM; a chunk's columns are then copied into place. Other dtypes, and Q8_0,
// BlockedPrefill: an 8-bit code times its scale carries more bits than bfloat16 keeps, and
// that rounding is a sizeable share of Q8_0's own error (enable(weights="int8")'s
// perplexity test sees it), a small one of the 4-6-bit types'.
struct Bf16TablePrefill {
  template <class T, class Deq>
  static void run(const T* A, int64_t m, int64_t k, T* D, int64_t n, const Deq& deq, tnc::KernelFn<tnc::GemmArgs> gemm,
                  int threads) {
    if constexpr (!std::is_same_v<T, bf16_t> || std::is_same_v<Deq, GgufDeq<GgmlType::q8_0>>) {
      dequant_gemm_blocked(A, m, k, D, n, deq, threads);
    } else {
      // rows a chunk: about 2 MiB of bfloat16 weights, whole 64-row panels
      const int64_t chunk = std::min(n, std::max<int64_t>(64, (int64_t{1} << 20) / k / 64 * 64));
      T* wbuf = reinterpret_cast<T*>(scratch(static_cast<size_t>(chunk * k / 2 + W), 4));
      T* obuf = chunk < n ? reinterpret_cast<T*>(scratch(static_cast<size_t>(m * chunk / 2 + W), 5)) : D;
      for (int64_t c0 = 0; c0 < n; c0 += chunk) {
        const int64_t nc = std::min(chunk, n - c0);
        tnc::parallel_for(nc, 8, threads, [&](int64_t j0, int64_t j1) {
          float* row = scratch(static_cast<size_t>(k + W), 0);  // (the caller's 4 and 5 hold wbuf, obuf)
          for (int64_t j = j0; j < j1; ++j) {
            deq(c0 + j, 0, k, row);
            T* o = wbuf + j * k;
            for (int64_t c = 0; c < k; c += W) storec(o + c, loadc(row + c, k - c), k - c);
          }
        });
        gemm_nt(gemm, A, wbuf, obuf, m, nc, k, threads);
        if (obuf != D)
          for (int64_t r = 0; r < m; ++r)
            std::memcpy(D + r * n + c0, obuf + r * nc, static_cast<size_t>(nc) * sizeof(T));
      }
    }
  }
};

// ---------------------------------------------------------------------------------------
// the entries: decode or prefill, for a decoder family and a prefill

// GGUF weights of type G. Dec<G> is the build's decoder (ScalarGgufDec in the baseline).
template <class T, GgmlType G, template <GgmlType> class Dec, class Prefill>
void gemm_gguf(const tnc::GemmGgufArgs& g, int threads) {
  const T* A = static_cast<const T*>(g.a);
  T* D = static_cast<T*>(g.d);
  const GgufDeq<G> deq{g.w, g.row_bytes};
  if constexpr (ggml_is_float(G)) {
    constexpr bool same = (G == GgmlType::f32 && std::is_same_v<T, float>) ||
                          (G == GgmlType::f16 && std::is_same_v<T, half_t>) ||
                          (G == GgmlType::bf16 && std::is_same_v<T, bf16_t>);
    if (same && g.gemm != nullptr) {  // the table's GEMM on the rows as they are (NT)
      gemm_nt(g.gemm, g.a, g.w, g.d, g.m, g.n, g.k, threads);
    } else if (g.m <= kQuantDecodeMaxM) {
      dequant_gemv(A, g.m, g.k, D, g.n, deq, threads);
    } else {
      Prefill::run(A, g.m, g.k, D, g.n, deq, g.gemm, threads);
    }
  } else if (g.m <= kQuantDecodeMaxM) {
    quant_gemv(A, g.m, g.k, D, g.n, Dec<G>{g.w, g.row_bytes, g.k}, threads);
  } else {
    Prefill::run(A, g.m, g.k, D, g.n, deq, g.gemm, threads);
  }
}

template <class T, class Dec, class Prefill>
void gemm_w4a16(const tnc::GemmW4A16Args& g, int threads) {
  const T* A = static_cast<const T*>(g.a);
  T* D = static_cast<T*>(g.d);
  if (g.m > kQuantDecodeMaxM) {
    Prefill::run(A, g.m, g.k, D, g.n, W4Deq{&g}, g.gemm, threads);
  } else if (g.group % 32 == 0 && Dec::serves(g.group)) {
    quant_gemv(A, g.m, g.k, D, g.n, Dec{&g}, threads);
  } else {
    dequant_gemv(A, g.m, g.k, D, g.n, W4Deq{&g}, threads);
  }
}

// ---------------------------------------------------------------------------------------
// the embedding: rows ids[i] dequantized (exactly) and rounded to T

template <class T, GgmlType G>
void embedding_gguf(const tnc::EmbeddingGgufArgs& e, int threads) {
  T* out = static_cast<T*>(e.out);
  const int64_t dim = e.dim;
  tnc::parallel_for(e.t, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, dim)), threads, [&](int64_t i0, int64_t i1) {
    float* row = scratch(static_cast<size_t>(dim + W), 1);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t id = e.ids_64 ? static_cast<const int64_t*>(e.ids)[i] : static_cast<const int32_t*>(e.ids)[i];
      if (id < 0 || id >= e.vocab) {  // the marshalling refused such ids; never read out of bounds
        std::fill(row, row + dim, 0.f);
      } else {
        dequant_row<G>(e.w + id * e.row_bytes, 0, dim, row);
      }
      T* o = out + i * dim;
      for (int64_t c = 0; c < dim; c += W) storec(o + c, loadc(row + c, dim - c), dim - c);
    }
  });
}

// ---------------------------------------------------------------------------------------
// registration: under the activation's (or the output's) dtype; the GGUF entries' variant
// is the GGUF type number

template <class Fn>
inline void for_each_ggml_type(Fn fn) {
  fn.template operator()<GgmlType::f32>();
  fn.template operator()<GgmlType::f16>();
  fn.template operator()<GgmlType::bf16>();
  fn.template operator()<GgmlType::q8_0>();
  fn.template operator()<GgmlType::q4_0>();
  fn.template operator()<GgmlType::q4_1>();
  fn.template operator()<GgmlType::q4_k>();
  fn.template operator()<GgmlType::q5_k>();
  fn.template operator()<GgmlType::q6_k>();
}

// Registers (or, from an ISA file, replaces) the two GEMM entries with Dec and Prefill.
template <template <GgmlType> class GgufDec, class W4Dec, class Prefill, bool Replace>
inline void register_quant_gemms(tnc::KernelTable& t) {
  for_each_float_type([&]<class T>(tnc::DType d) {
    for_each_ggml_type([&]<GgmlType G>() {
      const auto fn = gemm_gguf<T, G, GgufDec, Prefill>;
      if constexpr (Replace) {
        t.replace<tnc::GemmGgufArgs>("gemm_gguf", d, fn, static_cast<int>(G));
      } else {
        t.add<tnc::GemmGgufArgs>("gemm_gguf", d, fn, static_cast<int>(G));
      }
    });
    const auto fn = gemm_w4a16<T, W4Dec, Prefill>;
    if constexpr (Replace) {
      t.replace<tnc::GemmW4A16Args>("gemm_w4a16", d, fn);
    } else {
      t.add<tnc::GemmW4A16Args>("gemm_w4a16", d, fn);
    }
  });
}

inline void register_quant(tnc::KernelTable& t) {
  register_quant_gemms<ScalarGgufDec, ScalarW4Dec, BlockedPrefill, false>(t);
  for_each_float_type([&]<class T>(tnc::DType d) {
    for_each_ggml_type([&]<GgmlType G>() {
      t.add<tnc::EmbeddingGgufArgs>("embedding_gguf", d, embedding_gguf<T, G>, static_cast<int>(G));
    });
  });
}
