// The kernels compiled with no ISA flags: any x86-64 or arm64. This file comes first in
// CMakeLists.txt, so where several ISA files emit the same inline function, the copy the
// linker keeps runs on any CPU of the arch.
#include "kernels/prelude.h"

namespace tnc::isa_baseline {
#include "simd_scalar.h"
#include "kernels/families.h"
}  // namespace tnc::isa_baseline

void tnc::register_kernels_baseline(KernelTable& table) { isa_baseline::register_families(table); }
