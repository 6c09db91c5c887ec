// One lane: the portable baseline (any x86-64 or arm64); the compiler may still vectorise.
#pragma once
// Included inside a per-ISA namespace: the translation unit includes the system headers.

struct Simd {
  using F = float;
  static constexpr int W = 1;
  static constexpr int kGemmMR = 4;
  static constexpr int kRegisters = 16;  // x86-64's xmm registers
  static constexpr const char* kName = "baseline";

  static F zero() { return 0.f; }
  static F set1(float a) { return a; }
  template <class T>
  static F load(const T* p) {
    return tnc::to_float(*p);
  }
  template <class T>
  static F load_n(const T* p, int n, float fill = 0.f) {
    return n > 0 ? tnc::to_float(*p) : fill;
  }
  template <class T>
  static void store(T* p, F v) {
    *p = tnc::from_float<T>(v);
  }
  template <class T>
  static void store_n(T* p, F v, int n) {
    if (n > 0) *p = tnc::from_float<T>(v);
  }

  static constexpr bool kHasStream = false;
  static constexpr int kRowAheadBytes = 0;  // see simd_avx2.h
  template <class T>
  static void stream(T* p, F v) {
    store(p, v);
  }
  static void stream_fence() {}

  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F div(F a, F b) { return a / b; }
  static F fma(F a, F b, F c) { return std::fma(a, b, c); }
  static F fnma(F a, F b, F c) { return std::fma(-a, b, c); }
  static F max(F a, F b) { return a > b ? a : b; }
  static F min(F a, F b) { return a < b ? a : b; }
  static F max_nan(F a, F v) { return (a != a || v != v) ? a + v : (a > v ? a : v); }
  static F abs(F a) { return std::fabs(a); }
  static F copysign(F magnitude, F sign) { return std::copysign(magnitude, sign); }
  static float reduce_add(F a) { return a; }
  static float reduce_max(F a) { return a; }
  static F transpose_add(const F* v) { return v[0]; }
  static F round(F a) { return std::nearbyint(a); }
  static F rcp(F a) { return 1.f / a; }
  static F rcp_estimate(F a) { return 1.f / a; }
  static constexpr bool kHasScalef = false;
  static F scalef(F p, F) { return p; }
  static F pow2n(F n) { return tnc::bits_float(static_cast<uint32_t>(static_cast<int>(n) + 127) << 23); }
  static F keep_at_least(F x, float threshold, F v) { return x >= threshold ? v : 0.f; }
  // Lane pairs (2j, 2j+1), as the wider ISAs define them. One lane holds no pair: these are
  // the one-lane degenerate cases, and kernels that rotate pairs take a scalar pair loop
  // when W == 1.
  static F swap_pairs(F a) { return a; }
  static F dup_pairs_lo(F a) { return a; }
  static F dup_pairs_hi(F a) { return a; }
  static F fmaddsub(F a, F b, F c) { return std::fma(a, b, -c); }
};
