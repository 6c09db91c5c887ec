// What the rope family's marshalling (bind/rope.cc) hands its kernels (kernels/rope.h).
#pragma once

#include <cstdint>

namespace tnc {

// How a RoPE kernel object reads x: [S, D] (RopeNeox '1d'), [B, S, H, D] (RopeNeox '2d'),
// or [T, H, D] with one position id per token (RopeNeoxPositionIds).
enum class RopeLayout : int { sd = 0, bshd = 1, thd_position_ids = 2 };

// Which channels rotate together: c and c + rotary_dim/2 (NeoX half split), or 2k and
// 2k+1 (adjacent pairs: RoFormer, GPT-J, RopeNonNeox).
enum class RopeRotation : int { neox = 0, pairs = 1 };

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

}  // namespace tnc
