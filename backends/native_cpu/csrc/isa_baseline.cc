// The kernels compiled for one ISA (flags set per file in CMakeLists.txt).
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

namespace tnc::isa_baseline {
#include "simd_scalar.h"
#include "kernels_impl.h"
}  // namespace tnc::isa_baseline

namespace tnc {
const Table& table_baseline() {
  static const Table table = isa_baseline::make_table();
  return table;
}
}  // namespace tnc
