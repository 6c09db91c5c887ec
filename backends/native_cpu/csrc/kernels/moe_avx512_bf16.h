// The moe family's code for AVX-512 BF16 (vdpbf16ps): the decode path's dot products
// straight on the bfloat16 activations and weight rows. Included by isa_avx512.cc inside
// its namespace after kernels/gemm_avx512_bf16_nt.h (whose dot_bf16_nt_row and
// skinny_nt_bf16_block it uses); register_moe_avx512_bf16 replaces the bfloat16 MoE
// kernels. (Their prefill GEMMs already come from the table: the AVX-512 BF16 GEMM.)
#pragma once
// (no includes here on purpose: see kernels/common.h)

#if !defined(__AVX512BF16__)
#error "kernels/moe_avx512_bf16.h needs -mavx512bf16 (isa_avx512.cc only)"
#endif

// moe_decode's Rows for bfloat16: activations kept as bfloat16 bits, zero-padded to
// whole vectors of 32. One token: the GEMV's row dot (eight accumulators along K, one
// forward stream); more: the skinny NT block of one row, which prefetches the next row.
struct Avx512Bf16DecodeRows {
  using A = uint16_t;
  static int64_t padded(int64_t k) { return (k + 31) / 32 * 32; }
  static A from_storage(bf16_t v) { return v.bits; }
  static A rounded(float v) { return tnc::from_float<bf16_t>(v).bits; }
  template <int MR>
  static void dot(const A* ap, int64_t kp, const bf16_t* row, int64_t k, float out[MR]) {
    const uint16_t* b = reinterpret_cast<const uint16_t*>(row);
    if constexpr (MR == 1) {
      out[0] = dot_bf16_nt_row(ap, b, k);
    } else {
      float o[MR][1];
      skinny_nt_bf16_block<MR, 1>(ap, kp, b, k, k, 1, o);
      for (int r = 0; r < MR; ++r) out[r] = o[r][0];
    }
  }
};

inline void register_moe_avx512_bf16(tnc::KernelTable& t) {
  t.replace<tnc::MoeArgs>("fused_moe", tnc::DType::bf16, fused_moe<bf16_t, Silu, Avx512Bf16DecodeRows>,
                          static_cast<int>(tnc::MoeActivation::silu_and_mul));
  t.replace<tnc::MoeArgs>("fused_moe", tnc::DType::bf16, fused_moe<bf16_t, Gelu, Avx512Bf16DecodeRows>,
                          static_cast<int>(tnc::MoeActivation::gelu_and_mul));
}
