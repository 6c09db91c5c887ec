// The quant family's decode path on x86 (kernels/gemm_quant.h has the drivers and the
// scalar decoders whose arithmetic these reproduce): 32 weight codes per 256-bit vector
// (on AVX-512, Q4_0/Q4_1 four blocks per 512-bit vector), unsigned-by-signed byte dot
// products against the quantized activation, by vpdpbusd where the build has AVX-512 VNNI
// and by vpmaddubsw + vpmaddwd on AVX2. A weight block is decoded once and dotted with
// every activation row of the call (up to four at a time). Each row keeps two float
// accumulators (even and odd blocks, or low and high nibbles), since a short row (K = 576:
// 18 blocks) is otherwise one long chain of dependent FMAs.
// Included inside isa_avx2.cc's and isa_avx512.cc's namespaces after kernels/families.h.
#pragma once
// (no includes here on purpose: see kernels/common.h)

// the 8 int32 sums of four products u * s (u unsigned bytes, s signed; |s| <= 127 and
// u <= 128, so AVX2's pairwise int16 sums cannot saturate)
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// 16 bytes of nibbles -> 32 codes: the low nibbles, then the high ones
inline __m256i nibbles32(const uint8_t* p) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), _mm256_set1_epi8(15));
}

// A decode GEMV reads each weight row once, from memory: the hardware prefetcher alone left
// the per-layer GEMVs well short of the read bandwidth. The bytes this far ahead of the row
// being read (the rows after it, which the same thread reads next) are asked for now.
constexpr int64_t kQuantPrefetchBytes = 2048;

inline void prefetch_ahead(const uint8_t* row, int64_t row_bytes) {
  const char* ahead = reinterpret_cast<const char*>(row) + kQuantPrefetchBytes;
  for (int64_t o = 0; o < row_bytes; o += 64) _mm_prefetch(ahead + o, _MM_HINT_T0);
}

inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The rows r0..r0+MR-1 of a quantized activation, and their two accumulators each.
template <int MR>
struct QRows {
  const int8_t* q[MR];
  const float* da[MR];
  const float* ds[MR];
  __m256 acc[MR][2];
  __m256 offv[MR];   // vector offset terms (the K-quants' mins, Q6_K's 32)
  float off[MR][2];  // scalar offset terms (Q4_0's 8, Q4_1's m, zero points)

  QRows(const QAct& a, int64_t r0) {
    for (int r = 0; r < MR; ++r) {
      q[r] = a.q + (r0 + r) * a.q_stride;
      da[r] = a.da + (r0 + r) * a.lanes;
      ds[r] = a.ds + (r0 + r) * a.lanes;
      acc[r][0] = acc[r][1] = offv[r] = _mm256_setzero_ps();
      off[r][0] = off[r][1] = 0.f;
    }
  }
  // acc[r][P] += dot(codes, the row's 32 codes at c) * scale
  template <int P>
  void add(int r, __m256i codes, int64_t c, float scale) {
    acc[r][P] =
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(codes, load32(q[r] + c))), _mm256_set1_ps(scale), acc[r][P]);
  }
  void finish(float* out) const {
    for (int r = 0; r < MR; ++r)
      out[r] = hsum8(_mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), offv[r])) + off[r][0] + off[r][1];
  }
};

// Rows of 32-element blocks (Q8_0, Q4_0, Q4_1): per block, d * (da * dot) + m * ds, with
// m = Q4_1's offset, -8 d for Q4_0, 0 for Q8_0 (whose signed codes go through vpsignb).
template <GgmlType G, int MR>
inline void x86_dot_blocks32(const uint8_t* b, int64_t nb, QRows<MR>& R) {
  constexpr int64_t TS = ggml_type_size(G);
  const auto block = [&]<int P>(int64_t i) {
    const uint8_t* blk = b + i * TS;
    const float d = f16_at(blk);
    if constexpr (G == GgmlType::q8_0) {
      const __m256i w = load32(blk + 2);
      const __m256i u = _mm256_sign_epi8(w, w);
      for (int r = 0; r < MR; ++r) {
        const __m256i s = _mm256_sign_epi8(load32(R.q[r] + 32 * i), w);
        R.acc[r][P] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(u, s)), _mm256_set1_ps(d * R.da[r][i]), R.acc[r][P]);
      }
    } else {
      const __m256i u = nibbles32(blk + (G == GgmlType::q4_0 ? 2 : 4));
      const float m = G == GgmlType::q4_0 ? -8.f * d : f16_at(blk + 2);
      for (int r = 0; r < MR; ++r) {
        R.template add<P>(r, u, 32 * i, d * R.da[r][i]);
        R.off[r][P] += m * R.ds[r][i];
      }
    }
  };
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    block.template operator()<0>(i);
    block.template operator()<1>(i + 1);
  }
  if (i < nb) block.template operator()<0>(i);
}

#if defined(__AVX512VNNI__)
// AVX-512: Q4_0 / Q4_1 rows four blocks per 512-bit vector. Lane t of the vector holds block
// t's 16 nibble bytes, so its low nibbles are the block's codes 0-15 and its high ones
// 16-31, which is how the activation's nib16x4 order lays out its codes; vpdpbusd's four
// sums of lane t are then block t's, scaled by one vector of the four blocks' d * da.
constexpr bool kWideQ4 = true;

template <GgmlType G, int MR>
inline void x86_dot_q4_wide(const uint8_t* b, int64_t nb, QRows<MR>& R) {
  constexpr int64_t TS = ggml_type_size(G), QS = G == GgmlType::q4_0 ? 2 : 4;
  const __m512i m4 = _mm512_set1_epi8(15);
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  __m512 acc[MR];
  __m128 offs[MR];
  for (int r = 0; r < MR; ++r) {
    acc[r] = _mm512_setzero_ps();
    offs[r] = _mm_setzero_ps();
  }
  for (int64_t i = 0; i < nb; i += 4) {
    const uint8_t* p = b + i * TS;
    const auto word = [&](int t) {  // block t's first 4 bytes: d (and Q4_1's m) as float16 bits
      uint32_t v;
      std::memcpy(&v, p + t * TS, 4);
      return static_cast<int>(v);
    };
    __m512i z;
    __m128i head;
    if (nb - i >= 4) {
      z = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + QS)));
      z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + TS + QS)), 1);
      z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * TS + QS)), 2);
      z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 3 * TS + QS)), 3);
      head = _mm_setr_epi32(word(0), word(1), word(2), word(3));
    } else {  // the row's last, short group: the missing blocks read as zeros
      const auto nib = [&](int t) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + t * TS + QS)); };
      const int blocks = static_cast<int>(nb - i);
      z = _mm512_castsi128_si512(nib(0));  // (the upper lanes: zeroed below)
      z = _mm512_maskz_mov_epi32(0x000f, z);
      if (blocks > 1) z = _mm512_inserti32x4(z, nib(1), 1);
      if (blocks > 2) z = _mm512_inserti32x4(z, nib(2), 2);
      head = _mm_setr_epi32(word(0), blocks > 1 ? word(1) : 0, blocks > 2 ? word(2) : 0, 0);
    }
    const __m512i lo = _mm512_and_si512(z, m4), hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
    // [d0 m0 d1 m1 d2 m2 d3 m3] (Q4_0: m = 0) -> d and m of the four blocks
    const __m256 dm = _mm256_cvtph_ps(head);
    const __m128 d = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0)));
    __m128 m = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(1, 3, 5, 7, 0, 0, 0, 0)));
    if constexpr (G == GgmlType::q4_0) m = _mm_mul_ps(d, _mm_set1_ps(-8.f));
    for (int r = 0; r < MR; ++r) {
      const int8_t* q = R.q[r] + 32 * i;  // nib16x4: four blocks' codes 0-15, then their 16-31
      const __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(q)),
                                              hi, _mm512_loadu_si512(q + 64));
      const __m128 scale = _mm_mul_ps(d, _mm_loadu_ps(R.da[r] + i));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(scale)),
                               acc[r]);
      offs[r] = _mm_fmadd_ps(m, _mm_loadu_ps(R.ds[r] + i), offs[r]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    R.off[r][0] += _mm512_reduce_add_ps(acc[r]) + _mm_cvtss_f32(_mm_hadd_ps(_mm_hadd_ps(offs[r], offs[r]), offs[r]));
  }
}
#else
constexpr bool kWideQ4 = false;
#endif

// Rows of Q4_K / Q5_K blocks (256: eight sub-blocks of 32 with 6-bit scales and mins):
// per sub-block j, d sc_j (da dot) - dmin mn_j ds.
template <GgmlType G, int MR>
inline void x86_dot_k4(const uint8_t* b, int64_t nb, QRows<MR>& R) {
  constexpr int64_t TS = ggml_type_size(G);
  const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* blk = b + i * TS;
    const float d = f16_at(blk), dmin = f16_at(blk + 2);
    alignas(32) int sc[8], mn[8];
    for (int j = 0; j < 8; ++j) k4_scale_min(blk + 4, j, sc[j], mn[j]);
    const __m256 scf =
        _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sc))));
    const __m256 mnf = _mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(mn)));
    alignas(32) float sd[MR][8];
    for (int r = 0; r < MR; ++r) {
      _mm256_store_ps(sd[r], _mm256_mul_ps(scf, _mm256_loadu_ps(R.da[r] + 8 * i)));
      R.offv[r] =
          _mm256_fnmadd_ps(_mm256_mul_ps(mnf, _mm256_loadu_ps(R.ds[r] + 8 * i)), _mm256_set1_ps(dmin), R.offv[r]);
    }
    const uint8_t* qs = blk + (G == GgmlType::q4_k ? 16 : 48);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (G == GgmlType::q5_k) qh = load32(blk + 16);
    for (int p = 0; p < 4; ++p) {
      const __m256i v = load32(qs + 32 * p);
      __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      if constexpr (G == GgmlType::q5_k) {  // bit j of qh[l] is the fifth bit of sub-block j's code l
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * p), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * p + 1), one), 4));
      }
      for (int r = 0; r < MR; ++r) {
        R.template add<0>(r, lo, 256 * i + 64 * p, sd[r][2 * p]);
        R.template add<1>(r, hi, 256 * i + 64 * p + 32, sd[r][2 * p + 1]);
      }
    }
  }
}

// Rows of Q6_K blocks (256: codes of 6 bits, less 32, in sixteen runs of 16 with int8
// scales): a 32-code vector spans two runs, so its dot's low four sums take one scale and
// its high four the next (lanes of 16: the activation's da and ds per 16).
template <int MR>
inline void x86_dot_q6k(const uint8_t* b, int64_t nb, QRows<MR>& R) {
  const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* blk = b + i * 210;
    const float d = f16_at(blk + 208);
    const __m128i sc16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
    const __m256 sc_lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc16));
    const __m256 sc_hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc16, 8)));
    for (int r = 0; r < MR; ++r) {
      const __m256 t = _mm256_fmadd_ps(sc_lo, _mm256_loadu_ps(R.ds[r] + 16 * i),
                                       _mm256_mul_ps(sc_hi, _mm256_loadu_ps(R.ds[r] + 16 * i + 8)));
      R.offv[r] = _mm256_fnmadd_ps(t, _mm256_set1_ps(32.f * d), R.offv[r]);
    }
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load32(blk + 64 * h), ql1 = load32(blk + 64 * h + 32), qh = load32(blk + 128 + 32 * h);
      const __m256i c[4] = {_mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4)),
                            _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4))};
      for (int t = 0; t < 4; ++t) {
        const int s = 4 * h + t;  // the block's 32-code run: scales 2s and 2s + 1
        const __m128i pick = _mm_setr_epi8(2 * s, 2 * s, 2 * s, 2 * s, 2 * s + 1, 2 * s + 1, 2 * s + 1, 2 * s + 1, 0, 0,
                                           0, 0, 0, 0, 0, 0);
        const __m256 scale =
            _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_shuffle_epi8(sc16, pick))));
        for (int r = 0; r < MR; ++r) {
          const __m256 p = _mm256_cvtepi32_ps(dot_u8s8(c[t], load32(R.q[r] + 256 * i + 32 * s)));
          R.acc[r][t & 1] =
              _mm256_fmadd_ps(p, _mm256_mul_ps(scale, _mm256_set1_ps(R.da[r][16 * i + 2 * s])), R.acc[r][t & 1]);
        }
      }
    }
  }
}

template <GgmlType G>
struct X86GgufDec {
  const uint8_t* w;
  int64_t row_bytes, k;
  static constexpr bool kWide = kWideQ4 && (G == GgmlType::q4_0 || G == GgmlType::q4_1);
  ActLayout layout{G == GgmlType::q6_k ? 16 : 32, kWide ? 128 : 32, kWide ? ActOrder::nib16x4 : ActOrder::natural};
  template <int MR>
  void dot(int64_t j, const QAct& a, int64_t r0, float* out) const {
    QRows<MR> R(a, r0);
    const uint8_t* b = w + j * row_bytes;
    prefetch_ahead(b, row_bytes);
    if constexpr (kWide) {
#if defined(__AVX512VNNI__)
      x86_dot_q4_wide<G>(b, k / 32, R);
#endif
    } else if constexpr (G == GgmlType::q4_k || G == GgmlType::q5_k) {
      x86_dot_k4<G>(b, k / 256, R);
    } else if constexpr (G == GgmlType::q6_k) {
      x86_dot_q6k(b, k / 256, R);
    } else {
      x86_dot_blocks32<G>(b, k / 32, R);
    }
    R.finish(out);
  }
};

// upstream's 4-bit groups: per 32 K indices (16 bytes; the low nibbles are the even
// indices, hence the activation's even_odd32 order), s (da dot) - s z ds with the group's
// scale s and zero z.
struct X86W4Dec {
  const tnc::GemmW4A16Args* g;
  ActLayout layout{32, 32, ActOrder::even_odd32};
  static bool serves(int64_t group) { return group % 32 == 0; }
  template <int MR>
  void dot(int64_t j, const QAct& a, int64_t r0, float* out) const {
    QRows<MR> R(a, r0);
    const int64_t groups = g->k / g->group, per_group = g->group / 32;
    const uint8_t* row = g->w + j * (g->k / 2);
    const uint8_t* zero = g->zero + j * groups;
    prefetch_ahead(row, g->k / 2);
    const auto segment = [&]<int P>(int64_t i) {
      const int64_t gi = i / per_group;
      const float s = g->scale_f16 ? f16_at(static_cast<const uint8_t*>(g->scale) + 2 * (j * groups + gi))
                                   : static_cast<const float*>(g->scale)[j * groups + gi];
      const float sz = s * static_cast<float>(zero[gi]);
      const __m256i u = nibbles32(row + 16 * i);
      for (int r = 0; r < MR; ++r) {
        R.template add<P>(r, u, 32 * i, s * R.da[r][i]);
        R.off[r][P] -= sz * R.ds[r][i];
      }
    };
    const int64_t nseg = g->k / 32;
    int64_t i = 0;
    for (; i + 2 <= nseg; i += 2) {
      segment.template operator()<0>(i);
      segment.template operator()<1>(i + 1);
    }
    if (i < nseg) segment.template operator()<0>(i);
    R.finish(out);
  }
};

#if defined(__AVX512BF16__)
using X86Prefill = Bf16TablePrefill;
#else
using X86Prefill = BlockedPrefill;
#endif

inline void register_quant_x86(tnc::KernelTable& t) { register_quant_gemms<X86GgufDec, X86W4Dec, X86Prefill, true>(t); }
