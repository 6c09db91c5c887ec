// What the quant family's marshalling (bind/quant.cc) hands its kernels
// (kernels/gemm_quant*.h): GEMMs over GGUF rows of GGML blocks (GemmGgufFwdOp) and over
// upstream's 4-bit groups (GemmW4A16FwdOp), and the rows of a GGUF embedding table
// (EmbeddingGgufFwdOp).
#pragma once

#include <cstdint>

#include "kernel_table.h"
#include "kernels/gemm_args.h"

namespace tnc {

// The GGML types served, numbered as GGUF numbers them (GGMLQuantizationType): the variant
// of the "gemm_gguf" and "embedding_gguf" kernels.
enum class GgmlType : int {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q8_0 = 8,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  bf16 = 30
};

// Weights and bytes per block of a type served; {0, 0} for any other number.
struct GgmlBlock {
  int64_t block, bytes;
};
constexpr GgmlBlock ggml_block(GgmlType t) {
  switch (t) {
    case GgmlType::f32: return {1, 4};
    case GgmlType::f16:
    case GgmlType::bf16: return {1, 2};
    case GgmlType::q8_0: return {32, 34};
    case GgmlType::q4_0: return {32, 18};
    case GgmlType::q4_1: return {32, 20};
    case GgmlType::q4_k: return {256, 144};
    case GgmlType::q5_k: return {256, 176};
    case GgmlType::q6_k: return {256, 210};
  }
  return {0, 0};
}

// activation [m, k] (the kernel's dtype) @ W.T -> d [m, n], W as n rows of row_bytes bytes of
// GGML blocks (the kernel's variant).
struct GemmGgufArgs {
  const void* a;
  const uint8_t* w;
  void* d;
  int64_t m, n, k, row_bytes;
  KernelFn<GemmArgs> gemm;  // this table's GEMM of the kernel's dtype (float rows of that dtype)
};

// activation [m, k] @ W.T -> d [m, n], W 4-bit: w [n, k / 2] (K index 2i in the low nibble of
// byte i), scale [n, k / group] (float32, or float16 where scale_f16), zero uint8 [n, k / group].
struct GemmW4A16Args {
  const void* a;
  const uint8_t* w;
  const void* scale;
  const uint8_t* zero;
  bool scale_f16;
  void* d;
  int64_t m, n, k, group;
  KernelFn<GemmArgs> gemm;  // this table's GEMM of the kernel's dtype (the prefill's, where it has one)
};

// Rows ids[0, t) (int64 where ids_64, else int32; each in [0, vocab), checked by the
// marshalling) of a table of rows of row_bytes bytes of blocks, dequantized to out [t, dim].
struct EmbeddingGgufArgs {
  const void* ids;
  bool ids_64;
  const uint8_t* w;
  void* out;
  int64_t t, vocab, row_bytes, dim;
};

}  // namespace tnc
