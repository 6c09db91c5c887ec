// What the norm family's marshalling (bind/norm.cc) hands its kernels (kernels/norm.h).
#pragma once

#include <cstdint>

namespace tnc {

// The row norms: one kernel object each, bound to Python as _C.RowNorm.
enum class RowNorm : int { rms = 0, fused_add_rms = 1, layer = 2, fused_add_layer = 3 };

struct NormArgs {
  const void* x;
  const void* residual;
  const void* weight;
  const void* bias;
  void* out;
  void* residual_out;
  int64_t rows;
  int64_t n;
  float eps;
};

struct GroupNormArgs {
  const void* x;
  const void* weight;  // null: no affine
  const void* bias;
  void* out;
  int64_t batch;
  int64_t channels;
  int64_t groups;
  int64_t spatial;
  float eps;
};

}  // namespace tnc
