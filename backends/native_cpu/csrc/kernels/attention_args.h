// What the attention family's marshalling (bind/attention.cc) hands its kernels
// (kernels/attention*.h).
#pragma once

#include <cstdint>

namespace tnc {

struct AttentionArgs {
  const void* q;  // [B, Sq, H, D]
  const void* k;  // [B, Skv, Hkv, D]
  const void* v;
  void* o;        // [B, Sq, H, D]
  int64_t batch, seq_q, seq_kv, heads, heads_kv, head_dim;
  bool causal;
  float scale;
};

}  // namespace tnc
