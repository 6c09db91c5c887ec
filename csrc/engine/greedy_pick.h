// The greedy pick of a decode step: the first largest of a row of logits, as torch.argmax
// picks it (NaN counts as largest; -0 and +0 are equal, so the first of them wins).
//
// The floats are compared by their bits as integers that keep their order (the magnitude,
// negated where the sign bit is set), a block at a time so that the compiler vectorises the
// block maxima (16-bit integers for bfloat16 and float16); then the first block holding the
// maximum is searched for its first index. Plain C++: GoogleTest drives it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace tileops::engine {

// `U` is the floats' bit type (uint16_t: bfloat16 or float16; uint32_t: float32), `inf` the
// bits of +infinity in that format.
template <class U>
int64_t first_largest_bits(const U* x, int64_t n, U inf) {
  static_assert(std::is_same_v<U, uint16_t> || std::is_same_v<U, uint32_t>);
  using Key = std::conditional_t<sizeof(U) == 2, int16_t, int32_t>;
  constexpr U kMagnitude = std::numeric_limits<U>::max() >> 1;  // all but the sign bit
  constexpr int kSign = 8 * sizeof(U) - 1;
  auto key = [](U bits) {
    const Key magnitude = static_cast<Key>(bits & kMagnitude);
    return static_cast<Key>(bits >> kSign ? -magnitude : magnitude);
  };
  constexpr int64_t kBlock = 256;
  Key top = std::numeric_limits<Key>::min();
  int64_t top_block = 0;  // the first block holding the maximum: where it last grew
  bool nan = false;
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t hi = std::min(n, b0 + kBlock);
    Key m = std::numeric_limits<Key>::min();
    U bad = 0;
    for (int64_t i = b0; i < hi; ++i) {
      m = std::max(m, key(x[i]));
      bad |= static_cast<U>((x[i] & kMagnitude) > inf);
    }
    if (b0 == 0 || m > top) top = m, top_block = b0;
    nan = nan || bad != 0;
  }
  if (nan) {
    for (int64_t i = 0; i < n; ++i) {
      if ((x[i] & kMagnitude) > inf) return i;
    }
  }
  int64_t i = top_block;
  while (key(x[i]) != top) ++i;
  return i;
}

enum class LogitType { kFloat32, kBfloat16, kFloat16 };

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline float bfloat16_to_float(uint16_t bits) { return bits_to_float(uint32_t{bits} << 16); }

inline float float16_to_float(uint16_t bits) {
  const uint32_t sign = uint32_t{bits & 0x8000u} << 16, exponent = (bits >> 10) & 0x1Fu, mantissa = bits & 0x3FFu;
  if (exponent == 0x1F) return bits_to_float(sign | 0x7F800000u | (mantissa << 13));  // inf, NaN
  if (exponent != 0) return bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;  // subnormal (or zero): exact
  return sign ? -magnitude : magnitude;
}

// The first largest of the `n` logits at `row` (of type `type`).
inline int64_t first_largest(const void* row, int64_t n, LogitType type) {
  switch (type) {
    case LogitType::kFloat32: return first_largest_bits(static_cast<const uint32_t*>(row), n, uint32_t{0x7F800000});
    case LogitType::kBfloat16: return first_largest_bits(static_cast<const uint16_t*>(row), n, uint16_t{0x7F80});
    case LogitType::kFloat16: return first_largest_bits(static_cast<const uint16_t*>(row), n, uint16_t{0x7C00});
  }
  return 0;
}

}  // namespace tileops::engine
