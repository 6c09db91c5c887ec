// The quant family's formats, written once and compiled per ISA: dequantizing GGML blocks
// and 4-bit groups to float (exactly as tileops.quant.ggml_blocks / int4 do: every product
// is exact in float32, so the one rounding is the final add of Q4_1 and the K-quants'
// subtraction, whatever the compiler fuses), and quantizing activation rows to 8-bit
// blocks for the integer dot products (kernels/gemm_quant*.h).
// Included inside a per-ISA namespace by kernels/families.h.
#pragma once
// (no includes here on purpose: see kernels/common.h)

using tnc::GgmlType;

// weights per block and bytes per block of each type (kernels/quant_args.h)
constexpr int64_t ggml_block_size(GgmlType t) { return tnc::ggml_block(t).block; }
constexpr int64_t ggml_type_size(GgmlType t) { return tnc::ggml_block(t).bytes; }
constexpr bool ggml_is_float(GgmlType t) { return t == GgmlType::f32 || t == GgmlType::f16 || t == GgmlType::bf16; }

// the float16 at p (unaligned), exactly
inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return tnc::to_float(half_t{h});
}

// The 6-bit scale and min of sub-block j (0-7) of a Q4_K/Q5_K block from its 12 scale bytes:
// bytes 0-3 scales 0-3 and 4-7 mins 0-3 in their low 6 bits; bytes 8-11 scales 4-7 (low
// nibble) and mins 4-7 (high nibble), whose top two bits are those of bytes 0-3 and 4-7.
inline void k4_scale_min(const uint8_t* s, int j, int& sc, int& mn) {
  if (j < 4) {
    sc = s[j] & 63;
    mn = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// ---------------------------------------------------------------------------------------
// dequantizing: weights [k0, k1) of a row (multiples of the block size) -> float

template <GgmlType G>
inline void dequant_row(const uint8_t* row, int64_t k0, int64_t k1, float* __restrict out) {
  constexpr int64_t BS = ggml_block_size(G), TS = ggml_type_size(G);
  const uint8_t* b = row + k0 / BS * TS;
  if constexpr (G == GgmlType::f32) {
    std::memcpy(out, b, static_cast<size_t>(k1 - k0) * 4);
  } else if constexpr (G == GgmlType::f16 || G == GgmlType::bf16) {
    using H = std::conditional_t<G == GgmlType::f16, half_t, bf16_t>;
    const H* h = reinterpret_cast<const H*>(b);
    const int64_t n = k1 - k0;
    int64_t i = 0;
    for (; i + W <= n; i += W) S::store(out + i, S::load(h + i));
    for (; i < n; ++i) out[i] = tnc::to_float(h[i]);
#if defined(__AVX2__)
  } else if constexpr (G == GgmlType::q8_0 || G == GgmlType::q4_0 || G == GgmlType::q4_1) {
    // the same products and adds, eight weights a vector (the prefill dequantizes every
    // weight of a call: scalar code made that a third of a 64-row GEMM)
    for (int64_t kk = k0; kk < k1; kk += BS, b += TS, out += BS) {
      const __m256 d = _mm256_set1_ps(half_at(b));
      if constexpr (G == GgmlType::q8_0) {
        for (int i = 0; i < 32; i += 8) {
          const __m128i c = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + i));
          _mm256_storeu_ps(out + i, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c))));
        }
      } else {
        const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (G == GgmlType::q4_0 ? 2 : 4)));
        const __m128i lo = _mm_and_si128(x, _mm_set1_epi8(15)),
                      hi = _mm_and_si128(_mm_srli_epi16(x, 4), _mm_set1_epi8(15));
        const __m128i codes[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int i = 0; i < 4; ++i) {
          const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes[i]));
          if constexpr (G == GgmlType::q4_0) {
            _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(d, _mm256_sub_ps(q, _mm256_set1_ps(8.f))));
          } else {  // d * q + m: one rounding (fused or not, d * q is exact)
            _mm256_storeu_ps(out + 8 * i, _mm256_add_ps(_mm256_mul_ps(d, q), _mm256_set1_ps(half_at(b + 2))));
          }
        }
      }
    }
#endif
  } else {
    for (int64_t kk = k0; kk < k1; kk += BS, b += TS, out += BS) {
      if constexpr (G == GgmlType::q8_0) {
        const float d = half_at(b);
        for (int i = 0; i < 32; ++i) out[i] = d * static_cast<float>(static_cast<int8_t>(b[2 + i]));
      } else if constexpr (G == GgmlType::q4_0) {
        const float d = half_at(b);
        for (int i = 0; i < 16; ++i) {
          out[i] = d * static_cast<float>((b[2 + i] & 15) - 8);
          out[i + 16] = d * static_cast<float>((b[2 + i] >> 4) - 8);
        }
      } else if constexpr (G == GgmlType::q4_1) {
        const float d = half_at(b), m = half_at(b + 2);
        for (int i = 0; i < 16; ++i) {
          out[i] = d * static_cast<float>(b[4 + i] & 15) + m;
          out[i + 16] = d * static_cast<float>(b[4 + i] >> 4) + m;
        }
      } else if constexpr (G == GgmlType::q4_k || G == GgmlType::q5_k) {
        const float d = half_at(b), dmin = half_at(b + 2);
        const uint8_t* qh = b + 16;
        const uint8_t* qs = b + (G == GgmlType::q4_k ? 16 : 48);
        for (int p = 0; p < 4; ++p) {
          int sc0, mn0, sc1, mn1;
          k4_scale_min(b + 4, 2 * p, sc0, mn0);
          k4_scale_min(b + 4, 2 * p + 1, sc1, mn1);
          const float d0 = d * static_cast<float>(sc0), m0 = dmin * static_cast<float>(mn0);
          const float d1 = d * static_cast<float>(sc1), m1 = dmin * static_cast<float>(mn1);
          for (int l = 0; l < 32; ++l) {
            int q0 = qs[32 * p + l] & 15, q1 = qs[32 * p + l] >> 4;
            if constexpr (G == GgmlType::q5_k) {
              q0 |= ((qh[l] >> (2 * p)) & 1) << 4;
              q1 |= ((qh[l] >> (2 * p + 1)) & 1) << 4;
            }
            out[64 * p + l] = d0 * static_cast<float>(q0) - m0;
            out[64 * p + 32 + l] = d1 * static_cast<float>(q1) - m1;
          }
        }
      } else {  // Q6_K: halves of 128, four runs of 32 each (docs/quantized.md)
        const float d = half_at(b + 208);
        for (int h = 0; h < 2; ++h) {
          const uint8_t* ql = b + 64 * h;
          const uint8_t* qh = b + 128 + 32 * h;
          const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h;
          float* o = out + 128 * h;
          for (int l = 0; l < 32; ++l) {
            const int q0 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q1 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            o[l] = (d * static_cast<float>(sc[l / 16])) * static_cast<float>(q0);
            o[l + 32] = (d * static_cast<float>(sc[2 + l / 16])) * static_cast<float>(q1);
            o[l + 64] = (d * static_cast<float>(sc[4 + l / 16])) * static_cast<float>(q2);
            o[l + 96] = (d * static_cast<float>(sc[6 + l / 16])) * static_cast<float>(q3);
          }
        }
      }
    }
  }
}

// (q - zero) * scale for K [k0, k1) of a 4-bit row (K index 2i in the low nibble of byte i)
inline void dequant_w4_row(const uint8_t* row, const void* scale, bool scale_f16, const uint8_t* zero, int64_t group,
                           int64_t k0, int64_t k1, float* __restrict out) {
  for (int64_t g0 = k0 / group * group; g0 < k1; g0 += group) {
    const int64_t gi = g0 / group;
    const float s =
        scale_f16 ? tnc::to_float(static_cast<const half_t*>(scale)[gi]) : static_cast<const float*>(scale)[gi];
    const int z = zero[gi];
    const int64_t lo = std::max(g0, k0), hi = std::min(g0 + group, k1);
    for (int64_t kk = lo; kk < hi; ++kk) {
      const int q = (row[kk >> 1] >> ((kk & 1) * 4)) & 15;
      out[kk - k0] = static_cast<float>(q - z) * s;
    }
  }
}

// ---------------------------------------------------------------------------------------
// activation rows quantized to 8-bit blocks, in the order a kernel's vectors read them

// Each block of 32 gets one float scale da = amax / 127 and int8 codes round(x / da) in
// [-127, 127]. A decoder's lanes are blocks of 32 (or halves of them: Q6_K's scales are per
// 16); per lane it reads da and ds = da * (the lane's sum of codes), which carries the
// weights' offsets (Q4_0's 8, Q6_K's 32, zero points) and mins. `order` arranges the codes
// within each step as the weight's vectors hold their codes:
//   natural      as the activation
//   nib16x4      per 128 (four blocks): elements 0-15 of each block, then 16-31 of each
//                (AVX-512 Q4_0/Q4_1: one vector holds four blocks' low nibbles, another
//                their high ones)
//   even_odd128  per 128: the even K indices, then the odd ones (AVX-512 4-bit groups)
//   even_odd64   per 64: likewise
//   even_odd32   per 32: likewise (the x86 decoders' 4-bit groups: a byte's low nibble is
//                an even K index, its high one the next odd one)
//   kpairs256    per 256: blocks in the order 0 2 1 3 4 6 5 7 (AVX-512 Q4_K/Q5_K: a vector
//                of 64 codes holds sub-blocks 2p and 2p + 2, low nibbles or high ones); the
//                lanes follow the blocks' new order
enum class ActOrder { natural, nib16x4, even_odd128, even_odd64, even_odd32, kpairs256 };
struct ActLayout {
  int lane_elems;  // 32, or 16 (Q6_K)
  int64_t step;    // rows are padded with zeros (da = ds = 0) to a multiple of this
  ActOrder order;
};

// The quantized rows: row r's codes at q + r * q_stride, its lanes at da/ds + r * lanes.
struct QAct {
  const int8_t* q;
  const float* da;
  const float* ds;
  int64_t q_stride, lanes;
};

inline int64_t act_padded(int64_t k, const ActLayout& L) { return (k + L.step - 1) / L.step * L.step; }

// Floats of scratch one row takes: its codes (kp bytes) and 2 * lanes floats.
inline int64_t act_row_floats(int64_t k, const ActLayout& L) {
  const int64_t kp = act_padded(k, L);
  return kp / 4 + 2 * (kp / L.lane_elems);
}

// Quantizes row x[0, k) (k a multiple of 32) into the layout; q, da, ds as QAct's row.
template <class T>
inline void quantize_act_row(const T* x, int64_t k, const ActLayout& L, int8_t* __restrict q, float* __restrict da,
                             float* __restrict ds) {
  const int64_t kp = act_padded(k, L), lanes = kp / L.lane_elems;
  std::memset(q + k, 0, static_cast<size_t>(kp - k));
  for (int64_t l = k / L.lane_elems; l < lanes; ++l) da[l] = ds[l] = 0.f;
  alignas(64) float v[32];
  alignas(64) int8_t c[32];
  for (int64_t j = 0; j < k / 32; ++j) {
    F mx = S::zero();
    for (int i = 0; i < 32; i += W) {
      const F f = S::load(x + 32 * j + i);
      S::store(v + i, f);
      mx = S::max(mx, S::abs(f));
    }
    const float amax = S::reduce_max(mx);
    const float d = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
    int s_lo = 0, s_hi = 0;
    for (int i = 0; i < 32; ++i) c[i] = static_cast<int8_t>(static_cast<int>(std::nearbyint(v[i] * id)));
    for (int i = 0; i < 16; ++i) s_lo += c[i];
    for (int i = 16; i < 32; ++i) s_hi += c[i];
    int64_t slot = j;  // where block j's codes and lane go (natural and kpairs256 orders)
    if (L.order == ActOrder::kpairs256) {
      constexpr int kPerm[8] = {0, 2, 1, 3, 4, 6, 5, 7};
      slot = j / 8 * 8 + kPerm[j % 8];
    }
    switch (L.order) {
      case ActOrder::nib16x4: {
        int8_t* base = q + j / 4 * 128 + (j % 4) * 16;
        std::memcpy(base, c, 16);
        std::memcpy(base + 64, c + 16, 16);
        break;
      }
      case ActOrder::even_odd128:
      case ActOrder::even_odd64:
      case ActOrder::even_odd32: {
        const int64_t span = L.order == ActOrder::even_odd128 ? 128 : L.order == ActOrder::even_odd64 ? 64 : 32;
        const int64_t k0 = 32 * j, base = k0 / span * span, off = k0 - base;
        for (int i = 0; i < 32; ++i) q[base + ((off + i) & 1) * (span / 2) + (off + i) / 2] = c[i];
        break;
      }
      default: std::memcpy(q + 32 * slot, c, 32);
    }
    if (L.lane_elems == 32) {
      da[slot] = d;
      ds[slot] = d * static_cast<float>(s_lo + s_hi);
    } else {
      da[2 * j] = da[2 * j + 1] = d;
      ds[2 * j] = d * static_cast<float>(s_lo);
      ds[2 * j + 1] = d * static_cast<float>(s_hi);
    }
  }
}

// Quantizes the m rows of a (row stride lda) into the calling thread's scratch (slot 0,
// which the calling thread keeps for the call: the workers only read it).
template <class T>
inline QAct quantize_act(const T* a, int64_t lda, int64_t m, int64_t k, const ActLayout& L) {
  const int64_t kp = act_padded(k, L), lanes = kp / L.lane_elems;
  float* buf = scratch(static_cast<size_t>(m * act_row_floats(k, L) + 16), 0);
  float* da = buf;
  float* ds = buf + m * lanes;
  int8_t* q = reinterpret_cast<int8_t*>(buf + 2 * m * lanes);
  for (int64_t r = 0; r < m; ++r) quantize_act_row(a + r * lda, k, L, q + r * kp, da + r * lanes, ds + r * lanes);
  return QAct{q, da, ds, kp, lanes};
}
