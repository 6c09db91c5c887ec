// The gemm family's code for AVX-512 BF16 (vdpbf16ps), part 1: the packed bfloat16 GEMM
// (its packing transposes in registers: transpose16x16_epi32, simd_avx512.h). Part 2,
// kernels/gemm_avx512_bf16_nt.h, has the products read straight from the weight layout
// and the bfloat16 entry point.
// Included by isa_avx512.cc inside its namespace after kernels/families.h.
#pragma once
// (no includes here on purpose: see kernels/common.h)

#if !defined(__AVX512BF16__)
#error "kernels/gemm_avx512_bf16.h needs -mavx512bf16 (isa_avx512.cc only)"
#endif

// bfloat16 GEMM on AVX512-BF16: vdpbf16ps multiplies pairs of bf16 along K and accumulates
// in float32, twice the rate of the float32 FMA path. Operands are packed as K-pairs:
// A as one 32-bit (a[i,k], a[i,k+1]) word per row, B as 32 columns x one pair each.
constexpr int kMRb = 12;
// K per block (2048 pairs): A micro-panel 96 KB, B panel 256 KB, both read from the L2. A
// decoder's down projection (K = 2816) then runs in one block: 2048 split it in two, and
// the float accumulator's round trip between the blocks cost it time.
constexpr int64_t kKCb = 4096;
constexpr int64_t kNCb = 2048;

// With `out` set (the whole K in one block) the tile is rounded and stored to the bf16
// result directly, skipping the float accumulator's round trip.
inline void micro_tile_bf16(int64_t kp_count, const uint32_t* __restrict ap, const uint16_t* __restrict bp,
                            float* __restrict c, int64_t ldc, int mr, int nr, bool first,
                            bf16_t* __restrict out = nullptr, int64_t ldo = 0) {
  __m512 acc0[kMRb], acc1[kMRb];
#pragma GCC unroll 16
  for (int r = 0; r < kMRb; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < kp_count; ++kp) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + kp * 64);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + kp * 64 + 32);
    const uint32_t* ak = ap + kp * kMRb;
#pragma GCC unroll 16
    for (int r = 0; r < kMRb; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(ak[r]));
      // the broadcast operand last, so it can fold into the instruction as {1to16}
      acc0[r] = _mm512_dpbf16_ps(acc0[r], b0, av);
      acc1[r] = _mm512_dpbf16_ps(acc1[r], b1, av);
    }
  }
  if (out != nullptr) {
    const __mmask16 m0 = static_cast<__mmask16>(nr >= 16 ? 0xffffu : (1u << nr) - 1u);
    const __mmask16 m1 = static_cast<__mmask16>(nr >= 32 ? 0xffffu : nr <= 16 ? 0u : (1u << (nr - 16)) - 1u);
    for (int r = 0; r < mr; ++r) {
      bf16_t* row = out + r * ldo;
      _mm256_mask_storeu_epi16(row, m0, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(acc0[r])));
      _mm256_mask_storeu_epi16(row + 16, m1, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(acc1[r])));
    }
    return;
  }
  if (mr == kMRb && nr == 32) {
#pragma GCC unroll 16
    for (int r = 0; r < kMRb; ++r) {
      float* row = c + r * ldc;
      if (first) {
        _mm512_storeu_ps(row, acc0[r]);
        _mm512_storeu_ps(row + 16, acc1[r]);
      } else {
        _mm512_storeu_ps(row, _mm512_add_ps(_mm512_loadu_ps(row), acc0[r]));
        _mm512_storeu_ps(row + 16, _mm512_add_ps(_mm512_loadu_ps(row + 16), acc1[r]));
      }
    }
    return;
  }
  alignas(64) float tile[kMRb * 32];
  for (int r = 0; r < kMRb; ++r) {
    _mm512_store_ps(tile + r * 32, acc0[r]);
    _mm512_store_ps(tile + r * 32 + 16, acc1[r]);
  }
  for (int r = 0; r < mr; ++r)
    for (int j = 0; j < nr; ++j) c[r * ldc + j] = (first ? 0.f : c[r * ldc + j]) + tile[r * 32 + j];
}

// One panel of B in the micro-kernel's layout: K pairs of [pc, pc + kc) for result columns
// col0..col0 + 31, one 32-bit pair a column (columns from `end` on are zeros).
// (Both packers are forced inline: without the attribute the row split ran NN 1024^3
// slower than before they were factored out of it; with it, as fast.)
[[gnu::always_inline]] inline void pack_b_panel_bf16(const tnc::GemmArgs& g, const bf16_t* B, int64_t pc, int64_t kc,
                                                     int64_t col0, int64_t end, uint16_t* __restrict dst) {
  const int64_t kcp = (kc + 1) / 2;
  const bool full = col0 + 32 <= end && kc % 2 == 0;
  if (full && g.b_col == 1) {  // rows of B contiguous: interleave two rows per K pair
    const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                            37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
    for (int64_t kp = 0; kp < kcp; ++kp) {
      const bf16_t* r0 = B + (pc + 2 * kp) * g.b_row + col0;
      const __m512i x0 = _mm512_loadu_si512(r0), x1 = _mm512_loadu_si512(r0 + g.b_row);
      _mm512_storeu_si512(dst + kp * 64, _mm512_permutex2var_epi16(x0, lo_idx, x1));
      _mm512_storeu_si512(dst + kp * 64 + 32, _mm512_permutex2var_epi16(x0, hi_idx, x1));
    }
    return;
  }
  if (full && g.b_row == 1) {
    // columns of B contiguous along K (the NT layout): each K pair is one 32-bit word, so a
    // panel is a transpose of 32-bit words: 16 columns x 16 pairs per 16x16 register
    // transpose (a gather per pair was the bottleneck)
    for (int h = 0; h < 2; ++h) {
      const bf16_t* base = B + (col0 + 16 * h) * g.b_col + pc;
      uint16_t* dh = dst + 32 * h;
      for (int64_t kp0 = 0; kp0 < kcp; kp0 += 16) {
        const int rem = static_cast<int>(std::min<int64_t>(16, kcp - kp0));
        const __mmask16 mk = static_cast<__mmask16>((1u << rem) - 1u);
        __m512i rows[16];
        for (int r = 0; r < 16; ++r) {
          // 32 row streams at once are more than the hardware prefetcher tracks
          if (kp0 + 128 < kcp)
            _mm_prefetch(reinterpret_cast<const char*>(base + r * g.b_col + 2 * (kp0 + 128)), _MM_HINT_T0);
          rows[r] = _mm512_maskz_loadu_epi32(mk, base + r * g.b_col + 2 * kp0);
        }
        transpose16x16_epi32(rows);
        for (int t = 0; t < rem; ++t) _mm512_storeu_si512(dh + (kp0 + t) * 64, rows[t]);
      }
    }
    return;
  }
  for (int64_t j = 0; j < 32; ++j) {
    const int64_t col = col0 + j;
    const bool live = col < end;
    const bf16_t* src = B + (live ? col : 0) * g.b_col + pc * g.b_row;
    for (int64_t kp = 0; kp < kcp; ++kp) {
      const int64_t kk = 2 * kp;
      dst[kp * 64 + 2 * j] = live ? src[kk * g.b_row].bits : 0;
      dst[kp * 64 + 2 * j + 1] = (live && kk + 1 < kc) ? src[(kk + 1) * g.b_row].bits : 0;
    }
  }
}

// One micro-panel of A: rows row0..row0 + kMRb - 1 (rows from m on are zeros), K pairs of
// [pc, pc + kc), one 32-bit pair a row.
[[gnu::always_inline]] inline void pack_a_tile_bf16(const tnc::GemmArgs& g, const bf16_t* A, int64_t row0, int64_t pc,
                                                    int64_t kc, uint32_t* __restrict dst) {
  const int64_t m = g.m, kcp = (kc + 1) / 2;
  if (g.a_col == 1 && kc % 2 == 0) {
    // rows of A contiguous along K: a micro-panel is a transpose of 32-bit K pairs, 16 pairs
    // x 12 rows (4 zero rows) per 16x16 register transpose
    const int live = static_cast<int>(std::min<int64_t>(kMRb, m - row0));
    for (int64_t kp0 = 0; kp0 < kcp; kp0 += 16) {
      const int rem = static_cast<int>(std::min<int64_t>(16, kcp - kp0));
      const __mmask16 mk = static_cast<__mmask16>((1u << rem) - 1u);
      __m512i rows[16];
      for (int r = 0; r < 16; ++r)
        rows[r] =
            r < live ? _mm512_maskz_loadu_epi32(mk, A + (row0 + r) * g.a_row + pc + 2 * kp0) : _mm512_setzero_si512();
      transpose16x16_epi32(rows);
      for (int t = 0; t < rem; ++t) _mm512_mask_storeu_epi32(dst + (kp0 + t) * kMRb, 0x0fff, rows[t]);
    }
    return;
  }
  for (int r = 0; r < kMRb; ++r) {
    const int64_t row = row0 + r;
    if (row >= m) {
      for (int64_t kp = 0; kp < kcp; ++kp) dst[kp * kMRb + r] = 0;
      continue;
    }
    const bf16_t* src = A + row * g.a_row + pc * g.a_col;
    for (int64_t kp = 0; kp < kcp; ++kp) {
      const int64_t kk = 2 * kp;
      const uint32_t lo = src[kk * g.a_col].bits;
      const uint32_t hi = kk + 1 < kc ? src[(kk + 1) * g.a_col].bits : 0u;
      dst[kp * kMRb + r] = lo | (hi << 16);
    }
  }
}

// NT products (B rows contiguous along K: F.linear's weight) with up to this much of A
// (bf16 bytes) take the panel split (gemm_bf16_dot_panels), which reads all of A from the
// L3 once a panel; others the row split, whose row blocks stay in the L2. In paired
// processes on a Zen 4 the panel split was as fast or faster up to about 3 MB of A and
// slower beyond it, and slower for NN products, whose panels pack from strided rows with
// nothing prefetched (docs/performance.md).
constexpr int64_t kPanelsMaxABytes = 3 << 20;

// An NT product (B's rows are the weight's, contiguous along K) with the whole K in one
// block (k <= kKCb): the threads split the result's 32-column panels, and each packs a
// panel just before it multiplies it with every row, into a buffer of its own, read back
// from its L2. A is packed once for all rows, shared. (Splitting the rows
// instead made every thread wait for the whole of B to be packed, and left one thread a
// tile more than the other: 43 tiles at m = 512.)
inline void gemm_bf16_dot_panels(const tnc::GemmArgs& g, const bf16_t* A, const bf16_t* B, bf16_t* D, int threads) {
  const int64_t m = g.m, n = g.n, k = g.k, kcp = (k + 1) / 2;
  const int64_t tiles = (m + kMRb - 1) / kMRb, panels = (n + 31) / 32;
  uint32_t* apack = reinterpret_cast<uint32_t*>(scratch(static_cast<size_t>(tiles * kMRb * kcp), 1));
  tnc::parallel_for(tiles, 1, threads, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) pack_a_tile_bf16(g, A, t * kMRb, 0, k, apack + t * kMRb * kcp);
  });
  // the next panel's 32 weight rows are prefetched a slice of their lines per tile
  const int64_t row_lines = (k * 2 + 63) / 64, slice = (32 * row_lines + tiles - 1) / tiles;
  tnc::parallel_for(panels, 1, threads, [&](int64_t p0, int64_t p1) {
    uint16_t* bpanel = reinterpret_cast<uint16_t*>(scratch(static_cast<size_t>(kcp * 32), 2));
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t col0 = p * 32;
      const int nr = static_cast<int>(std::min<int64_t>(32, n - col0));
      pack_b_panel_bf16(g, B, 0, k, col0, n, bpanel);
      const bool ahead = p + 1 < p1 && col0 + 64 <= n;  // the next panel, full and this thread's
      for (int64_t t = 0; t < tiles; ++t) {
        if (ahead) {
          for (int64_t i = t * slice, e = std::min(32 * row_lines, i + slice); i < e; ++i)
            _mm_prefetch(
                reinterpret_cast<const char*>(B + (col0 + 32 + i / row_lines) * g.b_col) + (i % row_lines) * 64,
                _MM_HINT_T1);
        }
        const int mr = static_cast<int>(std::min<int64_t>(kMRb, m - t * kMRb));
        micro_tile_bf16(kcp, apack + t * kMRb * kcp, bpanel, nullptr, 0, mr, nr, true, D + t * kMRb * n + col0, n);
      }
    }
  });
}

// Product bi of a batched GEMM (for_each_product), on `threads` threads.
inline void gemm_bf16_dot_product(const tnc::GemmArgs& g, int64_t bi, int threads) {
  const int64_t m = g.m, n = g.n, k = g.k;
  const bf16_t* A = static_cast<const bf16_t*>(g.a) + bi * g.a_batch;
  const bf16_t* B = static_cast<const bf16_t*>(g.b) + bi * g.b_batch;
  bf16_t* D = static_cast<bf16_t*>(g.d) + bi * g.d_batch;
  if (g.b_row == 1 && k <= kKCb && m * k * 2 <= kPanelsMaxABytes) {
    gemm_bf16_dot_panels(g, A, B, D, threads);
    return;
  }
  // per block of kNCb columns, B packed by all threads, then row blocks split among them;
  // K in blocks of kKCb, the partial sums in a float accumulator where there are several
  const int64_t nc_max = std::min(kNCb, (n + 31) / 32 * 32);
  // row blocks: at most 12 micro-tiles tall, at least two per thread, and a multiple of
  // the thread count (11 blocks on 2 threads left one thread idle for a twelfth of the time)
  const int64_t tiles = (m + kMRb - 1) / kMRb;
  int64_t want_blocks = std::max<int64_t>((tiles + 11) / 12, 2 * threads);
  want_blocks = std::min<int64_t>(tiles, (want_blocks + threads - 1) / threads * threads);
  const int64_t mc = (tiles + want_blocks - 1) / want_blocks * kMRb;
  const int64_t kcp_max = (std::min(kKCb, k) + 1) / 2;
  uint16_t* bpack = reinterpret_cast<uint16_t*>(scratch(static_cast<size_t>(kcp_max * nc_max), 2));
  float* cacc = scratch(static_cast<size_t>(m * nc_max), 3);
  for (int64_t jc = 0; jc < n; jc += kNCb) {
    const int64_t nc = std::min(kNCb, n - jc);
    const int64_t panels = (nc + 31) / 32;
    for (int64_t pc = 0; pc < k; pc += kKCb) {
      const int64_t kc = std::min(kKCb, k - pc), kcp = (kc + 1) / 2;
      const bool first = pc == 0, last = pc + kc >= k;
      tnc::parallel_for(panels, 1, threads, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) pack_b_panel_bf16(g, B, pc, kc, jc + p * 32, jc + nc, bpack + p * kcp * 64);
      });
      const int64_t mblocks = (m + mc - 1) / mc;
      tnc::parallel_for(mblocks, 1, threads, [&](int64_t b0, int64_t b1) {
        uint32_t* apack = reinterpret_cast<uint32_t*>(scratch(static_cast<size_t>(mc * kcp_max), 1));
        for (int64_t blk = b0; blk < b1; ++blk) {
          const int64_t ic = blk * mc, mcur = std::min(mc, m - ic);
          for (int64_t ir = 0; ir < mcur; ir += kMRb) pack_a_tile_bf16(g, A, ic + ir, pc, kc, apack + ir * kcp);
          for (int64_t p = 0; p < panels; ++p) {
            const int nr = static_cast<int>(std::min<int64_t>(32, nc - p * 32));
            for (int64_t ir = 0; ir < mcur; ir += kMRb) {
              const int mr = static_cast<int>(std::min<int64_t>(kMRb, mcur - ir));
              micro_tile_bf16(kcp, apack + ir * kcp, bpack + p * kcp * 64, cacc + (ic + ir) * nc_max + p * 32, nc_max,
                              mr, nr, first, first && last ? D + (ic + ir) * n + jc + p * 32 : nullptr, n);
            }
          }
          if (last && !first) {
            for (int64_t i = ic; i < ic + mcur; ++i) {
              const float* crow = cacc + i * nc_max;
              bf16_t* drow = D + i * n + jc;
              for (int64_t j = 0; j < nc; j += W) storec(drow + j, loadc(crow + j, nc - j), nc - j);
            }
          }
        }
      });
    }
  }
}

inline void gemm_bf16_dot(const tnc::GemmArgs& g, int threads) {
  if (g.k == 0) {
    gemm<bf16_t>(g, threads);
    return;
  }
  for_each_product(g.batch, threads, [&](int64_t bi, int thr) { gemm_bf16_dot_product(g, bi, thr); });
}
