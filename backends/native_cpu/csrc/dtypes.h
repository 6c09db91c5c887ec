// Element types the kernels store, and exact scalar conversions to and from float.
// The vector paths convert in registers; these are for tails, tables and the
// baseline build, so they must round exactly like torch (round to nearest even).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tnc {

// Bound to Python as tileops_native_cpu._C.DType, its members named as in kDTypeNames.
enum class DType : int { f32 = 0, f16 = 1, bf16 = 2, b8 = 3, u8 = 4, i8 = 5, i16 = 6, i32 = 7, i64 = 8 };

inline constexpr int kNumDTypes = 9;
// torch's names: builders.py finds each torch dtype by the name of its DType member.
inline constexpr const char* kDTypeNames[kNumDTypes] = {"float32", "float16", "bfloat16", "bool", "uint8",
                                                        "int8",    "int16",   "int32",    "int64"};
inline const char* dtype_name(DType d) { return kDTypeNames[static_cast<int>(d)]; }
inline constexpr int64_t kDTypeBytes[kNumDTypes] = {4, 2, 2, 1, 1, 1, 2, 4, 8};
inline int64_t dtype_size(DType d) { return kDTypeBytes[static_cast<int>(d)]; }

// Tensor views and the kernels' args hold up to this many axes.
inline constexpr int kMaxDims = 16;

struct half_t {
  uint16_t bits;
};
struct bf16_t {
  uint16_t bits;
};

// Internal linkage on purpose: every ISA translation unit gets its own copy, so the linker
// can never hand the baseline build a copy compiled with AVX-512 flags.
namespace {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float to_float(float v) { return v; }
inline float to_float(bf16_t v) { return bits_float(static_cast<uint32_t>(v.bits) << 16); }
inline float to_float(half_t v) {
  const uint32_t h = v.bits;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // 2^-24
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

template <class T>
T from_float(float f);

template <>
inline float from_float<float>(float f) {
  return f;
}
template <>
inline bf16_t from_float<bf16_t>(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}
template <>
inline half_t from_float<half_t>(float f) {
  uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return half_t{static_cast<uint16_t>(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u))};
  if (x >= 0x477ff000u) return half_t{static_cast<uint16_t>(sign | 0x7c00u)};
  if (x < 0x38800000u) {  // below the smallest normal half: a multiple of 2^-24
    const float scaled = bits_float(x) * 16777216.0f;
    return half_t{static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)))};
  }
  x -= 112u << 23;
  x += 0xfffu + ((x >> 13) & 1u);
  return half_t{static_cast<uint16_t>(sign | (x >> 13))};
}

}  // namespace
}  // namespace tnc
