// The kernels compiled for AVX-512 F/BW/VL/DQ + BF16 (flags set for this file in
// CMakeLists.txt): every family, then the families' AVX-512 BF16 code
// (kernels/*_avx512_bf16*.h), which replaces their bfloat16 kernels where it has its own.
#include <immintrin.h>

#include "kernels/prelude.h"

namespace tnc::isa_avx512 {
#include "simd_avx512.h"
#include "kernels/families.h"
#include "kernels/gemm_quant_x86.h"
#include "kernels/attention_avx512_bf16.h"
#include "kernels/gemm_avx512_bf16.h"
#include "kernels/gemm_avx512_bf16_nt.h"
#include "kernels/moe_avx512_bf16.h"
}  // namespace tnc::isa_avx512

void tnc::register_kernels_avx512(KernelTable& table) {
  isa_avx512::register_families(table);
  isa_avx512::register_quant_x86(table);
  isa_avx512::register_attention_avx512_bf16(table);
  isa_avx512::register_gemm_avx512_bf16(table);
  isa_avx512::register_moe_avx512_bf16(table);
}
