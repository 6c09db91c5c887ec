// The gemm family's code for AVX-512 BF16 (vdpbf16ps), part 2: NT products read straight
// from the weight layout (B is [N, K], K contiguous: the F.linear layout), and the
// bfloat16 entry point that routes between them and the packed GEMM of part 1
// (kernels/gemm_avx512_bf16.h, included before this file by isa_avx512.cc).
#pragma once
// (no includes here on purpose: see kernels/common.h)

#if !defined(__AVX512BF16__)
#error "kernels/gemm_avx512_bf16_nt.h needs -mavx512bf16 (isa_avx512.cc only)"
#endif

// NT bfloat16 GEMM straight from the weight's layout (B is [N, K], K contiguous: the
// F.linear layout), no B packing. The roles of the packed path are swapped: rows of B are
// the broadcast operand, read in place one K pair (one 32-bit word) at a time as the
// {1to16} memory operand of vdpbf16ps, and A, packed once into strips of 32 rows x K pairs,
// is the vector operand. A register tile is 12 columns (B rows) x 32 rows (two vectors), so
// it holds a slice of C^T, accumulated over K blocks in a float buffer laid out column by
// column (ct[col][row]) and transposed to the bfloat16 result after the last K block.
// Packing B reads, transposes and writes the whole weight before any arithmetic (30 MB at
// n2112 k7168), a large share of a product with few rows; here the weight is read once, by
// the arithmetic. Used for
// kDirectMinM <= m <= kDirectMaxM, where A (and the C^T buffer) stay small and packing B
// would be a large share of the work.
constexpr int kNBd = 12;                // B rows (result columns) per register tile
constexpr int64_t kKCd = 1024;          // K per block: an A strip block is 64 KB
constexpr int64_t kNCd = 3072;          // result columns per outer block (C^T buffer)
constexpr int64_t kDirectMaxM = 256;
// From this many rows (kDirectMinM1 on one thread) the direct path also takes the skinny
// products: with weights from memory (a model's layers in turn, benchmarks/vllm_gemm.py)
// it streamed them faster than the skinny blocks on a Zen 5 VM. One thread, m = 8-16:
// 10.3-10.8 ms against 12.8-17.5 per 212 MB pass (0.8-1.0x oneDNN's packed GEMM); two
// threads, m = 12-16: 8.1-9.6 against 9.3-12.9, but m = 8 8.2-10.9 against 7.7-8.6
// (docs/performance.md). Below, the skinny path (one B stream per thread up to 4 rows).
constexpr int64_t kDirectMinM = 12;
constexpr int64_t kDirectMinM1 = 8;
// TILEOPS_NATIVE_CPU_GEMM_NT_DIRECT=0 sends these GEMMs to the packed path (for comparison)
inline bool direct_nt_enabled() {
  static const bool on = [] {
    const char* s = std::getenv("TILEOPS_NATIVE_CPU_GEMM_NT_DIRECT");
    return s == nullptr || std::strcmp(s, "0") != 0;
  }();
  return on;
}

template <int MV>
inline void micro_tile_bf16_nt(int64_t kp_count, const uint32_t* __restrict ap, const bf16_t* __restrict b, int64_t ldb,
                               int nb, float* __restrict ct, int64_t ldct, bool first,
                               const bf16_t* prefetch = nullptr) {
  __m512 acc[kNBd][MV];
#pragma GCC unroll 16
  for (int j = 0; j < kNBd; ++j)
#pragma GCC unroll 2
    for (int v = 0; v < MV; ++v) acc[j][v] = _mm512_setzero_ps();
  const bf16_t* rows[kNBd];
#pragma GCC unroll 16
  for (int j = 0; j < kNBd; ++j) rows[j] = b + std::min(j, nb - 1) * ldb;  // dead columns repeat the last one
  for (int64_t kp = 0; kp < kp_count; ++kp) {
    // the next tile's 12 B rows, one line of each per 16 K pairs (one line of these rows),
    // so that they come from DRAM while this one computes
    if (prefetch != nullptr && kp % 16 == 0) {
#pragma GCC unroll 16
      for (int j = 0; j < kNBd; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(prefetch + j * ldb + 2 * kp), _MM_HINT_T0);
    }
    __m512bh av[MV];
#pragma GCC unroll 2
    for (int v = 0; v < MV; ++v) av[v] = (__m512bh)_mm512_loadu_si512(ap + kp * 32 + v * 16);
#pragma GCC unroll 16
    for (int j = 0; j < kNBd; ++j) {
      const __m512bh bv = (__m512bh)_mm512_broadcastd_epi32(_mm_loadu_si32(rows[j] + 2 * kp));
#pragma GCC unroll 2
      for (int v = 0; v < MV; ++v) acc[j][v] = _mm512_dpbf16_ps(acc[j][v], av[v], bv);
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < kNBd; ++j) {
    if (j >= nb) break;
    float* col = ct + j * ldct;
#pragma GCC unroll 2
    for (int v = 0; v < MV; ++v) {
      if (first) {
        _mm512_storeu_ps(col + v * 16, acc[j][v]);
      } else {
        _mm512_storeu_ps(col + v * 16, _mm512_add_ps(_mm512_loadu_ps(col + v * 16), acc[j][v]));
      }
    }
  }
}

inline void gemm_bf16_nt_direct(const tnc::GemmArgs& g, int threads) {
  const int64_t m = g.m, n = g.n, k = g.k, kp_total = k / 2;
  const int64_t strips = (m + 31) / 32, m_pad = strips * 32;
  const int64_t nc_max = std::min(kNCd, (n + kNBd - 1) / kNBd * kNBd);
  // A packed for all of K: strip s, K pair p at apack[(s * kp_total + p) * 32 + row % 32]
  uint32_t* apack = reinterpret_cast<uint32_t*>(scratch(static_cast<size_t>(m_pad * kp_total), 1));
  float* ct = scratch(static_cast<size_t>(nc_max * m_pad), 3);
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    const bf16_t* A = static_cast<const bf16_t*>(g.a) + bi * g.a_batch;
    const bf16_t* B = static_cast<const bf16_t*>(g.b) + bi * g.b_batch;
    bf16_t* D = static_cast<bf16_t*>(g.d) + bi * g.d_batch;
    // pack A: 16 rows x 16 pairs per 16x16 register transpose when rows are contiguous in K
    const int64_t pblocks = (kp_total + 255) / 256;
    tnc::parallel_for(strips * 2 * pblocks, 1, threads, [&](int64_t i0, int64_t i1) {
      for (int64_t item = i0; item < i1; ++item) {
        const int64_t s = item / (2 * pblocks), h = (item / pblocks) % 2, pb = item % pblocks;
        const int64_t row0 = s * 32 + h * 16, p0 = pb * 256, p1 = std::min(kp_total, p0 + 256);
        const int live = static_cast<int>(std::clamp<int64_t>(m - row0, 0, 16));
        uint32_t* dst = apack + s * kp_total * 32 + h * 16;
        if (g.a_col == 1) {
          for (int64_t kp0 = p0; kp0 < p1; kp0 += 16) {
            const int rem = static_cast<int>(std::min<int64_t>(16, p1 - kp0));
            const __mmask16 mk = static_cast<__mmask16>((1u << rem) - 1u);
            __m512i rows[16];
            for (int r = 0; r < 16; ++r)
              rows[r] =
                  r < live ? _mm512_maskz_loadu_epi32(mk, A + (row0 + r) * g.a_row + 2 * kp0) : _mm512_setzero_si512();
            transpose16x16_epi32(rows);
            for (int t = 0; t < rem; ++t) _mm512_storeu_si512(dst + (kp0 + t) * 32, rows[t]);
          }
        } else {
          for (int64_t kp = p0; kp < p1; ++kp)
            for (int r = 0; r < 16; ++r) {
              uint32_t word = 0;
              if (r < live) {
                const bf16_t* src = A + (row0 + r) * g.a_row + 2 * kp * g.a_col;
                word = static_cast<uint32_t>(src[0].bits) | (static_cast<uint32_t>(src[g.a_col].bits) << 16);
              }
              dst[kp * 32 + r] = word;
            }
        }
      }
    });
    for (int64_t jc = 0; jc < n; jc += kNCd) {
      const int64_t nc = std::min(kNCd, n - jc);
      const int64_t groups = (nc + kNBd - 1) / kNBd;
      for (int64_t pc = 0; pc < kp_total; pc += kKCd / 2) {
        const int64_t kcp = std::min(kKCd / 2, kp_total - pc);
        const bool first = pc == 0, last = pc + kcp >= kp_total;
        tnc::parallel_for(groups, 1, threads, [&](int64_t g0, int64_t g1) {
          for (int64_t grp = g0; grp < g1; ++grp) {
            const int64_t c0 = grp * kNBd;
            const int nb = static_cast<int>(std::min<int64_t>(kNBd, nc - c0));
            const bf16_t* brows = B + (jc + c0) * g.b_col + 2 * pc;
            float* ctg = ct + c0 * m_pad;
            // the next group's rows (or the next K block's) are prefetched during the first strip
            const bf16_t* next = grp + 1 < groups ? brows + kNBd * g.b_col : nullptr;
            const int next_rows = grp + 1 < groups ? static_cast<int>(std::min<int64_t>(kNBd, nc - c0 - kNBd)) : 0;
            for (int64_t s = 0; s < strips; ++s) {
              const uint32_t* ap = apack + (s * kp_total + pc) * 32;
              const bf16_t* pf = s == 0 && next_rows == kNBd ? next : nullptr;
              if (m - s * 32 > 16) {
                micro_tile_bf16_nt<2>(kcp, ap, brows, g.b_col, nb, ctg + s * 32, m_pad, first, pf);
              } else {
                micro_tile_bf16_nt<1>(kcp, ap, brows, g.b_col, nb, ctg + s * 32, m_pad, first, pf);
              }
            }
            if (!last) continue;
            // C^T columns c0..c0+nb -> result rows: 16 rows x 16 columns per transpose
            for (int64_t r0 = 0; r0 < m; r0 += 16) {
              const int rows_live = static_cast<int>(std::min<int64_t>(16, m - r0));
              __m512i v[16];
              for (int j = 0; j < 16; ++j)
                v[j] = j < nb ? _mm512_castps_si512(_mm512_loadu_ps(ctg + j * m_pad + r0)) : _mm512_setzero_si512();
              transpose16x16_epi32(v);
              const __mmask16 mk = static_cast<__mmask16>((1u << nb) - 1u);
              for (int r = 0; r < rows_live; ++r)
                _mm256_mask_storeu_epi16(D + (r0 + r) * n + jc + c0, mk,
                                         reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_castsi512_ps(v[r]))));
            }
          }
        });
      }
    }
  }
}

// bfloat16 skinny NT on AVX512-BF16: A and B are both K-contiguous bf16, so consecutive
// elements already form vdpbf16ps's K pairs: 32 products per instruction, no widening.
template <int MR, int NB>
inline void skinny_nt_bf16_block(const uint16_t* __restrict ap, int64_t kp, const uint16_t* __restrict b, int64_t ldb,
                                 int64_t k, int nb, float out[MR][NB]) {
  __m512 acc[MR][NB];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_setzero_ps();
  const uint16_t* rows[NB];
  for (int j = 0; j < NB; ++j) rows[j] = b + std::min(j, nb - 1) * ldb;
  // The next block's rows are fetched into the L2 while this block computes: NB short row
  // streams (2 KiB each at K = 1024) end about when the hardware prefetcher has picked them
  // up, so without this a GEMV left much of the read bandwidth unused. Into the L2, not the
  // L1 (as the GEMV's stream, kRowPrefetchBytes): prefetcht0 was clearly slower when the
  // two were toggled in one process (docs/performance.md). (Past B's end: a prefetch never
  // faults.)
  const uint16_t* next = b + NB * ldb;
  int64_t kk = 0;
  for (; kk + 32 <= k; kk += 32) {
    __m512bh av[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) av[r] = (__m512bh)_mm512_loadu_si512(ap + r * kp + kk);
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(next + j * ldb + kk), _MM_HINT_T1);
      const __m512bh bv = (__m512bh)_mm512_loadu_si512(rows[j] + kk);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], av[r], bv);
    }
  }
  if (kk < k) {
    const __mmask32 mk = static_cast<__mmask32>((uint64_t{1} << (k - kk)) - 1);
    __m512bh av[MR];
    for (int r = 0; r < MR; ++r) av[r] = (__m512bh)_mm512_loadu_si512(ap + r * kp + kk);  // zero-padded
    for (int j = 0; j < NB; ++j) {
      const __m512bh bv = (__m512bh)_mm512_maskz_loadu_epi16(mk, rows[j] + kk);
      for (int r = 0; r < MR; ++r) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], av[r], bv);
    }
  }
  // the MR x NB dots reduced together (one transpose_add, as the GEMV's blocks): one
  // horizontal reduction per dot was a large share of a block at small K (K = 576: 18 steps)
  static_assert(MR * NB <= W, "a block's dots fill at most one vector");
  __m512 sums[W];
#pragma GCC unroll 16
  for (int i = 0; i < W; ++i) sums[i] = i < MR * NB ? acc[i / NB][i % NB] : _mm512_setzero_ps();
  alignas(64) float dot[W];
  _mm512_store_ps(dot, S::transpose_add(sums));
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NB; ++j) out[r][j] = dot[r * NB + j];
}

template <int MR>
void skinny_nt_bf16(const uint16_t* ap, int64_t kp, const uint16_t* B, int64_t ldb, int64_t k, bf16_t* D, int64_t n,
                    int64_t j0, int64_t j1) {
  constexpr int NB = MR <= 2 ? 8 : MR <= 4 ? 4 : 2;
  float out[MR][NB];
  for (int64_t j = j0; j < j1; j += NB) {
    const int nb = static_cast<int>(std::min<int64_t>(NB, j1 - j));
    skinny_nt_bf16_block<MR, NB>(ap, kp, B + j * ldb, ldb, k, nb, out);
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < nb; ++c) D[r * n + j + c] = tnc::from_float<bf16_t>(out[r][c]);
  }
}

// Weight rows stream from memory: a prefetch into the L2 (prefetcht1) this many bytes
// ahead of the loads, one per cache line. In a standalone harness on a Zen 4 the per-row
// dots were faster with it than without, and prefetcht0 instead was worse than none; one
// prefetch per two lines (leaving the pair's other line to the L2's adjacent-line
// prefetcher) left a Zen 5 VM's GEMV at two to four rows 1.3-1.6x slower than one per
// line (docs/performance.md).
constexpr int64_t kRowPrefetchBytes = 4096;

// The dots of one row of B with MR rows of A (each zero-padded to a multiple of 32, kp
// apart), eight accumulators along K in all (C per A row; six for MR = 3), left as one
// vector of partial sums per A row: the row is read once, as one forward stream,
// prefetched kRowPrefetchBytes ahead (past B's end too: a prefetch never faults).
template <int MR>
inline void dot_bf16_nt_sums(const uint16_t* __restrict a, int64_t kp, const uint16_t* __restrict row, int64_t k,
                             __m512 sums[MR]) {
  constexpr int C = MR == 1 ? 8 : MR == 2 ? 4 : 2;
  const int64_t k32 = k / 32 * 32;
  const __mmask32 tail = static_cast<__mmask32>((uint64_t{1} << (k - k32)) - 1);
  __m512 acc[MR][C];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  int64_t kk = 0;
  for (; kk + 32 * C <= k32; kk += 32 * C)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      _mm_prefetch(reinterpret_cast<const char*>(row + kk + 32 * c) + kRowPrefetchBytes, _MM_HINT_T1);
      const __m512bh bv = (__m512bh)_mm512_loadu_si512(row + kk + 32 * c);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r)
        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)_mm512_loadu_si512(a + r * kp + kk + 32 * c), bv);
    }
  for (int c = 0; kk < k32; kk += 32, ++c) {
    const __m512bh bv = (__m512bh)_mm512_loadu_si512(row + kk);
    for (int r = 0; r < MR; ++r)
      acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)_mm512_loadu_si512(a + r * kp + kk), bv);
  }
  if (kk < k) {  // a is zero-padded to a multiple of 32
    const __m512bh bv = (__m512bh)_mm512_maskz_loadu_epi16(tail, row + kk);
    for (int r = 0; r < MR; ++r)
      acc[r][C - 1] = _mm512_dpbf16_ps(acc[r][C - 1], (__m512bh)_mm512_loadu_si512(a + r * kp + kk), bv);
  }
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    __m512 s = acc[r][0];
#pragma GCC unroll 8
    for (int c = 1; c < C; ++c) s = _mm512_add_ps(s, acc[r][c]);
    sums[r] = s;
  }
}

// The same dots reduced to one float per A row. The MoE decode path's row dots
// (kernels/moe_avx512_bf16.h) for up to 4 tokens.
template <int MR>
inline void dot_bf16_nt_rows(const uint16_t* __restrict a, int64_t kp, const uint16_t* __restrict row, int64_t k,
                             float out[MR]) {
  __m512 sums[MR];
  dot_bf16_nt_sums<MR>(a, kp, row, k, sums);
  for (int r = 0; r < MR; ++r) out[r] = _mm512_reduce_add_ps(sums[r]);
}

// The decode GEMV and its batched form (up to four activation rows: a batch of decode
// steps). B's rows are read one after another, each once, against every activation row
// (dot_bf16_nt_sums), so B is one forward stream per thread, which the prefetch above
// keeps ahead of. (Blocks of several B rows read at once, the path for more rows, are as
// many short streams, which the prefetchers follow worse.) The sums of a block of B rows
// are reduced together (S::transpose_add, as the attention kernels finish theirs): a
// horizontal reduction after every row cost a visible share of the bandwidth. Both
// against the per-row form without prefetch: docs/performance.md.
constexpr int kGemvSums = W;  // one vector of results per block
// B rows per block with MR activation rows (the block's MR x rows sums fill at most W)
template <int MR>
constexpr int64_t kGemvBlockRows = kGemvSums / MR;
// For more than one activation row: while A's rows fit in half the L1 beside the stream.
// Past that the blocks of rows were faster (m = 3-4 at K = 7168) or even (m = 4 at
// K = 2816).
constexpr int64_t kGemvMaxABytes = 16 << 10;

template <int MR>
inline void gemv_rows_bf16_nt(const uint16_t* ap, int64_t kp, const uint16_t* B, int64_t ldb, int64_t k, bf16_t* D,
                              int64_t n, int64_t j0, int64_t j1) {
  constexpr int kRows = kGemvBlockRows<MR>;
  int64_t j = j0;
  for (; j + kRows <= j1; j += kRows) {
    __m512 sums[kGemvSums];
    for (int i = kRows * MR; i < kGemvSums; ++i) sums[i] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int c = 0; c < kRows; ++c) dot_bf16_nt_sums<MR>(ap, kp, B + (j + c) * ldb, k, sums + c * MR);
    alignas(64) float dot[kGemvSums];
    _mm512_store_ps(dot, S::transpose_add(sums));
    for (int c = 0; c < kRows; ++c)
      for (int r = 0; r < MR; ++r) D[r * n + j + c] = tnc::from_float<bf16_t>(dot[c * MR + r]);
  }
  for (; j < j1; ++j) {
    float dot[MR];
    dot_bf16_nt_rows<MR>(ap, kp, B + j * ldb, k, dot);
    for (int r = 0; r < MR; ++r) D[r * n + j] = tnc::from_float<bf16_t>(dot[r]);
  }
}

// Parallel over whole blocks of gemv_rows_bf16_nt<MR>'s B rows: only B's last block is partial.
template <int MR>
inline void gemv_bf16_nt(const uint16_t* ap, int64_t kp, const uint16_t* B, int64_t ldb, int64_t k, bf16_t* D,
                         int64_t n, int64_t grain, int threads) {
  constexpr int64_t kRows = kGemvBlockRows<MR>;
  tnc::parallel_for((n + kRows - 1) / kRows, std::max<int64_t>(1, grain / kRows), threads, [&](int64_t b0, int64_t b1) {
    gemv_rows_bf16_nt<MR>(ap, kp, B, ldb, k, D, n, b0 * kRows, std::min(n, b1 * kRows));
  });
}

inline void gemm_skinny_bf16_nt(const tnc::GemmArgs& g, int threads) {
  const int64_t m = g.m, n = g.n, k = g.k, ldb = g.b_col;
  const int64_t kp = (k + 31) / 32 * 32;
  const int64_t grain = std::max<int64_t>(4, 16384 / std::max<int64_t>(1, k));
  uint16_t* ap = reinterpret_cast<uint16_t*>(scratch(static_cast<size_t>(m * kp / 2 + 32), 0));
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    const bf16_t* A = static_cast<const bf16_t*>(g.a) + bi * g.a_batch;
    const uint16_t* B = reinterpret_cast<const uint16_t*>(static_cast<const bf16_t*>(g.b) + bi * g.b_batch);
    bf16_t* D = static_cast<bf16_t*>(g.d) + bi * g.d_batch;
    for (int64_t r = 0; r < m; ++r) {
      uint16_t* dst = ap + r * kp;
      const bf16_t* src = A + r * g.a_row;
      if (g.a_col == 1) {
        std::memcpy(dst, src, static_cast<size_t>(k) * 2);
      } else {
        for (int64_t kk = 0; kk < k; ++kk) dst[kk] = src[kk * g.a_col].bits;
      }
      for (int64_t kk = k; kk < kp; ++kk) dst[kk] = 0;
    }
    if (m == 1 || (m <= 4 && m * kp * 2 <= kGemvMaxABytes)) {
      switch (m) {
        case 1: gemv_bf16_nt<1>(ap, kp, B, ldb, k, D, n, grain, threads); break;
        case 2: gemv_bf16_nt<2>(ap, kp, B, ldb, k, D, n, grain, threads); break;
        case 3: gemv_bf16_nt<3>(ap, kp, B, ldb, k, D, n, grain, threads); break;
        default: gemv_bf16_nt<4>(ap, kp, B, ldb, k, D, n, grain, threads); break;
      }
      continue;
    }
    const int64_t jb = std::max<int64_t>(8, (int64_t{1} << 18) / (2 * std::max<int64_t>(1, k)));
    tnc::parallel_for(n, grain, threads, [&](int64_t j0, int64_t j1) {
      for (int64_t jj0 = j0; jj0 < j1; jj0 += jb) {  // groups of 8 rows over L2-sized blocks of B
        const int64_t jj1 = std::min(j1, jj0 + jb);
        for (int64_t r0 = 0; r0 < m; r0 += 8) {
          switch (std::min<int64_t>(8, m - r0)) {
            case 1: skinny_nt_bf16<1>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
            case 2: skinny_nt_bf16<2>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
            case 3: skinny_nt_bf16<3>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
            case 4: skinny_nt_bf16<4>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
            case 5: skinny_nt_bf16<5>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
            case 6: skinny_nt_bf16<6>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
            case 7: skinny_nt_bf16<7>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
            default: skinny_nt_bf16<8>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
          }
        }
      }
    });
  }
}

// The bfloat16 GEMM entry on AVX-512 BF16: NT products of kDirectMinM (kDirectMinM1 on
// one thread) to kDirectMaxM rows read the weight in place (the direct path); fewer rows
// take vdpbf16ps straight on the operands (gemm_skinny_bf16_nt), other skinny products
// the generic skinny path; everything else packs K pairs.
inline void gemm_entry_avx512_bf16(const tnc::GemmArgs& g, int threads) {
  const bool direct = g.b_row == 1 && g.k % 2 == 0 && g.k > 0 && g.m <= kDirectMaxM && direct_nt_enabled();
  if (direct && g.m >= (threads == 1 ? kDirectMinM1 : kDirectMinM)) {
    gemm_bf16_nt_direct(g, threads);
    return;
  }
  if (g.m <= kSkinnyM && (g.b_row == 1 || g.b_col == 1)) {
    if (g.b_row == 1 && (g.b_col != 1 || g.n == 1) && g.k > 0) {
      gemm_skinny_bf16_nt(g, threads);
      return;
    }
    gemm_skinny<bf16_t>(g, threads);
    return;
  }
  if (direct) {
    gemm_bf16_nt_direct(g, threads);
    return;
  }
  gemm_bf16_dot(g, threads);
}

inline void register_gemm_avx512_bf16(tnc::KernelTable& t) {
  t.replace<tnc::GemmArgs>("gemm", tnc::DType::bf16, gemm_entry_avx512_bf16);
}
