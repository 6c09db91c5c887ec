// Every kernel family, compiled for the ISA whose namespace includes this file (after
// kernels/prelude.h outside it and the ISA's simd_*.h inside it), and one function that
// registers them all. A new family: its file here and its register_<family> call below.
#pragma once
// (no includes of system or project headers here: see kernels/common.h)

#include "kernels/common.h"

#include "kernels/norm.h"
#include "kernels/softmax.h"
#include "kernels/elementwise.h"
#include "kernels/reduction.h"
#include "kernels/rope.h"
#include "kernels/gemm_skinny.h"
#include "kernels/gemm.h"
#include "kernels/attention.h"
#include "kernels/moe.h"
#include "kernels/quant_blocks.h"
#include "kernels/gemm_quant.h"

inline void register_families(tnc::KernelTable& t) {
  register_norm(t);
  register_softmax(t);
  register_elementwise(t);
  register_reduction(t);
  register_rope(t);
  register_gemm(t);
  register_attention(t);
  register_moe(t);
  register_quant(t);
}
