// The gemm family, skinny products (m <= kSkinnyM, the decode GEMV): memory-bound on B,
// which is streamed once. A (a few rows) is widened to float in a zero-padded scratch; B
// is read in place in its own layout, never packed. NT (B rows contiguous along K, the
// F.linear weight layout): with up to kSkinnyStreamRows rows of A, one row of B at a time,
// front to back; with more, NB rows of B at a time, one accumulator per (A row, B row).
// Either way each output is reduced horizontally once. NN (B rows contiguous along N): CV
// vectors of columns at a time over all K. Included inside a per-ISA namespace by
// kernels/families.h before kernels/gemm.h, whose entry point routes skinny products here.
#pragma once
// (no includes here on purpose: see kernels/common.h)

constexpr int64_t kSkinnyM = 16;
// Rows of A up to which bfloat16 NT reads B in pairs, where the ISA has load_pair (see
// gemm_skinny for why not more)
constexpr int64_t kSkinnyPairRows = 2;
// Rows of A up to which NT reads B one row at a time (skinny_nt_row): B is then a single
// forward stream per thread, which the hardware prefetcher keeps ahead of. Blocks of NB
// rows read at once are NB short streams (2 KiB each at K = 1024), which it does not keep
// as far ahead of: at one and two rows of A the single stream was faster in every build
// and dtype measured (docs/performance.md). At m = 4 the two were even or the blocks ahead (each B
// load meets enough FMAs that the block's shared A loads count), so more rows keep the
// blocks.
constexpr int64_t kSkinnyStreamRows = 2;

template <int MR>
constexpr int skinny_nt_rows() {
  // accumulators MR x NB within half the register file
  return W >= 16 ? (MR <= 2 ? 8 : MR <= 4 ? 4 : 2) : (W >= 8 ? (MR <= 2 ? 4 : MR <= 4 ? 2 : 1) : (MR <= 4 ? 2 : 1));
}

// out[r][j] = A row r . B row j. A is packed in `ap`: rows of kp floats, zero-padded; with
// Pairs (bfloat16 where the ISA has load_pair), in load_pair's lane order within each block
// of 2W, and kp a multiple of 2W. (skinny_nt's blocks of B rows, and the MoE decode rows'
// generic dots, kernels/moe.h.)
// B's rows stream from memory as NB interleaved streams per block, which the hardware
// prefetcher alone does not keep ahead of. So a block may prefetch the block after it
// (`next`, its first row; next_nb rows), a line per row for each line it reads, and that
// block's loads start warm.
template <class T, int MR, int NB, bool Pairs = false>
inline void skinny_nt_block(const float* __restrict ap, int64_t kp, const T* b, int64_t ldb, int64_t k, int nb,
                            float out[MR][NB], const T* next = nullptr, int next_nb = 0) {
  static_assert(!Pairs || kPairsPermute<T>, "Pairs needs the ISA's load_pair for T");
  constexpr int kStep = Pairs ? 2 * W : W;  // elements per load
  // pairs: separate accumulators for the odd lanes where there are few (FMA latency)
  constexpr bool kOddAcc = Pairs && MR * NB <= 4;
  F acc[MR][NB], odd[MR][NB];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) acc[r][j] = odd[r][j] = S::zero();
  const T* rows[NB];
  const T* ahead[NB];
  for (int j = 0; j < NB; ++j) {
    rows[j] = b + std::min(j, nb - 1) * ldb;  // dead rows repeat the last one
    ahead[j] = next != nullptr ? next + std::min(j, next_nb - 1) * ldb : nullptr;
  }
  // A's elements [kk, kk + kStep) against B's at src[j] + at
  auto step = [&](int64_t kk, const T* const(&src)[NB], int64_t at) {
    if constexpr (Pairs) {
      F ae[MR], ao[MR];
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        ae[r] = S::load(ap + r * kp + kk);
        ao[r] = S::load(ap + r * kp + kk + W);
      }
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) {
        F be, bo;
        load_pair(src[j] + at, be, bo);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          acc[r][j] = S::fma(ae[r], be, acc[r][j]);
          if constexpr (kOddAcc) {
            odd[r][j] = S::fma(ao[r], bo, odd[r][j]);
          } else {
            acc[r][j] = S::fma(ao[r], bo, acc[r][j]);
          }
        }
      }
    } else {
      F av[MR];
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) av[r] = S::load(ap + r * kp + kk);
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) {
        const F bv = S::load(src[j] + at);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) acc[r][j] = S::fma(av[r], bv, acc[r][j]);
      }
    }
  };
  int64_t kk = 0;
  for (; kk + kStep <= k; kk += kStep) {
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) prefetch_next<kStep>(ahead[j], kk);
    step(kk, rows, kk);
  }
  if (kk < k) {  // the last partial step, from zero-padded copies of the rows' tails
    const int c = static_cast<int>(k - kk);
    alignas(64) T tail[NB][kStep];
    const T* tails[NB];
    for (int j = 0; j < NB; ++j) {
      for (int i = 0; i < kStep; ++i) tail[j][i] = i < c ? rows[j][kk + i] : tnc::from_float<T>(0.f);
      tails[j] = tail[j];
    }
    step(kk, tails, 0);
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NB; ++j) out[r][j] = S::reduce_add(kOddAcc ? S::add(acc[r][j], odd[r][j]) : acc[r][j]);
}

// The lines S::kRowAheadBytes past the Bytes read from p on, non-temporally (prefetchnta:
// a weight row is read once); nothing where the ISA sets no distance. Past the row's end it
// reaches into the next row, which the same thread reads next.
template <int Bytes>
inline void prefetch_row_ahead(const void* p) {
  if constexpr (S::kRowAheadBytes > 0) {
    const char* ahead = static_cast<const char*>(p) + S::kRowAheadBytes;
#pragma GCC unroll 4
    for (int b = 0; b < Bytes; b += 64) __builtin_prefetch(ahead + b, 0, 0);
  }
}

// out[r] = A row r . B row `row` (A packed as for skinny_nt_block), the row read once from
// front to back: C independent accumulators per A row along K (FMA latency), summed at the
// end; S::kRowAheadBytes ahead of the reads, prefetched (prefetch_row_ahead).
template <class T, int MR, bool Pairs = false>
inline void skinny_nt_row(const float* __restrict ap, int64_t kp, const T* row, int64_t k, float out[MR]) {
  static_assert(!Pairs || kPairsPermute<T>, "Pairs needs the ISA's load_pair for T");
  constexpr int kStep = Pairs ? 2 * W : W;  // elements per load
  constexpr int C = MR == 1 ? 4 : 2;
  F acc[MR][C];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = S::zero();
  // A's elements [kk, kk + kStep) against B's at src, into accumulator c
  auto step = [&](int c, int64_t kk, const T* src) {
    if constexpr (Pairs) {
      F be, bo;
      load_pair(src, be, bo);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        acc[r][c] = S::fma(S::load(ap + r * kp + kk), be, acc[r][c]);
        acc[r][c] = S::fma(S::load(ap + r * kp + kk + W), bo, acc[r][c]);
      }
    } else {
      const F bv = S::load(src);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) acc[r][c] = S::fma(S::load(ap + r * kp + kk), bv, acc[r][c]);
    }
  };
  int64_t kk = 0;
  for (; kk + C * kStep <= k; kk += C * kStep) {
    prefetch_row_ahead<C * kStep* static_cast<int>(sizeof(T))>(row + kk);
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) step(c, kk + c * kStep, row + kk + c * kStep);
  }
  for (; kk + kStep <= k; kk += kStep) step(0, kk, row + kk);
  if (kk < k) {  // the last partial step, from a zero-padded copy of the row's tail
    alignas(64) T tail[kStep];
    for (int i = 0; i < kStep; ++i) tail[i] = kk + i < k ? row[kk + i] : tnc::from_float<T>(0.f);
    step(0, kk, tail);
  }
  for (int r = 0; r < MR; ++r) {
    F sum = acc[r][0];
    for (int c = 1; c < C; ++c) sum = S::add(sum, acc[r][c]);
    out[r] = S::reduce_add(sum);
  }
}

// Rows of A widened to float (values of T, kp a multiple of 2W), put in load_pair's lane
// order within each block of 2W, as skinny_nt_block<..., Pairs> reads them: each block goes
// back to T and through load_pair, as B's rows will (exact: T -> float -> T).
template <class T>
inline void to_pair_order(float* a, int64_t rows, int64_t kp) {
  for (int64_t i = 0; i < rows * kp; i += 2 * W) {
    T block[2 * W];
    for (int e = 0; e < 2 * W; ++e) block[e] = tnc::from_float<T>(a[i + e]);
    F even, odd;
    load_pair(block, even, odd);
    S::store(a + i, even);
    S::store(a + i + W, odd);
  }
}

// pairs: A packed in load_pair's order (gemm_skinny decides, for all of A's rows at once;
// only up to kSkinnyPairRows rows, which the one-row form reads)
template <class T, int MR>
void skinny_nt(const float* ap, int64_t kp, const T* B, int64_t ldb, int64_t k, T* D, int64_t n, int64_t j0, int64_t j1,
               bool pairs) {
  static_assert(kSkinnyPairRows <= kSkinnyStreamRows, "A in pair order only reaches the one-row form");
  if constexpr (MR <= kSkinnyStreamRows) {
    float out[MR];
    for (int64_t j = j0; j < j1; ++j) {
      if constexpr (kPairsPermute<T> && MR <= kSkinnyPairRows) {
        if (pairs) {
          skinny_nt_row<T, MR, true>(ap, kp, B + j * ldb, k, out);
        } else {
          skinny_nt_row<T, MR>(ap, kp, B + j * ldb, k, out);
        }
      } else {
        skinny_nt_row<T, MR>(ap, kp, B + j * ldb, k, out);
      }
      for (int r = 0; r < MR; ++r) D[r * n + j] = tnc::from_float<T>(out[r]);
    }
  } else {
    constexpr int NB = skinny_nt_rows<MR>();
    float out[MR][NB];
    for (int64_t j = j0; j < j1; j += NB) {
      const int nb = static_cast<int>(std::min<int64_t>(NB, j1 - j));
      const int64_t after = j + NB;  // the next block, within this range only
      const T* next = after < j1 ? B + after * ldb : nullptr;
      const int next_nb = static_cast<int>(std::min<int64_t>(NB, j1 - after));
      skinny_nt_block<T, MR, NB>(ap, kp, B + j * ldb, ldb, k, nb, out, next, next_nb);
      for (int r = 0; r < MR; ++r)
        for (int c = 0; c < nb; ++c) D[r * n + j + c] = tnc::from_float<T>(out[r][c]);
    }
  }
}

template <class T, int MR>
void skinny_nn(const float* ap, int64_t kp, const T* B, int64_t ldb, int64_t k, T* D, int64_t n, int64_t c0,
               int64_t c1) {
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
  const bool nt = g.b_row == 1 && !(g.b_col == 1 && n > 1);  // B[j, :] contiguous along K
  // A in load_pair's lane order (skinny_nt_row) where B's rows are read in pairs: up to
  // kSkinnyPairRows rows of A. With more, each B load meets enough FMAs that widening W at a time is
  // as fast, and the pair form's two A vectors per step cost registers (on AVX2 at m = 4
  // the pair form was the slower).
  const bool pairs = nt && kPairsPermute<T> && m <= kSkinnyPairRows;
  const int64_t kp = (k + 2 * W - 1) / (2 * W) * (2 * W);
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
    if (pairs) to_pair_order<T>(ap, m, kp);
    if (nt) {
      const int64_t ldb = g.b_col;
      // more than 8 rows: groups of 8 over sub-blocks of B rows small enough to stay in L2
      const int64_t jb = std::max<int64_t>(8, (int64_t{1} << 18) / bytes_per_col);
      tnc::parallel_for(n, grain_cols, threads, [&](int64_t j0, int64_t j1) {
        for (int64_t jj0 = j0; jj0 < j1; jj0 += jb) {
          const int64_t jj1 = std::min(j1, jj0 + jb);
          for (int64_t r0 = 0; r0 < m; r0 += 8) {
            switch (std::min<int64_t>(8, m - r0)) {
              case 1: skinny_nt<T, 1>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1, pairs); break;
              case 2: skinny_nt<T, 2>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1, pairs); break;
              case 3: skinny_nt<T, 3>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1, pairs); break;
              case 4: skinny_nt<T, 4>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1, pairs); break;
              case 5: skinny_nt<T, 5>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1, pairs); break;
              case 6: skinny_nt<T, 6>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1, pairs); break;
              case 7: skinny_nt<T, 7>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1, pairs); break;
              default: skinny_nt<T, 8>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1, pairs); break;
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
