// The boundary between the Python-facing module and the per-ISA kernel builds. Each ISA
// translation unit compiles the same templates with its own flags and fills one Table;
// module.cc picks a table once at load time from the CPU's features.
#pragma once

#include <cstdint>

namespace tnc {

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

struct SoftmaxArgs {
  const void* x;
  void* out;
  int64_t outer;
  int64_t n;      // the softmax axis
  int64_t inner;  // product of the axes after it
  bool log;
};

enum class UnaryOp : int { silu = 0, gelu = 1, gelu_tanh = 2, relu = 3 };

struct UnaryArgs {
  const void* x;
  void* out;
  int64_t numel;
  UnaryOp op;
};

struct GatedArgs {
  const void* x;
  void* out;
  int64_t rows;
  int64_t n;  // output columns; x has 2n
};

enum class ReduceOp : int { sum = 0, mean = 1, amax = 2 };

// Up to kMaxDims merged axes, alternating kept and reduced; the innermost one is contiguous.
inline constexpr int kMaxDims = 16;
struct ReduceArgs {
  const void* x;
  void* out;
  int ndim;
  int64_t sizes[kMaxDims];
  bool reduced[kMaxDims];
  ReduceOp op;
  float scale;  // 1/N for mean
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

struct RopeArgs {
  const void* x;
  void* out;
  const float* cos;  // [positions, rotary_dim / 2], values already rounded through x's dtype
  const float* sin;
  const void* positions;  // null: position = token % seq
  bool positions_are_i64;
  int64_t tokens;
  int64_t seq;
  int64_t heads;
  int64_t head_dim;
  int64_t rotary_dim;
};

struct GemmArgs {
  const void* a;
  const void* b;
  void* d;
  int64_t batch, m, n, k;
  int64_t a_batch, a_row, a_col;  // element (i, kk) of a at a_row*i + a_col*kk
  int64_t b_batch, b_row, b_col;  // element (kk, j) of b at b_row*kk + b_col*j
  int64_t d_batch;                // d rows are contiguous with n columns
};

struct AttentionArgs {
  const void* q;  // [B, Sq, H, D]
  const void* k;  // [B, Skv, Hkv, D]
  const void* v;
  void* o;        // [B, Sq, H, D]
  int64_t batch, seq_q, seq_kv, heads, heads_kv, head_dim;
  bool causal;
  float scale;
};

struct Table {
  const char* name;
  void (*rms_norm[3])(const NormArgs&, int threads);
  void (*fused_add_rms_norm[3])(const NormArgs&, int threads);
  void (*layer_norm[3])(const NormArgs&, int threads);
  void (*group_norm[3])(const GroupNormArgs&, int threads);
  void (*softmax[3])(const SoftmaxArgs&, int threads);
  void (*unary[3])(const UnaryArgs&, int threads);
  void (*silu_and_mul[3])(const GatedArgs&, int threads);
  void (*reduce[3])(const ReduceArgs&, int threads);
  void (*binary[9])(const BroadcastArgs&, int threads);  // indexed by DType
  void (*clamp[3])(const BroadcastArgs&, int threads);
  void (*rope[3])(const RopeArgs&, int threads);
  void (*gemm[3])(const GemmArgs&, int threads);
  void (*attention[3])(const AttentionArgs&, int threads);
  void (*attention_decode[3])(const AttentionArgs&, int threads);
};

const Table& table_avx512();
const Table& table_avx2();
const Table& table_baseline();

}  // namespace tnc
