// What the attention family's marshalling (bind/attention.cc) hands its kernels
// (kernels/attention*.h).
#pragma once

#include <cstdint>

namespace tnc {

// Every attention op is a batch of requests. Request b has q_len[b] queries, rows
// q_begin[b] .. of q (rows of [H, D]), and kv_len[b] keys, logical positions 0 .. kv_len-1,
// found at row kv_begin[b] + t of k and v (rows of [Hkv, D]) or, in a paged cache, at row
// block_table[b * table_stride + t / page_size] * page_size + t % page_size.
// Query i sits on the key diagonal i + kv_len - q_len (bottom-right): causal keeps keys at or
// before it, window_left / window_right bound it on either side (-1: no bound; the right
// bound applies only without causal). A query that sees no key gets zeros.
struct AttentionArgs {
  const void* q;
  const void* k;
  const void* v;
  void* o;  // like q
  int64_t batch, heads, heads_kv, head_dim;
  const int64_t* q_begin;
  const int64_t* q_len;
  const int64_t* kv_len;
  const int64_t* kv_begin;     // contiguous keys, or null
  const int32_t* block_table;  // paged keys, or null
  int64_t table_stride, page_size;
  int64_t max_q_len;
  bool causal;
  int64_t window_left, window_right;
  float scale;
  float softcap;  // 0: off
};

}  // namespace tnc
