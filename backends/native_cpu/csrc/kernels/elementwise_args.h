// What the elementwise family's marshalling (bind/elementwise.cc) hands its kernels
// (kernels/elementwise.h).
#pragma once

#include <cstdint>

#include "dtypes.h"

namespace tnc {

// An activation, by its index in kernels/elementwise.h's list of them: the members (and
// their Python names, _C.Activation) come from that list, so a new activation is added
// there alone. The unary and gated kernels are registered once per activation (variant).
enum class Activation : int {};

struct UnaryArgs {
  const void* x;
  void* out;
  int64_t numel;
};

// act(x[r, :n]) * x[r, n:]
struct GatedArgs {
  const void* x;
  void* out;
  int64_t rows;
  int64_t n;  // output columns; x has 2n
};

enum class BinaryOp : int { add = 0, mul = 1 };

// Elementwise with broadcasting over up to three operands: after merging, every operand
// has a stride per output axis (0 where broadcast), in elements.
struct BroadcastArgs {
  const void* in[3];  // null: operand absent (clamp without min or max)
  void* out;
  int ndim;
  int64_t sizes[kMaxDims];
  int64_t strides[3][kMaxDims];
  double alpha;  // add: out = a + alpha * b
  BinaryOp op;
};

}  // namespace tnc
