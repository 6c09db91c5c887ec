// The gemm family: GEMM and batched GEMM over strided operands (transposes are strides).
// Blocked: pack to float panels, MR x (2 W) register micro-tiles, float accumulation.
// Skinny products go to kernels/gemm_skinny.h (included before this file); on AVX-512 BF16
// bfloat16 products go to kernels/gemm_avx512_bf16*.h, which replace the bfloat16 entry.
// Included inside a per-ISA namespace by kernels/families.h; marshalling in bind/gemm.cc.
#pragma once
// (no includes here on purpose: see kernels/common.h)

constexpr int kMR = S::kGemmMR;
constexpr int kNR = 2 * W;
constexpr int64_t kKC = 256;
constexpr int64_t kMC = kMR * 8;
constexpr int64_t kNC = 512;

// acc[MR x NR] (+)= Ap[kc x MR]^T * Bp[kc x NR]; c has row stride ldc.
inline void micro_tile(int64_t kc, const float* __restrict ap, const float* __restrict bp, float* __restrict c,
                       int64_t ldc, int mr, int nr, bool first) {
  F acc0[kMR], acc1[kMR];
#pragma GCC unroll 16
  for (int r = 0; r < kMR; ++r) acc0[r] = acc1[r] = S::zero();
  for (int64_t kk = 0; kk < kc; ++kk) {
    const F b0 = S::load(bp + kk * kNR), b1 = S::load(bp + kk * kNR + W);
    const float* ak = ap + kk * kMR;
#pragma GCC unroll 16
    for (int r = 0; r < kMR; ++r) {
      const F av = S::set1(ak[r]);
      acc0[r] = S::fma(av, b0, acc0[r]);
      acc1[r] = S::fma(av, b1, acc1[r]);
    }
  }
  if (mr == kMR && nr == kNR) {
#pragma GCC unroll 16
    for (int r = 0; r < kMR; ++r) {
      float* row = c + r * ldc;
      if (first) {
        S::store(row, acc0[r]);
        S::store(row + W, acc1[r]);
      } else {
        S::store(row, S::add(S::load(row), acc0[r]));
        S::store(row + W, S::add(S::load(row + W), acc1[r]));
      }
    }
    return;
  }
  alignas(64) float tile[kMR * kNR];
  for (int r = 0; r < kMR; ++r) {
    S::store(tile + r * kNR, acc0[r]);
    S::store(tile + r * kNR + W, acc1[r]);
  }
  for (int r = 0; r < mr; ++r)
    for (int j = 0; j < nr; ++j) c[r * ldc + j] = (first ? 0.f : c[r * ldc + j]) + tile[r * kNR + j];
}

// Runs one(bi, threads) for each product bi of a batched GEMM. When the batch alone keeps
// every thread busy, each thread takes whole products on its own (one parallel region in
// all instead of two per product, and each thread's packed panels stay in its own L2);
// otherwise the products run in turn, each over every thread (two regions per product).
template <class One>
inline void for_each_product(int64_t batch, int threads, One one) {
  if (threads > 1 && batch >= threads && (batch % threads == 0 || batch >= 4 * threads)) {
    tnc::parallel_for(batch, 1, threads, [&](int64_t b0, int64_t b1) {
      for (int64_t bi = b0; bi < b1; ++bi) one(bi, 1);
    });
    return;
  }
  for (int64_t bi = 0; bi < batch; ++bi) one(bi, threads);
}

// The blocked product D = A B on `threads` threads, A and D of T (A strided as g says, D
// rows contiguous with g.n columns), B given by pack_panel(dst, col0, cols, pc, kc), which
// writes the float panel of result columns [col0, col0 + cols) (cols <= kNR) over K
// [pc, pc + kc): dst[kk * kNR + j], zeros for j >= cols. (B strided: gemm_product; B as
// quantized blocks: the quant family's prefill, kernels/gemm_quant.h.)
template <class T, class PackPanel>
void gemm_blocked(const tnc::GemmArgs& g, const T* A, T* D, int threads, PackPanel pack_panel) {
  const int64_t m = g.m, n = g.n, k = g.k;
  const int64_t nc_max = std::min(kNC, (n + kNR - 1) / kNR * kNR);
  const int64_t mcb = std::clamp<int64_t>((m + 2 * threads - 1) / (2 * threads) + kMR - 1, kMR, kMC) / kMR * kMR;
  float* bpack = scratch(static_cast<size_t>(kKC * nc_max), 2);
  float* cacc = scratch(static_cast<size_t>(m * nc_max), 3);
  for (int64_t jc = 0; jc < n; jc += kNC) {
    const int64_t nc = std::min(kNC, n - jc);
    const int64_t panels = (nc + kNR - 1) / kNR;
    if (k == 0) {
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < nc; ++j) D[i * n + jc + j] = tnc::from_float<T>(0.f);
      continue;
    }
    for (int64_t pc = 0; pc < k; pc += kKC) {
      const int64_t kc = std::min(kKC, k - pc);
      const bool first = pc == 0, last = pc + kc >= k;
      tnc::parallel_for(panels, 1, threads, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p)
          pack_panel(bpack + p * kc * kNR, jc + p * kNR, std::min<int64_t>(kNR, nc - p * kNR), pc, kc);
      });
      const int64_t mblocks = (m + mcb - 1) / mcb;
      tnc::parallel_for(mblocks, 1, threads, [&](int64_t b0, int64_t b1) {
        float* apack = scratch(static_cast<size_t>(kMC * kKC), 1);
        for (int64_t blk = b0; blk < b1; ++blk) {
          const int64_t ic = blk * mcb, mc = std::min(mcb, m - ic);
          for (int64_t ir = 0; ir < mc; ir += kMR) {
            float* dst = apack + ir * kc;
            for (int r = 0; r < kMR; ++r) {
              const int64_t row = ic + ir + r;
              if (row >= m) {
                for (int64_t kk = 0; kk < kc; ++kk) dst[kk * kMR + r] = 0.f;
                continue;
              }
              const T* src = A + row * g.a_row + pc * g.a_col;
              for (int64_t kk = 0; kk < kc; ++kk) dst[kk * kMR + r] = tnc::to_float(src[kk * g.a_col]);
            }
          }
          for (int64_t p = 0; p < panels; ++p) {
            const int nr = static_cast<int>(std::min<int64_t>(kNR, nc - p * kNR));
            for (int64_t ir = 0; ir < mc; ir += kMR) {
              const int mr = static_cast<int>(std::min<int64_t>(kMR, mc - ir));
              micro_tile(kc, apack + ir * kc, bpack + p * kc * kNR, cacc + (ic + ir) * nc_max + p * kNR, nc_max, mr, nr,
                         first);
            }
          }
          if (last) {
            for (int64_t i = ic; i < ic + mc; ++i) {
              const float* crow = cacc + i * nc_max;
              T* drow = D + i * n + jc;
              for (int64_t j = 0; j < nc; j += W) storec(drow + j, loadc(crow + j, nc - j), nc - j);
            }
          }
        }
      });
    }
  }
}

// Product bi of a batched GEMM (g.batch of them), on `threads` threads.
template <class T>
void gemm_product(const tnc::GemmArgs& g, int64_t bi, int threads) {
  const T* A = static_cast<const T*>(g.a) + bi * g.a_batch;
  const T* B = static_cast<const T*>(g.b) + bi * g.b_batch;
  T* D = static_cast<T*>(g.d) + bi * g.d_batch;
  gemm_blocked(g, A, D, threads, [&](float* dst, int64_t col0, int64_t cols, int64_t pc, int64_t kc) {
    for (int64_t j = 0; j < kNR; ++j) {
      if (j >= cols) {
        for (int64_t kk = 0; kk < kc; ++kk) dst[kk * kNR + j] = 0.f;
        continue;
      }
      const T* src = B + (col0 + j) * g.b_col + pc * g.b_row;
      for (int64_t kk = 0; kk < kc; ++kk) dst[kk * kNR + j] = tnc::to_float(src[kk * g.b_row]);
    }
  });
}

template <class T>
void gemm(const tnc::GemmArgs& g, int threads) {
  for_each_product(g.batch, threads, [&](int64_t bi, int thr) { gemm_product<T>(g, bi, thr); });
}

// The table's GEMM entry: a skinny product streams B; everything else is blocked.
template <class T>
void gemm_entry(const tnc::GemmArgs& g, int threads) {
  if (g.m <= kSkinnyM && (g.b_row == 1 || g.b_col == 1)) {
    gemm_skinny<T>(g, threads);
    return;
  }
  gemm<T>(g, threads);
}

inline void register_gemm(tnc::KernelTable& t) {
  for_each_float_type([&]<class T>(tnc::DType d) { t.add<tnc::GemmArgs>("gemm", d, gemm_entry<T>); });
}
