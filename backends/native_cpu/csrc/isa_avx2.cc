// The kernels compiled for one ISA (flags set per file in CMakeLists.txt).
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "dtypes.h"
#include "kernel_table.h"
#include "thread_pool.h"

namespace tnc::isa_avx2 {
#include "simd_avx2.h"
#include "kernels_impl.h"
}  // namespace tnc::isa_avx2

namespace tnc {
const Table& table_avx2() {
  static const Table table = isa_avx2::make_table();
  return table;
}
}  // namespace tnc
