// What the hot path adds to the DLPack ABI (declared in dlpack_abi.h): one int naming a
// dtype in memo keys.
#pragma once

#include <cstdint>

#include "bindings/dlpack_abi.h"

namespace tileops::dlpack {

// One int that names a dtype in memo keys: (code, bits, lanes) packed.
inline int64_t dtype_word(DataType t) { return (int64_t{t.code} << 24) | (int64_t{t.bits} << 16) | int64_t{t.lanes}; }

}  // namespace tileops::dlpack
