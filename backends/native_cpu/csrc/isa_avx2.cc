// The kernels compiled for AVX2 + FMA + F16C (flags set for this file in CMakeLists.txt).
#include <immintrin.h>

#include "kernels/prelude.h"

namespace tnc::isa_avx2 {
#include "simd_avx2.h"
#include "kernels/families.h"
#include "kernels/gemm_quant_x86.h"
}  // namespace tnc::isa_avx2

void tnc::register_kernels_avx2(KernelTable& table) {
  isa_avx2::register_families(table);
  isa_avx2::register_quant_x86(table);
}
