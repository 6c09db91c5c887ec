// The moe family's code for AVX-512 BF16 (vdpbf16ps): the decode path's dot products
// straight on the bfloat16 activations and weight rows. Included by isa_avx512.cc inside
// its namespace after kernels/gemm_avx512_bf16_nt.h (whose dot_bf16_nt_rows it uses);
// register_moe_avx512_bf16 replaces the bfloat16 MoE kernels. (Their prefill GEMMs already
// come from the table: the AVX-512 BF16 GEMM.)
#pragma once
// (no includes here on purpose: see kernels/common.h)

#if !defined(__AVX512BF16__)
#error "kernels/moe_avx512_bf16.h needs -mavx512bf16 (isa_avx512.cc only)"
#endif

// moe_decode's Rows for bfloat16: activations kept as bfloat16 bits, zero-padded to
// whole vectors of 32, and vdpbf16ps straight on them and the weight rows: the GEMV's row
// dots (dot_bf16_nt_rows), each row read once as one prefetched forward stream for every token.
// (skinny_nt_bf16_block over two rows at once, an accumulator per token and row, was
// slower at 2 to 4 tokens: two interleaved row streams.)
struct Avx512Bf16DecodeRows {
  using A = uint16_t;
  static int64_t padded(int64_t k) { return (k + 31) / 32 * 32; }
  static A from_storage(bf16_t v) { return v.bits; }
  static A rounded(float v) { return tnc::from_float<bf16_t>(v).bits; }
  static void arrange(A*, int64_t, int64_t) {}  // in order as they are
  template <int MR>
  static void dot2(const A* ap, int64_t kp, const bf16_t* row, int64_t ldb, int64_t k, int nb, float out[MR][2]) {
    const uint16_t* b = reinterpret_cast<const uint16_t*>(row);
    for (int j = 0; j < nb; ++j) {
      float d[MR];
      dot_bf16_nt_rows<MR>(ap, kp, b + j * ldb, k, d);
      for (int r = 0; r < MR; ++r) out[r][j] = d[r];
    }
  }
};

inline void register_moe_avx512_bf16(tnc::KernelTable& t) {
  t.replace<tnc::MoeArgs>("fused_moe", tnc::DType::bf16, fused_moe<bf16_t, Silu, Avx512Bf16DecodeRows>,
                          static_cast<int>(tnc::MoeActivation::silu_and_mul));
  t.replace<tnc::MoeArgs>("fused_moe", tnc::DType::bf16, fused_moe<bf16_t, Gelu, Avx512Bf16DecodeRows>,
                          static_cast<int>(tnc::MoeActivation::gelu_and_mul));
}
