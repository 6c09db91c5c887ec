// What every kernel family builds on, written once over `Simd` (the lane type of one ISA)
// and the storage type T (float, half_t, bf16_t): partial loads and stores, row
// primitives, per-thread scratch, exp and reciprocals, and registering a family's kernels.
// Included inside a per-ISA namespace by kernels/families.h, after the ISA's simd_*.h.
// All arithmetic is in float32.
#pragma once
// (no includes here on purpose: see the note above)

using S = Simd;
using F = S::F;
constexpr int W = S::W;
using tnc::bf16_t;
using tnc::half_t;

// ---------------------------------------------------------------------------------------
// small helpers

template <class T>
inline F loadc(const T* p, int64_t count, float fill = 0.f) {
  return count >= W ? S::load(p) : S::load_n(p, static_cast<int>(count), fill);
}
template <class T>
inline void storec(T* p, F v, int64_t count) {
  if (count >= W) {
    S::store(p, v);
  } else {
    S::store_n(p, v, static_cast<int>(count));
  }
}

// 2W elements as two vectors. Where the ISA has a faster form (AVX-512 bfloat16: even
// elements in a, odd ones in b) the lanes are permuted, the same way for every pair of the
// same type, and store_pair undoes it; elsewhere a holds p[0, W) and b p[W, 2W). So a loop
// over pairs in which every operand comes from load_pair at the same index and the result
// goes out through store_pair, or one that reduces its lanes, never sees the order.
// (SS: S, as a template parameter so that an ISA without the members still compiles.)
template <class T, class SS = S>
constexpr bool kPairsPermute = requires(const T* p, F& a) { SS::load_pair(p, a, a); };
template <class T, class SS = S>
inline void load_pair(const T* p, F& a, F& b) {
  if constexpr (kPairsPermute<T>) {
    SS::load_pair(p, a, b);
  } else {
    a = S::load(p);
    b = S::load(p + W);
  }
}
template <class T, class SS = S>
inline void store_pair(T* p, F a, F b) {
  if constexpr (kPairsPermute<T>) {
    SS::store_pair(p, a, b);
  } else {
    S::store(p, a);
    S::store(p + W, b);
  }
}

// Results far larger than the caches go out with streaming stores: no read for ownership
// of lines that are overwritten whole (a third of the traffic of an ordinary store), and
// the next op would not find them in cache anyway. kStreamBytes: a quarter of the L3; every
// kernel that streams decides by it. Every full-vector store of such a result must be
// aligned, so streams() also asks that the result be aligned and its rows (of n elements)
// whole stores: pairs of vectors (store_pair_full, 64-byte aligned) by default, single
// vectors (store_full, aligned for S::stream) with Vectors = 1 (unary and gated kernels
// peel each range to alignment instead). A chunk that streamed ends with S::stream_fence().
inline constexpr int64_t kStreamBytes = int64_t{8} << 20;
template <class T>
inline bool large_enough_to_stream(int64_t elements) {
  return S::kHasStream && elements * static_cast<int64_t>(sizeof(T)) >= kStreamBytes;
}
template <class T, int Vectors = 2>
inline bool streams(const void* y, int64_t elements, int64_t n) {
  constexpr uintptr_t kAlign = Vectors == 1 ? W * sizeof(T) : 64;  // S::stream's, or stream_pair's
  return large_enough_to_stream<T>(elements) && n % (Vectors * W) == 0 && reinterpret_cast<uintptr_t>(y) % kAlign == 0;
}
template <bool Stream, class T>
inline void store_full(T* p, F v) {
  if constexpr (Stream) {
    S::stream(p, v);
  } else {
    S::store(p, v);
  }
}
// store_pair, or its streaming form (p 64-byte aligned, as streams() ensures for rows)
template <bool Stream, class T, class SS = S>
inline void store_pair_full(T* p, F a, F b) {
  if constexpr (!Stream) {
    store_pair(p, a, b);
  } else if constexpr (kPairsPermute<T>) {
    SS::stream_pair(p, a, b);
  } else {
    S::stream(p, a);
    S::stream(p + W, b);
  }
}
// Elements from p to the next 64-byte boundary, where store_pair_full's streams may start
// (kernels that stream arbitrary ranges peel these off first).
template <class T>
inline int64_t to_stream_alignment(const T* p) {
  return static_cast<int64_t>(((64 - reinterpret_cast<uintptr_t>(p) % 64) % 64) / sizeof(T));
}
// fn(std::true_type{}) when stream, else fn(std::false_type{}): the kernels' loops are
// compiled once for each kind of store.
template <class Fn>
inline void with_stream(bool stream, Fn&& fn) {
  if (stream) {
    fn(std::true_type{});
  } else {
    fn(std::false_type{});
  }
}

// A kernel that makes several passes over a row (a reduction, then the result) waits on
// memory in its first pass and leaves memory idle in the later ones, which run from L1.
// Prefetching the next row during a later pass overlaps the two: call
// prefetch_next<Elements>(next, i) at each step of that pass over elements [i, i + Elements)
// (one prefetch per cache line; i a multiple of Elements). next: the next row of the same
// chunk, nullptr after the chunk's last row.
template <int Elements, class T>
inline void prefetch_next(const T* next, int64_t i) {
  constexpr int64_t kLine = 64 / sizeof(T);
  if (next == nullptr) return;
  if constexpr (Elements >= kLine) {
    for (int64_t j = 0; j < Elements; j += kLine) __builtin_prefetch(next + i + j, 0, 3);
  } else if (i % kLine == 0) {
    __builtin_prefetch(next + i, 0, 3);
  }
}
// The row after r within [r0, r1) of rows of n elements at base, or nullptr.
template <class T>
inline const T* next_row(const void* base, int64_t r, int64_t r1, int64_t n) {
  return r + 1 < r1 ? static_cast<const T*>(base) + (r + 1) * n : nullptr;
}

// Rows per task so that one task touches at least ~16K elements.
inline int64_t row_grain(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)); }

// One vector that folds the row x[0, n): acc = step(acc, v) over four accumulators
// (starting at init; padding lanes of the tail hold fill), then combine(...) of the four.
template <class T, class Step, class Combine>
inline F fold_run(const T* x, int64_t n, F init, float fill, Step step, Combine combine) {
  F a0 = init, a1 = init, a2 = init, a3 = init;
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    F v0, v1, v2, v3;
    load_pair(x + i, v0, v1);
    load_pair(x + i + 2 * W, v2, v3);
    a0 = step(a0, v0);
    a1 = step(a1, v1);
    a2 = step(a2, v2);
    a3 = step(a3, v3);
  }
  for (; i < n; i += W) a0 = step(a0, loadc(x + i, n - i, fill));
  return combine(combine(a0, a1), combine(a2, a3));
}

// the folds as lambdas, so that fold_run inlines them
inline constexpr auto kAdd = [](F a, F b) { return S::add(a, b); };
inline constexpr auto kMaxNan = [](F a, F b) { return S::max_nan(a, b); };

template <class T>
inline float sum_squares(const T* x, int64_t n) {
  return S::reduce_add(fold_run(x, n, S::zero(), 0.f, [](F acc, F v) { return S::fma(v, v, acc); }, kAdd));
}

template <class T>
inline float sum_run(const T* x, int64_t n) {
  return S::reduce_add(fold_run(x, n, S::zero(), 0.f, kAdd, kAdd));
}

// NaN-propagating scalar max (torch.amax and softmax: any NaN makes the result NaN)
inline float max_nan(float a, float b) { return (a != a || b != b) ? a + b : std::max(a, b); }

template <class T>
inline float max_run(const T* x, int64_t n) {
  const float lowest = -std::numeric_limits<float>::infinity();
  const F m = fold_run(x, n, S::set1(lowest), lowest, kMaxNan, kMaxNan);
  alignas(64) float lanes[W];
  S::store(lanes, m);
  float r = lowest;
  for (int l = 0; l < W; ++l) r = max_nan(r, lanes[l]);
  return r;
}

// float16/bfloat16 results tolerate the fast exp
template <class T>
constexpr bool kHalfT = !std::is_same_v<T, float>;

// A thread's scratch floats; grows, never shrinks, never shared.
inline float* scratch(size_t count, int slot = 0) {
  thread_local std::vector<float> buffers[6];  // slots 4-5: the quant family's prefill
  std::vector<float>& b = buffers[slot];
  if (b.size() < count) b.resize(count + 64);
  return b.data();
}

// ---------------------------------------------------------------------------------------
// math: exp with a degree-7 polynomial after Cody-Waite reduction (about 1 ulp in range).
// With AVX-512 the 2^n step is vscalefps, which also gives subnormals and 0 below the
// range; the clamps take x first-operand-last so that a NaN input stays NaN there.

// Fast: for float16/bfloat16 results: 2^t with t = x log2 e, as 2^round(t) times a
// degree-3 polynomial in t - round(t) (exp2_fraction): relative error below 8e-5, a
// twelfth of a float16 ulp, in 9 vector ops of which 4 multiply (the accurate path: 14
// and 10). Against the previous Fast form (one-step reduction in base e, degree 4: 10 and
// 6) it was only slightly faster in the L1: the multiplies were not what bound it.

// 2^f for f in [-1/2, 1/2]: a degree-3 polynomial fitted for relative error (7.5e-5 at
// most, evaluated in float)
inline F exp2_fraction(F f) {
  F p = S::fma(S::set1(0.0551716648f), f, S::set1(0.242611125f));
  p = S::fma(p, f, S::set1(0.693260968f));
  return S::fma(p, f, S::set1(0.999928057f));
}

// 2^t for the Fast forms: 2^round(t) times exp2_fraction of the rest. The caller clamps t:
// without vscalefps, 2^n is built in the exponent field, so n must give a normal float.
inline F exp2_fast(F t) {
  const F n = S::round(t);
  const F p = exp2_fraction(S::sub(t, n));
  if constexpr (S::kHasScalef) {
    return S::scalef(p, n);
  } else {
    return S::mul(p, S::pow2n(n));
  }
}

template <bool Fast = false>
inline F vexp(F x) {
  F xc;
  if constexpr (S::kHasScalef) {
    xc = S::min(S::set1(88.3f), S::max(S::set1(-104.f), x));
  } else {
    xc = S::min(S::max(x, S::set1(-87.3f)), S::set1(88.3f));
  }
  if constexpr (Fast) {
    const F e = exp2_fast(S::mul(xc, S::set1(1.44269504088896341f)));
    if constexpr (S::kHasScalef) {
      return e;
    } else {
      return S::keep_at_least(x, -87.3f, e);
    }
  }
  const F n = S::round(S::mul(xc, S::set1(1.44269504088896341f)));
  F r = S::fnma(n, S::set1(0.693145751953125f), xc);
  r = S::fnma(n, S::set1(1.42860682030941723212e-6f), r);
  F p = S::set1(1.f / 5040.f);
  p = S::fma(p, r, S::set1(1.f / 720.f));
  p = S::fma(p, r, S::set1(1.f / 120.f));
  p = S::fma(p, r, S::set1(1.f / 24.f));
  p = S::fma(p, r, S::set1(1.f / 6.f));
  p = S::fma(p, r, S::set1(0.5f));
  p = S::fma(p, r, S::set1(1.f));
  p = S::fma(p, r, S::set1(1.f));
  if constexpr (S::kHasScalef) {
    return S::scalef(p, n);
  } else {
    return S::keep_at_least(x, -87.3f, S::mul(p, S::pow2n(n)));
  }
}

// e^-x without the negation: the Fast form is vexp<Fast>'s with t = -x log2 e; the
// accurate one, with u = x + n ln2 (n = round(-x log2 e)), is e^-x = 2^n e^-u, where e^-u is
// vexp's polynomial with alternating signs.
template <bool Fast = false>
inline F vexp_neg(F x) {
  if constexpr (!S::kHasScalef) {
    return vexp<Fast>(S::sub(S::zero(), x));
  } else {
    // Below -88.3 the result overflows to +inf through vscalefps; the Fast polynomial is
    // positive on its whole interval, so no clamp is needed on that side. Above 104 it
    // must be clamped, or a huge reduced argument would turn 0 into inf.
    const F xc = Fast ? S::min(S::set1(104.f), x) : S::min(S::set1(104.f), S::max(S::set1(-88.3f), x));
    if constexpr (Fast) return exp2_fast(S::mul(xc, S::set1(-1.44269504088896341f)));
    const F n = S::round(S::mul(xc, S::set1(-1.44269504088896341f)));
    F u = S::fma(n, S::set1(0.693145751953125f), xc);
    u = S::fma(n, S::set1(1.42860682030941723212e-6f), u);
    F p = S::set1(-1.f / 5040.f);
    p = S::fma(p, u, S::set1(1.f / 720.f));
    p = S::fma(p, u, S::set1(-1.f / 120.f));
    p = S::fma(p, u, S::set1(1.f / 24.f));
    p = S::fma(p, u, S::set1(-1.f / 6.f));
    p = S::fma(p, u, S::set1(0.5f));
    p = S::fma(p, u, S::set1(-1.f));
    p = S::fma(p, u, S::set1(1.f));
    return S::scalef(p, n);
  }
}

// 1/a: float results get the Newton-refined reciprocal; float16/bfloat16 results the
// AVX-512 14-bit estimate alone (relative error 6e-5, a sixteenth of a float16 ulp)
template <bool Fast = false>
inline F vrcp(F a) {
  if constexpr (Fast && S::kHasScalef) {
    return S::rcp_estimate(a);
  } else {
    return S::rcp(a);
  }
}

// ---------------------------------------------------------------------------------------
// registering a family's kernels (register_<family> at the end of each family file)

// Calls fn.template operator()<T>(dtype) for each float storage type T.
template <class Fn>
inline void for_each_float_type(Fn fn) {
  fn.template operator()<float>(tnc::DType::f32);
  fn.template operator()<half_t>(tnc::DType::f16);
  fn.template operator()<bf16_t>(tnc::DType::bf16);
}
