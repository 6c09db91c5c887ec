// What the moe family's marshalling (bind/moe.cc) hands its kernels (kernels/moe*.h).
#pragma once

#include <cstdint>

#include "kernel_table.h"
#include "kernels/gemm_args.h"

namespace tnc {

// How a router scores the experts; bound to Python as _C.MoeScoring.
enum class MoeScoring : int { softmax = 0, sigmoid = 1 };
// act(gate) * up of an expert; bound to Python as _C.MoeActivation. The variant of the
// "fused_moe" kernels.
enum class MoeActivation : int { silu_and_mul = 0, gelu_and_mul = 1 };

// The router: per token, the top_k experts of logits [tokens, experts] (of the kernel's
// dtype) by selection value, their weights (float32) and ids (int32), [tokens, top_k] each.
struct TopKArgs {
  const void* logits;
  const float* bias;  // [experts], added for selection only; null: none
  float* weights;
  int32_t* ids;
  int64_t tokens, experts, top_k;
  MoeScoring scoring;
  bool renormalize;
};

// The MoE block: x [tokens, hidden] (the kernel's dtype), float32 logits [tokens, experts],
// w_gate_up [experts, 2 ffn, hidden], w_down [experts, hidden, ffn]; out [tokens, hidden]
// = scale * sum over the top_k experts of weight * down(act(gate) * up).
struct MoeArgs {
  const void* x;
  const float* logits;
  const void* w_gate_up;
  const void* w_down;
  const float* bias;  // as TopKArgs::bias
  void* out;
  int64_t tokens, experts, top_k, hidden, ffn;
  MoeScoring scoring;
  bool renormalize;
  float scale;
  KernelFn<GemmArgs> gemm;  // this table's GEMM of the kernel's dtype: prefill's expert products
};

}  // namespace tnc
