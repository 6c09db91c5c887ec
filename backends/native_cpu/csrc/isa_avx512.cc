// The kernels compiled for one ISA (flags set per file in CMakeLists.txt).
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "dtypes.h"
#include "kernel_table.h"
#include "thread_pool.h"

#define TNC_AVX512_BF16_GEMM 1
namespace tnc::isa_avx512 {
#include "simd_avx512.h"
#include "kernels_impl.h"
}  // namespace tnc::isa_avx512

namespace tnc {
const Table& table_avx512() {
  static const Table table = isa_avx512::make_table();
  return table;
}
}  // namespace tnc
