// What the reduction family's marshalling (bind/reduction.cc) hands its kernels
// (kernels/reduction.h).
#pragma once

#include <cstdint>

#include "dtypes.h"

namespace tnc {

enum class ReduceOp : int { sum = 0, mean = 1, amax = 2 };

// Up to kMaxDims merged axes, alternating kept and reduced; the innermost one is contiguous.
struct ReduceArgs {
  const void* x;
  void* out;
  int ndim;
  int64_t sizes[kMaxDims];
  bool reduced[kMaxDims];
  ReduceOp op;
  float scale;  // 1/N for mean
};

}  // namespace tnc
