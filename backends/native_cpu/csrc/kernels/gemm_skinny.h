// The gemm family, skinny products (m <= kSkinnyM, the decode GEMV): memory-bound on B,
// which is streamed once. A (a few rows) is widened to float in a zero-padded scratch; B
// is read in place in its own layout, never packed. NT (B rows contiguous along K, the
// F.linear weight layout): NB rows of B at a time, one accumulator per (A row, B row),
// reduced horizontally once per output. NN (B rows contiguous along N): CV vectors of
// columns at a time over all K. Included inside a per-ISA namespace by kernels/families.h
// before kernels/gemm.h, whose entry point routes skinny products here.
#pragma once
// (no includes here on purpose: see kernels/common.h)

constexpr int64_t kSkinnyM = 16;

template <int MR>
constexpr int skinny_nt_rows() {
  // accumulators MR x NB within half the register file
  return W >= 16 ? (MR <= 2 ? 8 : MR <= 4 ? 4 : 2) : (W >= 8 ? (MR <= 2 ? 4 : MR <= 4 ? 2 : 1) : (MR <= 4 ? 2 : 1));
}

template <class T, int MR, int NB>
inline void skinny_nt_block(const float* __restrict ap, int64_t kp, const T* __restrict b, int64_t ldb, int64_t k, int nb,
                            float out[MR][NB]) {
  F acc[MR][NB];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) acc[r][j] = S::zero();
  const T* rows[NB];
  for (int j = 0; j < NB; ++j) rows[j] = b + std::min(j, nb - 1) * ldb;  // dead rows repeat the last one
  int64_t kk = 0;
  for (; kk + W <= k; kk += W) {
    F av[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) av[r] = S::load(ap + r * kp + kk);
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      const F bv = S::load(rows[j] + kk);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) acc[r][j] = S::fma(av[r], bv, acc[r][j]);
    }
  }
  if (kk < k) {
    const int c = static_cast<int>(k - kk);
    F av[MR];
    for (int r = 0; r < MR; ++r) av[r] = S::load(ap + r * kp + kk);  // padded with zeros
    for (int j = 0; j < NB; ++j) {
      const F bv = S::load_n(rows[j] + kk, c);
      for (int r = 0; r < MR; ++r) acc[r][j] = S::fma(av[r], bv, acc[r][j]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NB; ++j) out[r][j] = S::reduce_add(acc[r][j]);
}

template <class T, int MR>
void skinny_nt(const float* ap, int64_t kp, const T* B, int64_t ldb, int64_t k, T* D, int64_t n, int64_t j0, int64_t j1) {
  constexpr int NB = skinny_nt_rows<MR>();
  float out[MR][NB];
  for (int64_t j = j0; j < j1; j += NB) {
    const int nb = static_cast<int>(std::min<int64_t>(NB, j1 - j));
    skinny_nt_block<T, MR, NB>(ap, kp, B + j * ldb, ldb, k, nb, out);
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < nb; ++c) D[r * n + j + c] = tnc::from_float<T>(out[r][c]);
  }
}

template <class T, int MR>
void skinny_nn(const float* ap, int64_t kp, const T* B, int64_t ldb, int64_t k, T* D, int64_t n, int64_t c0, int64_t c1) {
  constexpr int CV = W >= 16 ? (MR <= 2 ? 8 : MR <= 4 ? 4 : 2) : (W >= 8 ? (MR <= 2 ? 4 : MR <= 4 ? 2 : 1) : 4);
  for (int64_t j = c0; j < c1; j += CV * W) {
    const int64_t cols = std::min<int64_t>(CV * W, c1 - j);
    F acc[MR][CV];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < CV; ++v) acc[r][v] = S::zero();
    if (cols == CV * W) {
      for (int64_t kk = 0; kk < k; ++kk) {
        const T* brow = B + kk * ldb + j;
        F bv[CV];
#pragma GCC unroll 8
        for (int v = 0; v < CV; ++v) bv[v] = S::load(brow + v * W);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          const F av = S::set1(ap[r * kp + kk]);
#pragma GCC unroll 8
          for (int v = 0; v < CV; ++v) acc[r][v] = S::fma(av, bv[v], acc[r][v]);
        }
      }
    } else {
      for (int64_t kk = 0; kk < k; ++kk) {
        const T* brow = B + kk * ldb + j;
        for (int v = 0; v < CV; ++v) {
          if (v * W >= cols) break;
          const F bv = loadc(brow + v * W, cols - v * W);
          for (int r = 0; r < MR; ++r) acc[r][v] = S::fma(S::set1(ap[r * kp + kk]), bv, acc[r][v]);
        }
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < CV && v * W < cols; ++v) storec(D + r * n + j + v * W, acc[r][v], cols - v * W);
  }
}

template <class T>
void gemm_skinny(const tnc::GemmArgs& g, int threads) {
  const int64_t m = g.m, n = g.n, k = g.k;
  const int64_t kp = (k + W - 1) / W * W;
  const bool nt = g.b_row == 1 && !(g.b_col == 1 && n > 1);  // B[j, :] contiguous along K
  // chunks of at least ~32 KB of B, in whole vector blocks of columns for NN
  const int64_t bytes_per_col = std::max<int64_t>(1, k * static_cast<int64_t>(sizeof(T)));
  const int64_t grain_cols = std::max<int64_t>(nt ? 4 : 4 * W, 32768 / bytes_per_col);
  float* ap = scratch(static_cast<size_t>(m * kp + W), 0);
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    const T* A = static_cast<const T*>(g.a) + bi * g.a_batch;
    const T* B = static_cast<const T*>(g.b) + bi * g.b_batch;
    T* D = static_cast<T*>(g.d) + bi * g.d_batch;
    for (int64_t r = 0; r < m; ++r) {
      float* dst = ap + r * kp;
      const T* src = A + r * g.a_row;
      if (g.a_col == 1) {
        for (int64_t kk = 0; kk < k; kk += W) storec(dst + kk, loadc(src + kk, k - kk), k - kk);
      } else {
        for (int64_t kk = 0; kk < k; ++kk) dst[kk] = tnc::to_float(src[kk * g.a_col]);
      }
      for (int64_t kk = k; kk < kp; ++kk) dst[kk] = 0.f;
    }
    if (nt) {
      const int64_t ldb = g.b_col;
      // more than 8 rows: groups of 8 over sub-blocks of B rows small enough to stay in L2
      const int64_t jb = std::max<int64_t>(8, (int64_t{1} << 18) / bytes_per_col);
      tnc::parallel_for(n, grain_cols, threads, [&](int64_t j0, int64_t j1) {
        for (int64_t jj0 = j0; jj0 < j1; jj0 += jb) {
          const int64_t jj1 = std::min(j1, jj0 + jb);
          for (int64_t r0 = 0; r0 < m; r0 += 8) {
            switch (std::min<int64_t>(8, m - r0)) {
              case 1: skinny_nt<T, 1>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
              case 2: skinny_nt<T, 2>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
              case 3: skinny_nt<T, 3>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
              case 4: skinny_nt<T, 4>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
              case 5: skinny_nt<T, 5>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
              case 6: skinny_nt<T, 6>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
              case 7: skinny_nt<T, 7>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
              default: skinny_nt<T, 8>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
            }
          }
        }
      });
    } else {
      const int64_t ldb = g.b_row;
      const int64_t blocks = (n + W - 1) / W;  // split on whole vectors of columns
      tnc::parallel_for(blocks, std::max<int64_t>(1, grain_cols / W), threads, [&](int64_t b0, int64_t b1) {
        const int64_t c0 = b0 * W, c1 = std::min(n, b1 * W);
        for (int64_t cc0 = c0; cc0 < c1; cc0 += 8 * W) {  // groups of 8 rows share each column block
          const int64_t cc1 = std::min(c1, cc0 + 8 * W);
          for (int64_t r0 = 0; r0 < m; r0 += 8) {
            switch (std::min<int64_t>(8, m - r0)) {
              case 1: skinny_nn<T, 1>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, cc0, cc1); break;
              case 2: skinny_nn<T, 2>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, cc0, cc1); break;
              case 3: skinny_nn<T, 3>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, cc0, cc1); break;
              case 4: skinny_nn<T, 4>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, cc0, cc1); break;
              case 5: skinny_nn<T, 5>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, cc0, cc1); break;
              case 6: skinny_nn<T, 6>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, cc0, cc1); break;
              case 7: skinny_nn<T, 7>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, cc0, cc1); break;
              default: skinny_nn<T, 8>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, cc0, cc1); break;
            }
          }
        }
      });
    }
  }
}
