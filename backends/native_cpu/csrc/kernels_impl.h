// Every kernel, written once over `Simd` (the lane type of one ISA) and the storage type
// T (float, half_t, bf16_t). Included inside a per-ISA namespace by isa_*.cc, after the
// system headers and the matching simd_*.h. All arithmetic is in float32.
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

// Rows per task so that one task touches at least ~16K elements.
inline int64_t row_grain(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)); }

template <class T>
inline float sum_squares(const T* x, int64_t n) {
  F a0 = S::zero(), a1 = S::zero(), a2 = S::zero(), a3 = S::zero();
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    const F v0 = S::load(x + i), v1 = S::load(x + i + W), v2 = S::load(x + i + 2 * W), v3 = S::load(x + i + 3 * W);
    a0 = S::fma(v0, v0, a0);
    a1 = S::fma(v1, v1, a1);
    a2 = S::fma(v2, v2, a2);
    a3 = S::fma(v3, v3, a3);
  }
  for (; i < n; i += W) {
    const F v = loadc(x + i, n - i);
    a0 = S::fma(v, v, a0);
  }
  return S::reduce_add(S::add(S::add(a0, a1), S::add(a2, a3)));
}

template <class T>
inline float sum_run(const T* x, int64_t n) {
  F a0 = S::zero(), a1 = S::zero(), a2 = S::zero(), a3 = S::zero();
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    a0 = S::add(a0, S::load(x + i));
    a1 = S::add(a1, S::load(x + i + W));
    a2 = S::add(a2, S::load(x + i + 2 * W));
    a3 = S::add(a3, S::load(x + i + 3 * W));
  }
  for (; i < n; i += W) a0 = S::add(a0, loadc(x + i, n - i));
  return S::reduce_add(S::add(S::add(a0, a1), S::add(a2, a3)));
}

// NaN-propagating scalar max (torch.amax and softmax: any NaN makes the result NaN)
inline float max_nan(float a, float b) { return (a != a || b != b) ? a + b : std::max(a, b); }

template <class T>
inline float max_run(const T* x, int64_t n) {
  const float lowest = -std::numeric_limits<float>::infinity();
  F a0 = S::set1(lowest), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    a0 = S::max_nan(a0, S::load(x + i));
    a1 = S::max_nan(a1, S::load(x + i + W));
    a2 = S::max_nan(a2, S::load(x + i + 2 * W));
    a3 = S::max_nan(a3, S::load(x + i + 3 * W));
  }
  for (; i < n; i += W) a0 = S::max_nan(a0, loadc(x + i, n - i, lowest));
  alignas(64) float lanes[4 * W];
  S::store(lanes, a0);
  S::store(lanes + W, a1);
  S::store(lanes + 2 * W, a2);
  S::store(lanes + 3 * W, a3);
  float m = lowest;
  for (int l = 0; l < 4 * W; ++l) m = max_nan(m, lanes[l]);
  return m;
}

// float16/bfloat16 results tolerate the fast exp
template <class T>
constexpr bool kHalfT = !std::is_same_v<T, float>;

// A thread's scratch floats; grows, never shrinks, never shared.
inline float* scratch(size_t count, int slot = 0) {
  thread_local std::vector<float> buffers[4];
  std::vector<float>& b = buffers[slot];
  if (b.size() < count) b.resize(count + 64);
  return b.data();
}

// ---------------------------------------------------------------------------------------
// math: exp with a degree-7 polynomial after Cody-Waite reduction (about 1 ulp in range).
// With AVX-512 the 2^n step is vscalefps, which also gives subnormals and 0 below the
// range; the clamps take x first-operand-last so that a NaN input stays NaN there.

// Fast: for float16/bfloat16 results: one-step reduction and a degree-4 polynomial
// (relative error below 5e-5, a twentieth of a float16 ulp), four fewer vector ops.
template <bool Fast = false>
inline F vexp(F x) {
  F xc;
  if constexpr (S::kHasScalef) {
    xc = S::min(S::set1(88.3f), S::max(S::set1(-104.f), x));
  } else {
    xc = S::min(S::max(x, S::set1(-87.3f)), S::set1(88.3f));
  }
  const F n = S::round(S::mul(xc, S::set1(1.44269504088896341f)));
  F r, p;
  if constexpr (Fast) {
    r = S::fnma(n, S::set1(0.693147180559945309f), xc);
    p = S::set1(1.f / 24.f);
  } else {
    r = S::fnma(n, S::set1(0.693145751953125f), xc);
    r = S::fnma(n, S::set1(1.42860682030941723212e-6f), r);
    p = S::set1(1.f / 5040.f);
    p = S::fma(p, r, S::set1(1.f / 720.f));
    p = S::fma(p, r, S::set1(1.f / 120.f));
    p = S::fma(p, r, S::set1(1.f / 24.f));
  }
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

// e^-x without the negation: with u = x + n ln2 (n = round(-x log2 e)), e^-x = 2^n e^-u,
// and e^-u is the same polynomial with alternating signs. Same accuracy as vexp<Fast>.
template <bool Fast = false>
inline F vexp_neg(F x) {
  if constexpr (!S::kHasScalef) {
    return vexp<Fast>(S::sub(S::zero(), x));
  } else {
    // Below -88.3 the result overflows to +inf through vscalefps; the Fast polynomial (even
    // degree) is positive everywhere, so no clamp is needed on that side. Above 104 it
    // must be clamped, or a huge reduced argument would turn 0 into inf.
    const F xc = Fast ? S::min(S::set1(104.f), x) : S::min(S::set1(104.f), S::max(S::set1(-88.3f), x));
    const F n = S::round(S::mul(xc, S::set1(-1.44269504088896341f)));
    F u, p;
    if constexpr (Fast) {
      u = S::fma(n, S::set1(0.693147180559945309f), xc);
      p = S::set1(1.f / 24.f);
    } else {
      u = S::fma(n, S::set1(0.693145751953125f), xc);
      u = S::fma(n, S::set1(1.42860682030941723212e-6f), u);
      p = S::set1(-1.f / 5040.f);
      p = S::fma(p, u, S::set1(1.f / 720.f));
      p = S::fma(p, u, S::set1(-1.f / 120.f));
      p = S::fma(p, u, S::set1(1.f / 24.f));
    }
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

// x * sigmoid(x) = x / (1 + e^-x), with a reciprocal instead of the division (1/inf = 0:
// far below zero the result is -0, as the exact value underflows)
template <bool Fast = false>
inline F vsilu(F x) { return S::mul(x, vrcp<Fast>(S::add(S::set1(1.f), vexp_neg<Fast>(x)))); }

// erf by Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7)
template <bool Fast = false>
inline F verf(F z) {
  const F a = S::abs(z);
  const F t = vrcp<Fast>(S::fma(S::set1(0.3275911f), a, S::set1(1.f)));
  F p = S::set1(1.061405429f);
  p = S::fma(p, t, S::set1(-1.453152027f));
  p = S::fma(p, t, S::set1(1.421413741f));
  p = S::fma(p, t, S::set1(-0.284496736f));
  p = S::fma(p, t, S::set1(0.254829592f));
  p = S::mul(p, t);
  const F e = vexp_neg<Fast>(S::mul(a, a));
  return S::copysign(S::fnma(p, e, S::set1(1.f)), z);
}

template <bool Fast = false>
inline F vgelu(F x) {
  const F half_x = S::mul(x, S::set1(0.5f));
  return S::fma(half_x, verf<Fast>(S::mul(x, S::set1(0.70710678118654752f))), half_x);
}

// 0.5 x (1 + tanh(y)) = x sigmoid(2y) = x / (1 + e^-2y): no cancellation where tanh ~ -1
template <bool Fast = false>
inline F vgelu_tanh(F x) {
  const F inner = S::mul(S::set1(2.f * 0.79788456080286536f), S::fma(S::mul(S::set1(0.044715f), x), S::mul(x, x), x));
  return S::mul(x, vrcp<Fast>(S::add(S::set1(1.f), vexp_neg<Fast>(inner))));
}

// ---------------------------------------------------------------------------------------
// normalisation

template <class T>
void rms_norm(const tnc::NormArgs& a, int threads) {
  const int64_t n = a.n;
  tnc::parallel_for(a.rows, row_grain(n), threads, [&](int64_t r0, int64_t r1) {
    const T* w = static_cast<const T*>(a.weight);
    for (int64_t r = r0; r < r1; ++r) {
      const T* x = static_cast<const T*>(a.x) + r * n;
      T* y = static_cast<T*>(a.out) + r * n;
      const F scale = S::set1(1.f / std::sqrt(sum_squares(x, n) / static_cast<float>(n) + a.eps));
      int64_t i = 0;
      for (; i + W <= n; i += W) S::store(y + i, S::mul(S::mul(S::load(x + i), scale), S::load(w + i)));
      if (i < n) storec(y + i, S::mul(S::mul(loadc(x + i, n - i), scale), loadc(w + i, n - i)), n - i);
    }
  });
}

template <class T>
void fused_add_rms_norm(const tnc::NormArgs& a, int threads) {
  const int64_t n = a.n;
  tnc::parallel_for(a.rows, row_grain(n), threads, [&](int64_t r0, int64_t r1) {
    const T* w = static_cast<const T*>(a.weight);
    for (int64_t r = r0; r < r1; ++r) {
      const T* x = static_cast<const T*>(a.x) + r * n;
      const T* res = static_cast<const T*>(a.residual) + r * n;
      T* y = static_cast<T*>(a.out) + r * n;
      T* rout = static_cast<T*>(a.residual_out) + r * n;
      // the sum is rounded to T first: the norm is of the residual stream as stored
      for (int64_t i = 0; i < n; i += W) storec(rout + i, S::add(loadc(x + i, n - i), loadc(res + i, n - i)), n - i);
      const F scale = S::set1(1.f / std::sqrt(sum_squares(rout, n) / static_cast<float>(n) + a.eps));
      int64_t i = 0;
      for (; i + W <= n; i += W) S::store(y + i, S::mul(S::mul(S::load(rout + i), scale), S::load(w + i)));
      if (i < n) storec(y + i, S::mul(S::mul(loadc(rout + i, n - i), scale), loadc(w + i, n - i)), n - i);
    }
  });
}

template <class T>
inline float centred_sum_squares(const T* x, int64_t n, float mean) {
  const F m = S::set1(mean);
  F a0 = S::zero(), a1 = S::zero();
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const F d0 = S::sub(S::load(x + i), m), d1 = S::sub(S::load(x + i + W), m);
    a0 = S::fma(d0, d0, a0);
    a1 = S::fma(d1, d1, a1);
  }
  for (; i < n; i += W) {
    const F d = S::sub(loadc(x + i, n - i, mean), m);  // padding lanes hold the mean: d = 0
    a0 = S::fma(d, d, a0);
  }
  return S::reduce_add(S::add(a0, a1));
}

template <class T>
void layer_norm(const tnc::NormArgs& a, int threads) {
  const int64_t n = a.n;
  tnc::parallel_for(a.rows, row_grain(n), threads, [&](int64_t r0, int64_t r1) {
    const T* w = static_cast<const T*>(a.weight);
    const T* b = static_cast<const T*>(a.bias);
    for (int64_t r = r0; r < r1; ++r) {
      const T* x = static_cast<const T*>(a.x) + r * n;
      T* y = static_cast<T*>(a.out) + r * n;
      const float mean = sum_run(x, n) / static_cast<float>(n);
      const float var = centred_sum_squares(x, n, mean) / static_cast<float>(n);
      const F rstd = S::set1(1.f / std::sqrt(var + a.eps));
      const F m = S::set1(mean);
      int64_t i = 0;
      for (; i + W <= n; i += W)
        S::store(y + i, S::fma(S::mul(S::sub(S::load(x + i), m), rstd), S::load(w + i), S::load(b + i)));
      if (i < n) {
        const int64_t c = n - i;
        storec(y + i, S::fma(S::mul(S::sub(loadc(x + i, c), m), rstd), loadc(w + i, c), loadc(b + i, c)), c);
      }
    }
  });
}

template <class T>
void group_norm(const tnc::GroupNormArgs& a, int threads) {
  const int64_t per_group = a.channels / a.groups;
  const int64_t block = per_group * a.spatial;
  const int64_t s = a.spatial;
  tnc::parallel_for(a.batch * a.groups, row_grain(block), threads, [&](int64_t i0, int64_t i1) {
    for (int64_t item = i0; item < i1; ++item) {
      const T* x = static_cast<const T*>(a.x) + item * block;
      T* y = static_cast<T*>(a.out) + item * block;
      const float mean = sum_run(x, block) / static_cast<float>(block);
      const float var = centred_sum_squares(x, block, mean) / static_cast<float>(block);
      const float rstd = 1.f / std::sqrt(var + a.eps);
      const int64_t c0 = (item % a.groups) * per_group;
      for (int64_t c = 0; c < per_group; ++c) {
        float scale = rstd, shift = -mean * rstd;
        if (a.weight != nullptr) {
          const float wc = tnc::to_float(static_cast<const T*>(a.weight)[c0 + c]);
          const float bc = tnc::to_float(static_cast<const T*>(a.bias)[c0 + c]);
          scale = rstd * wc;
          shift = bc - mean * scale;
        }
        const F vs = S::set1(scale), vb = S::set1(shift);
        const T* xc = x + c * s;
        T* yc = y + c * s;
        for (int64_t i = 0; i < s; i += W) storec(yc + i, S::fma(loadc(xc + i, s - i), vs, vb), s - i);
      }
    }
  });
}

// ---------------------------------------------------------------------------------------
// softmax and log-softmax

template <class T>
void softmax_rows(const tnc::SoftmaxArgs& a, int64_t r0, int64_t r1) {
  const int64_t n = a.n;
  for (int64_t r = r0; r < r1; ++r) {
    const T* x = static_cast<const T*>(a.x) + r * n;
    T* y = static_cast<T*>(a.out) + r * n;
    const float mx = max_run(x, n);
    const F m = S::set1(mx);
    if (a.log) {
      const float lowest = -std::numeric_limits<float>::infinity();
      F acc = S::zero();
      for (int64_t i = 0; i < n; i += W) acc = S::add(acc, vexp<kHalfT<T>>(S::sub(loadc(x + i, n - i, lowest), m)));
      const F lse = S::set1(mx + std::log(S::reduce_add(acc)));
      for (int64_t i = 0; i < n; i += W) storec(y + i, S::sub(loadc(x + i, n - i), lse), n - i);
      continue;
    }
    float* e_buf = std::is_same_v<T, float> ? reinterpret_cast<float*>(y) : scratch(static_cast<size_t>(n));
    F acc0 = S::zero(), acc1 = S::zero();
    int64_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
      const F e0 = vexp<kHalfT<T>>(S::sub(S::load(x + i), m)), e1 = vexp<kHalfT<T>>(S::sub(S::load(x + i + W), m));
      S::store(e_buf + i, e0);
      S::store(e_buf + i + W, e1);
      acc0 = S::add(acc0, e0);
      acc1 = S::add(acc1, e1);
    }
    for (; i < n; i += W) {
      const int64_t c = n - i;
      const F e = vexp<kHalfT<T>>(S::sub(loadc(x + i, c, -std::numeric_limits<float>::infinity()), m));  // padding: exp(-inf) = 0
      storec(e_buf + i, e, c);
      acc0 = S::add(acc0, e);
    }
    const F inv = S::set1(1.f / S::reduce_add(S::add(acc0, acc1)));
    for (i = 0; i + W <= n; i += W) S::store(y + i, S::mul(S::load(e_buf + i), inv));
    if (i < n) storec(y + i, S::mul(loadc(e_buf + i, n - i), inv), n - i);
  }
}

// The softmax axis is not the innermost: lanes run along the inner axis.
template <class T>
void softmax_columns(const tnc::SoftmaxArgs& a, int64_t i0, int64_t i1) {
  const int64_t n = a.n, inner = a.inner;
  const int64_t chunks = (inner + W - 1) / W;
  for (int64_t item = i0; item < i1; ++item) {
    const int64_t o = item / chunks, c0 = (item % chunks) * W;
    const int64_t cnt = std::min<int64_t>(W, inner - c0);
    const T* x = static_cast<const T*>(a.x) + o * n * inner + c0;
    T* y = static_cast<T*>(a.out) + o * n * inner + c0;
    F m = S::set1(-std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < n; ++j) m = S::max_nan(m, loadc(x + j * inner, cnt));
    F sum = S::zero();
    for (int64_t j = 0; j < n; ++j) sum = S::add(sum, vexp(S::sub(loadc(x + j * inner, cnt), m)));
    if (a.log) {
      alignas(64) float lanes[W];
      S::store(lanes, sum);
      for (int l = 0; l < W; ++l) lanes[l] = std::log(lanes[l]);
      const F lse = S::add(m, S::load(static_cast<const float*>(lanes)));
      for (int64_t j = 0; j < n; ++j) storec(y + j * inner, S::sub(loadc(x + j * inner, cnt), lse), cnt);
    } else {
      const F inv = S::div(S::set1(1.f), sum);
      for (int64_t j = 0; j < n; ++j)
        storec(y + j * inner, S::mul(vexp(S::sub(loadc(x + j * inner, cnt), m)), inv), cnt);
    }
  }
}

template <class T>
void softmax(const tnc::SoftmaxArgs& a, int threads) {
  if (a.inner == 1) {
    tnc::parallel_for(a.outer, row_grain(a.n), threads, [&](int64_t r0, int64_t r1) { softmax_rows<T>(a, r0, r1); });
  } else {
    const int64_t items = a.outer * ((a.inner + W - 1) / W);
    tnc::parallel_for(items, row_grain(a.n * W), threads, [&](int64_t i0, int64_t i1) { softmax_columns<T>(a, i0, i1); });
  }
}

// ---------------------------------------------------------------------------------------
// elementwise

template <class T, tnc::UnaryOp op>
inline F unary_apply(F v) {
  if constexpr (op == tnc::UnaryOp::silu) {
    return vsilu<kHalfT<T>>(v);
  } else if constexpr (op == tnc::UnaryOp::gelu) {
    return vgelu<kHalfT<T>>(v);
  } else if constexpr (op == tnc::UnaryOp::gelu_tanh) {
    return vgelu_tanh<kHalfT<T>>(v);
  } else {
    return S::max(S::zero(), v);
  }
}

// Stream: the result is written with streaming stores (S::stream needs W * sizeof(T)
// alignment, so the range is peeled to it first), for results far larger than the caches.
template <class T, tnc::UnaryOp op, bool Stream = false>
void unary_range(const T* x, T* y, int64_t n) {
  int64_t i = 0;
  if constexpr (Stream) {
    constexpr uintptr_t kAlign = W * sizeof(T);
    const int64_t pe = std::min<int64_t>(n, static_cast<int64_t>(((kAlign - (reinterpret_cast<uintptr_t>(y) % kAlign)) % kAlign) / sizeof(T)));
    for (; i < pe; i += W) storec(y + i, unary_apply<T, op>(loadc(x + i, pe - i)), std::min<int64_t>(W, pe - i));
    i = pe;
    for (; i + W <= n; i += W) S::stream(y + i, unary_apply<T, op>(S::load(x + i)));
  }
  for (; i < n; i += W) {
    const int64_t c = n - i;
    storec(y + i, unary_apply<T, op>(loadc(x + i, c)), c);
  }
}

template <class T>
void unary(const tnc::UnaryArgs& a, int threads) {
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.out);
  const int64_t grain = a.op == tnc::UnaryOp::relu ? 65536 : 8192;
  const bool stream = S::kHasStream && x != y && a.numel * static_cast<int64_t>(sizeof(T)) >= (int64_t{8} << 20);
  tnc::parallel_for(a.numel, grain, threads, [&](int64_t b, int64_t e) {
    if (stream) {
      switch (a.op) {
        case tnc::UnaryOp::silu: unary_range<T, tnc::UnaryOp::silu, true>(x + b, y + b, e - b); break;
        case tnc::UnaryOp::gelu: unary_range<T, tnc::UnaryOp::gelu, true>(x + b, y + b, e - b); break;
        case tnc::UnaryOp::gelu_tanh: unary_range<T, tnc::UnaryOp::gelu_tanh, true>(x + b, y + b, e - b); break;
        case tnc::UnaryOp::relu: unary_range<T, tnc::UnaryOp::relu, true>(x + b, y + b, e - b); break;
      }
      S::stream_fence();
      return;
    }
    switch (a.op) {
      case tnc::UnaryOp::silu: unary_range<T, tnc::UnaryOp::silu>(x + b, y + b, e - b); break;
      case tnc::UnaryOp::gelu: unary_range<T, tnc::UnaryOp::gelu>(x + b, y + b, e - b); break;
      case tnc::UnaryOp::gelu_tanh: unary_range<T, tnc::UnaryOp::gelu_tanh>(x + b, y + b, e - b); break;
      case tnc::UnaryOp::relu: unary_range<T, tnc::UnaryOp::relu>(x + b, y + b, e - b); break;
    }
  });
}

template <class T>
void silu_and_mul(const tnc::GatedArgs& a, int threads) {
  const int64_t n = a.n;
  // split columns too, so that one long row still uses every thread
  const int64_t col_block = std::max<int64_t>(W, ((n + 3) / 4 + W - 1) / W * W);
  const int64_t blocks = (n + col_block - 1) / col_block;
  // A result much larger than the caches is written with streaming stores (no read for
  // ownership of lines that are overwritten whole); a small one stays in cache for the next op.
  [[maybe_unused]] const bool stream = a.rows * n * static_cast<int64_t>(sizeof(T)) >= (int64_t{8} << 20);
  tnc::parallel_for(a.rows * blocks, std::max<int64_t>(1, 8192 / col_block), threads, [&](int64_t i0, int64_t i1) {
#if defined(TNC_AVX512_BF16_GEMM)
    struct Fence {
      bool on;
      ~Fence() { if (on) _mm_sfence(); }
    } fence{stream && std::is_same_v<T, bf16_t>};
#endif
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t r = item / blocks, c0 = (item % blocks) * col_block, c1 = std::min(n, c0 + col_block);
      const T* gate = static_cast<const T*>(a.x) + r * 2 * n;
      const T* val = gate + n;
      T* y = static_cast<T*>(a.out) + r * n;
      int64_t i = c0;
#if defined(TNC_AVX512_BF16_GEMM)
      if constexpr (std::is_same_v<T, bf16_t>) {
        // 32 bfloat16 per load: even elements widen with a shift, odd ones with a mask (no
        // cross-lane unpacking); the two float results are packed by one vcvtne2ps2bf16 and
        // re-interleaved by one vpermw
        const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
        const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5,
                                               20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        if (stream) {  // peel to a 64-byte boundary of the output for the streaming stores
          const int64_t e = i + std::min<int64_t>(c1 - i, static_cast<int64_t>(((64 - (reinterpret_cast<uintptr_t>(y + i) & 63)) & 63) / 2));
          for (int64_t j = i; j < e; j += W) {
            const int64_t c = std::min<int64_t>(W, e - j);
            storec(y + j, S::mul(vsilu<true>(loadc(gate + j, c)), loadc(val + j, c)), c);
          }
          i = e;
        }
        for (; i + 32 <= c1; i += 32) {
          const __m512i g = _mm512_loadu_si512(gate + i), v = _mm512_loadu_si512(val + i);
          const F ge = _mm512_castsi512_ps(_mm512_slli_epi32(g, 16)), go = _mm512_castsi512_ps(_mm512_and_si512(g, hi));
          const F ve = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), vo = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
          const F re = S::mul(vsilu<true>(ge), ve), ro = S::mul(vsilu<true>(go), vo);
          const __m512i packed = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(ro, re));
          if (stream) {
            _mm512_stream_si512(reinterpret_cast<__m512i*>(y + i), _mm512_permutexvar_epi16(inter, packed));
          } else {
            _mm512_storeu_si512(y + i, _mm512_permutexvar_epi16(inter, packed));
          }
        }
      }
#endif
      for (; i < c1; i += W) {
        const int64_t c = c1 - i;
        storec(y + i, S::mul(vsilu<kHalfT<T>>(loadc(gate + i, c)), loadc(val + i, c)), c);
      }
    }
  });
}

// Odometer over the merged axes of a broadcast: offset of each operand for an outer index.
inline void broadcast_offsets(const tnc::BroadcastArgs& a, int64_t outer_index, int64_t off[3]) {
  off[0] = off[1] = off[2] = 0;
  for (int d = a.ndim - 2; d >= 0; --d) {
    const int64_t i = outer_index % a.sizes[d];
    outer_index /= a.sizes[d];
    for (int k = 0; k < 3; ++k) off[k] += i * a.strides[k][d];
  }
}

// Calls inner(offsets, begin, count) over the innermost axis in chunks, in parallel.
template <class Inner>
void broadcast_for(const tnc::BroadcastArgs& a, int threads, int64_t grain, Inner inner) {
  const int64_t len = a.sizes[a.ndim - 1];
  int64_t outer = 1;
  for (int d = 0; d < a.ndim - 1; ++d) outer *= a.sizes[d];
  const int64_t chunk = std::min<int64_t>(len, std::max<int64_t>(grain, 4096));
  const int64_t chunks = (len + chunk - 1) / chunk;
  tnc::parallel_for(outer * chunks, std::max<int64_t>(1, grain / chunk), threads, [&](int64_t i0, int64_t i1) {
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t row = item / chunks, c0 = (item % chunks) * chunk;
      int64_t off[3];
      broadcast_offsets(a, row, off);
      inner(off, row * len + c0, c0, std::min(chunk, len - c0));
    }
  });
}

template <class T>
void binary_float(const tnc::BroadcastArgs& a, int threads) {
  const T* pa = static_cast<const T*>(a.in[0]);
  const T* pb = static_cast<const T*>(a.in[1]);
  T* out = static_cast<T*>(a.out);
  const int last = a.ndim - 1;
  const bool a_vec = a.strides[0][last] != 0, b_vec = a.strides[1][last] != 0;
  const float alpha = static_cast<float>(a.alpha);
  const bool mul = a.op == tnc::BinaryOp::mul, scaled = !mul && alpha != 1.f;
  broadcast_for(a, threads, 32768, [&](const int64_t* off, int64_t out_at, int64_t c0, int64_t count) {
    const T* xa = pa + off[0] + (a_vec ? c0 : 0);
    const T* xb = pb + off[1] + (b_vec ? c0 : 0);
    T* y = out + out_at;
    const F sa = S::set1(tnc::to_float(*xa)), sb = S::set1(tnc::to_float(*xb)), va = S::set1(alpha);
    for (int64_t i = 0; i < count; i += W) {
      const int64_t c = count - i;
      const F u = a_vec ? loadc(xa + i, c) : sa;
      const F v = b_vec ? loadc(xb + i, c) : sb;
      const F r = mul ? S::mul(u, v) : (scaled ? S::fma(v, va, u) : S::add(u, v));
      storec(y + i, r, c);
    }
  });
}

template <class I>
void binary_int(const tnc::BroadcastArgs& a, int threads) {
  const I* pa = static_cast<const I*>(a.in[0]);
  const I* pb = static_cast<const I*>(a.in[1]);
  I* out = static_cast<I*>(a.out);
  const int last = a.ndim - 1;
  const int64_t sa = a.strides[0][last] != 0 ? 1 : 0, sb = a.strides[1][last] != 0 ? 1 : 0;
  const bool mul = a.op == tnc::BinaryOp::mul;
  const int64_t alpha = static_cast<int64_t>(a.alpha);
  broadcast_for(a, threads, 65536, [&](const int64_t* off, int64_t out_at, int64_t c0, int64_t count) {
    const I* xa = pa + off[0] + sa * c0;
    const I* xb = pb + off[1] + sb * c0;
    I* y = out + out_at;
    // wrap-around arithmetic in the element type, as torch does (computed in uint64)
    auto run = [&](auto step_a, auto step_b) {
      for (int64_t i = 0; i < count; ++i) {
        const uint64_t u = static_cast<uint64_t>(static_cast<int64_t>(xa[i * step_a]));
        const uint64_t v = static_cast<uint64_t>(static_cast<int64_t>(xb[i * step_b]));
        y[i] = static_cast<I>(mul ? u * v : u + static_cast<uint64_t>(alpha) * v);
      }
    };
    if (sa && sb) run(std::integral_constant<int64_t, 1>{}, std::integral_constant<int64_t, 1>{});
    else if (sa) run(std::integral_constant<int64_t, 1>{}, std::integral_constant<int64_t, 0>{});
    else if (sb) run(std::integral_constant<int64_t, 0>{}, std::integral_constant<int64_t, 1>{});
    else run(std::integral_constant<int64_t, 0>{}, std::integral_constant<int64_t, 0>{});
  });
}

inline void binary_bool(const tnc::BroadcastArgs& a, int threads) {
  const uint8_t* pa = static_cast<const uint8_t*>(a.in[0]);
  const uint8_t* pb = static_cast<const uint8_t*>(a.in[1]);
  uint8_t* out = static_cast<uint8_t*>(a.out);
  const int last = a.ndim - 1;
  const int64_t sa = a.strides[0][last] != 0 ? 1 : 0, sb = a.strides[1][last] != 0 ? 1 : 0;
  const bool mul = a.op == tnc::BinaryOp::mul;
  const uint8_t keep_b = (mul || a.alpha != 0.0) ? 1 : 0;
  broadcast_for(a, threads, 65536, [&](const int64_t* off, int64_t out_at, int64_t c0, int64_t count) {
    const uint8_t* xa = pa + off[0] + sa * c0;
    const uint8_t* xb = pb + off[1] + sb * c0;
    uint8_t* y = out + out_at;
    for (int64_t i = 0; i < count; ++i) {
      const uint8_t u = xa[i * sa] != 0, v = (xb[i * sb] != 0) & keep_b;
      y[i] = mul ? (u & v) : (u | v);
    }
  });
}

template <class T>
void clamp(const tnc::BroadcastArgs& a, int threads) {
  const T* px = static_cast<const T*>(a.in[0]);
  const T* plo = static_cast<const T*>(a.in[1]);
  const T* phi = static_cast<const T*>(a.in[2]);
  T* out = static_cast<T*>(a.out);
  const int last = a.ndim - 1;
  const bool vx = a.strides[0][last] != 0, vlo = a.strides[1][last] != 0, vhi = a.strides[2][last] != 0;
  broadcast_for(a, threads, 32768, [&](const int64_t* off, int64_t out_at, int64_t c0, int64_t count) {
    const T* x = px + off[0] + (vx ? c0 : 0);
    const T* lo = plo ? plo + off[1] + (vlo ? c0 : 0) : nullptr;
    const T* hi = phi ? phi + off[2] + (vhi ? c0 : 0) : nullptr;
    T* y = out + out_at;
    const F sx = S::set1(tnc::to_float(*x));
    const F slo = S::set1(lo ? tnc::to_float(*lo) : 0.f), shi = S::set1(hi ? tnc::to_float(*hi) : 0.f);
    for (int64_t i = 0; i < count; i += W) {
      const int64_t c = count - i;
      F r = vx ? loadc(x + i, c) : sx;
      // bound first: where x is NaN the second operand (x) is kept, as torch.clamp does
      if (lo) r = S::max(vlo ? loadc(lo + i, c) : slo, r);
      if (hi) r = S::min(vhi ? loadc(hi + i, c) : shi, r);
      storec(y + i, r, c);
    }
  });
}

// ---------------------------------------------------------------------------------------
// reductions over merged axes (contiguous input)

template <class T>
void reduce(const tnc::ReduceArgs& a, int threads) {
  const T* x = static_cast<const T*>(a.x);
  T* out = static_cast<T*>(a.out);
  const bool is_max = a.op == tnc::ReduceOp::amax;
  const float init = is_max ? -std::numeric_limits<float>::infinity() : 0.f;
  const float scale = a.scale;
  int64_t stride[tnc::kMaxDims];
  int64_t st = 1;
  for (int d = a.ndim - 1; d >= 0; --d) {
    stride[d] = st;
    st *= a.sizes[d];
  }
  const int last = a.ndim - 1;
  const int64_t len = a.sizes[last];
  int kept[tnc::kMaxDims], red[tnc::kMaxDims];
  int nk = 0, nr = 0;
  for (int d = 0; d < last; ++d) (a.reduced[d] ? red[nr++] : kept[nk++]) = d;
  int64_t n_red = 1, n_kept = 1;
  for (int i = 0; i < nr; ++i) n_red *= a.sizes[red[i]];
  for (int i = 0; i < nk; ++i) n_kept *= a.sizes[kept[i]];
  auto offset_of = [&](int64_t index, const int* dims, int count) {
    int64_t off = 0;
    for (int i = count - 1; i >= 0; --i) {
      off += (index % a.sizes[dims[i]]) * stride[dims[i]];
      index /= a.sizes[dims[i]];
    }
    return off;
  };
  if (a.reduced[last]) {
    if (n_kept == 1 && n_red == 1) {  // one contiguous run: split it over threads
      const int parts = std::max(1, std::min<int>(threads, static_cast<int>(len / 65536)));
      float partial[256];
      const int64_t piece = (len + parts - 1) / parts;
      tnc::parallel_for(parts, 1, threads, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) {
          const int64_t b = p * piece, e = std::min(len, b + piece);
          partial[p] = b >= e ? init : (is_max ? max_run(x + b, e - b) : sum_run(x + b, e - b));
        }
      });
      float acc = init;
      for (int p = 0; p < parts; ++p) acc = is_max ? max_nan(acc, partial[p]) : acc + partial[p];
      out[0] = tnc::from_float<T>(acc * scale);
      return;
    }
    tnc::parallel_for(n_kept, row_grain(len * n_red), threads, [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) {
        const int64_t base = offset_of(o, kept, nk);
        float acc = init;
        for (int64_t rc = 0; rc < n_red; ++rc) {
          const T* p = x + base + offset_of(rc, red, nr);
          acc = is_max ? max_nan(acc, max_run(p, len)) : acc + sum_run(p, len);
        }
        out[o] = tnc::from_float<T>(acc * scale);
      }
    });
    return;
  }
  // The innermost axis is kept: accumulate whole rows into float columns. A chunk covers
  // up to 8192 columns, so consecutive reduced rows are read as one sequential stream (a
  // narrower strip would restart the hardware prefetcher at every page). When there are
  // too few (kept, chunk) items for the threads, the reduced rows are split into parts,
  // each summed into its own float buffer, and the parts are combined at the end.
  constexpr int64_t kChunk = 8192;
  const int64_t chunks = (len + kChunk - 1) / kChunk;
  const int64_t items = n_kept * chunks;
  int64_t rparts = 1;
  if (items < 2 * threads) rparts = std::max<int64_t>(1, std::min<int64_t>((2 * threads + items - 1) / items, n_red / 16));
  const int64_t rspan = (n_red + rparts - 1) / rparts;
  const int64_t cw = std::min(kChunk, len);
  std::vector<float> partial(rparts > 1 ? static_cast<size_t>(items * rparts * cw) : 0);
  const F vs = S::set1(scale);
  auto accumulate = [&](float* acc, int64_t base, int64_t cnt, int64_t r0, int64_t r1) {
    for (int64_t i = 0; i < cnt; ++i) acc[i] = init;
    for (int64_t rc = r0; rc < r1; ++rc) {
      const T* p = x + base + offset_of(rc, red, nr);
      int64_t i = 0;
      for (; i + 4 * W <= cnt; i += 4 * W) {
        F c0 = S::load(acc + i), c1 = S::load(acc + i + W), c2 = S::load(acc + i + 2 * W), c3 = S::load(acc + i + 3 * W);
        const F v0 = S::load(p + i), v1 = S::load(p + i + W), v2 = S::load(p + i + 2 * W), v3 = S::load(p + i + 3 * W);
        if (is_max) {
          c0 = S::max_nan(c0, v0), c1 = S::max_nan(c1, v1), c2 = S::max_nan(c2, v2), c3 = S::max_nan(c3, v3);
        } else {
          c0 = S::add(c0, v0), c1 = S::add(c1, v1), c2 = S::add(c2, v2), c3 = S::add(c3, v3);
        }
        S::store(acc + i, c0), S::store(acc + i + W, c1), S::store(acc + i + 2 * W, c2), S::store(acc + i + 3 * W, c3);
      }
      for (; i < cnt; i += W) {
        const F v = loadc(p + i, cnt - i, init);
        const F c = loadc(acc + i, cnt - i, init);
        storec(acc + i, is_max ? S::max_nan(c, v) : S::add(c, v), cnt - i);
      }
    }
  };
  tnc::parallel_for(items * rparts, 1, threads, [&](int64_t i0, int64_t i1) {
    float* own = scratch(kChunk);
    for (int64_t it = i0; it < i1; ++it) {
      const int64_t item = it / rparts, rp = it % rparts;
      const int64_t o = item / chunks, c0 = (item % chunks) * kChunk, cnt = std::min(kChunk, len - c0);
      const int64_t base = offset_of(o, kept, nk) + c0;
      float* acc = rparts > 1 ? partial.data() + it * cw : own;
      accumulate(acc, base, cnt, rp * rspan, std::min(n_red, (rp + 1) * rspan));
      if (rparts > 1) continue;
      T* y = out + o * len + c0;
      for (int64_t i = 0; i < cnt; i += W) storec(y + i, S::mul(loadc(acc + i, cnt - i), vs), cnt - i);
    }
  });
  if (rparts == 1) return;
  const int64_t vblocks = (cw + W - 1) / W;
  tnc::parallel_for(items * vblocks, 256, threads, [&](int64_t i0, int64_t i1) {
    for (int64_t it = i0; it < i1; ++it) {
      const int64_t item = it / vblocks, i = (it % vblocks) * W;
      const int64_t o = item / chunks, c0 = (item % chunks) * kChunk, cnt = std::min(kChunk, len - c0);
      if (i >= cnt) continue;
      const float* p0 = partial.data() + item * rparts * cw;
      F r = loadc(p0 + i, cnt - i, init);
      for (int64_t rp = 1; rp < rparts; ++rp) {
        const F v = loadc(p0 + rp * cw + i, cnt - i, init);
        r = is_max ? S::max_nan(r, v) : S::add(r, v);
      }
      storec(out + o * len + c0 + i, S::mul(r, vs), cnt - i);
    }
  });
}

// ---------------------------------------------------------------------------------------
// rotary position embedding, NeoX half split

template <class T>
void rope(const tnc::RopeArgs& a, int threads) {
  const int64_t half = a.rotary_dim / 2, d = a.head_dim, heads = a.heads;
  tnc::parallel_for(a.tokens, row_grain(heads * d), threads, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int64_t pos;
      if (a.positions == nullptr) {
        pos = t % a.seq;
      } else {
        pos = a.positions_are_i64 ? static_cast<const int64_t*>(a.positions)[t] : static_cast<const int32_t*>(a.positions)[t];
      }
      const float* cs = a.cos + pos * half;
      const float* sn = a.sin + pos * half;
      for (int64_t h = 0; h < heads; ++h) {
        const T* x = static_cast<const T*>(a.x) + (t * heads + h) * d;
        T* y = static_cast<T*>(a.out) + (t * heads + h) * d;
        for (int64_t i = 0; i < half; i += W) {
          const int64_t c = half - i;
          const F x1 = loadc(x + i, c), x2 = loadc(x + half + i, c);
          const F co = loadc(cs + i, c), si = loadc(sn + i, c);
          storec(y + i, S::fnma(x2, si, S::mul(x1, co)), c);
          storec(y + half + i, S::fma(x1, si, S::mul(x2, co)), c);
        }
        for (int64_t i = a.rotary_dim; i < d; ++i) y[i] = x[i];
      }
    }
  });
}

// ---------------------------------------------------------------------------------------
// GEMM: pack to float panels, MR x (2 W) register micro-tiles, float accumulation

constexpr int kMR = S::kGemmMR;
constexpr int kNR = 2 * W;
constexpr int64_t kKC = 256;
constexpr int64_t kMC = kMR * 8;
constexpr int64_t kNC = 512;

// acc[MR x NR] (+)= Ap[kc x MR]^T * Bp[kc x NR]; c has row stride ldc.
inline void micro_tile(int64_t kc, const float* __restrict ap, const float* __restrict bp, float* __restrict c, int64_t ldc,
                       int mr, int nr, bool first) {
  F acc0[kMR], acc1[kMR];
#pragma GCC unroll 16
  for (int r = 0; r < kMR; ++r) acc0[r] = acc1[r] = S::zero();
  for (int64_t kk = 0; kk < kc; ++kk) {
    const F b0 = S::load(bp + kk * kNR), b1 = S::load(bp + kk * kNR + W);
    const float* ak = ap + kk * kMR;
#pragma GCC unroll 16
    for (int r = 0; r < kMR; ++r) {
      const F av = S::set1(ak[r]);
      acc0[r] = S::fma(av, b0, acc0[r]);
      acc1[r] = S::fma(av, b1, acc1[r]);
    }
  }
  if (mr == kMR && nr == kNR) {
#pragma GCC unroll 16
    for (int r = 0; r < kMR; ++r) {
      float* row = c + r * ldc;
      if (first) {
        S::store(row, acc0[r]);
        S::store(row + W, acc1[r]);
      } else {
        S::store(row, S::add(S::load(row), acc0[r]));
        S::store(row + W, S::add(S::load(row + W), acc1[r]));
      }
    }
    return;
  }
  alignas(64) float tile[kMR * kNR];
  for (int r = 0; r < kMR; ++r) {
    S::store(tile + r * kNR, acc0[r]);
    S::store(tile + r * kNR + W, acc1[r]);
  }
  for (int r = 0; r < mr; ++r)
    for (int j = 0; j < nr; ++j) c[r * ldc + j] = (first ? 0.f : c[r * ldc + j]) + tile[r * kNR + j];
}

template <class T>
void gemm(const tnc::GemmArgs& g, int threads) {
  const int64_t m = g.m, n = g.n, k = g.k;
  const int64_t nc_max = std::min(kNC, (n + kNR - 1) / kNR * kNR);
  const int64_t mcb = std::clamp<int64_t>((m + 2 * threads - 1) / (2 * threads) + kMR - 1, kMR, kMC) / kMR * kMR;
  float* bpack = scratch(static_cast<size_t>(kKC * nc_max), 2);
  float* cacc = scratch(static_cast<size_t>(m * nc_max), 3);
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    const T* A = static_cast<const T*>(g.a) + bi * g.a_batch;
    const T* B = static_cast<const T*>(g.b) + bi * g.b_batch;
    T* D = static_cast<T*>(g.d) + bi * g.d_batch;
    for (int64_t jc = 0; jc < n; jc += kNC) {
      const int64_t nc = std::min(kNC, n - jc);
      const int64_t panels = (nc + kNR - 1) / kNR;
      if (k == 0) {
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < nc; ++j) D[i * n + jc + j] = tnc::from_float<T>(0.f);
        continue;
      }
      for (int64_t pc = 0; pc < k; pc += kKC) {
        const int64_t kc = std::min(kKC, k - pc);
        const bool first = pc == 0, last = pc + kc >= k;
        tnc::parallel_for(panels, 1, threads, [&](int64_t p0, int64_t p1) {
          for (int64_t p = p0; p < p1; ++p) {
            float* dst = bpack + p * kc * kNR;
            for (int64_t j = 0; j < kNR; ++j) {
              const int64_t col = jc + p * kNR + j;
              if (col >= jc + nc) {
                for (int64_t kk = 0; kk < kc; ++kk) dst[kk * kNR + j] = 0.f;
                continue;
              }
              const T* src = B + col * g.b_col + pc * g.b_row;
              for (int64_t kk = 0; kk < kc; ++kk) dst[kk * kNR + j] = tnc::to_float(src[kk * g.b_row]);
            }
          }
        });
        const int64_t mblocks = (m + mcb - 1) / mcb;
        tnc::parallel_for(mblocks, 1, threads, [&](int64_t b0, int64_t b1) {
          float* apack = scratch(static_cast<size_t>(kMC * kKC), 1);
          for (int64_t blk = b0; blk < b1; ++blk) {
            const int64_t ic = blk * mcb, mc = std::min(mcb, m - ic);
            for (int64_t ir = 0; ir < mc; ir += kMR) {
              float* dst = apack + ir * kc;
              for (int r = 0; r < kMR; ++r) {
                const int64_t row = ic + ir + r;
                if (row >= m) {
                  for (int64_t kk = 0; kk < kc; ++kk) dst[kk * kMR + r] = 0.f;
                  continue;
                }
                const T* src = A + row * g.a_row + pc * g.a_col;
                for (int64_t kk = 0; kk < kc; ++kk) dst[kk * kMR + r] = tnc::to_float(src[kk * g.a_col]);
              }
            }
            for (int64_t p = 0; p < panels; ++p) {
              const int nr = static_cast<int>(std::min<int64_t>(kNR, nc - p * kNR));
              for (int64_t ir = 0; ir < mc; ir += kMR) {
                const int mr = static_cast<int>(std::min<int64_t>(kMR, mc - ir));
                micro_tile(kc, apack + ir * kc, bpack + p * kc * kNR, cacc + (ic + ir) * nc_max + p * kNR,
                           nc_max, mr, nr, first);
              }
            }
            if (last) {
              for (int64_t i = ic; i < ic + mc; ++i) {
                const float* crow = cacc + i * nc_max;
                T* drow = D + i * n + jc;
                for (int64_t j = 0; j < nc; j += W) storec(drow + j, loadc(crow + j, nc - j), nc - j);
              }
            }
          }
        });
      }
    }
  }
}

#if defined(TNC_AVX512_BF16_GEMM)
// bfloat16 GEMM on AVX512-BF16: vdpbf16ps multiplies pairs of bf16 along K and accumulates
// in float32, twice the rate of the float32 FMA path. Operands are packed as K-pairs:
// A as one 32-bit (a[i,k], a[i,k+1]) word per row, B as 32 columns x one pair each.
constexpr int kMRb = 12;
constexpr int64_t kKCb = 1024;  // K per block (512 pairs): A micro-panel 24 KB, B panel 64 KB
constexpr int64_t kNCb = 1024;

// With `out` set (the whole K in one block) the tile is rounded and stored to the bf16
// result directly, skipping the float accumulator's round trip.
inline void micro_tile_bf16(int64_t kp_count, const uint32_t* __restrict ap, const uint16_t* __restrict bp, float* __restrict c,
                            int64_t ldc, int mr, int nr, bool first, bf16_t* __restrict out = nullptr, int64_t ldo = 0) {
  __m512 acc0[kMRb], acc1[kMRb];
#pragma GCC unroll 16
  for (int r = 0; r < kMRb; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < kp_count; ++kp) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + kp * 64);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + kp * 64 + 32);
    const uint32_t* ak = ap + kp * kMRb;
#pragma GCC unroll 16
    for (int r = 0; r < kMRb; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(ak[r]));
      // the broadcast operand last, so it can fold into the instruction as {1to16}
      acc0[r] = _mm512_dpbf16_ps(acc0[r], b0, av);
      acc1[r] = _mm512_dpbf16_ps(acc1[r], b1, av);
    }
  }
  if (out != nullptr) {
    const __mmask16 m0 = static_cast<__mmask16>(nr >= 16 ? 0xffffu : (1u << nr) - 1u);
    const __mmask16 m1 = static_cast<__mmask16>(nr >= 32 ? 0xffffu : nr <= 16 ? 0u : (1u << (nr - 16)) - 1u);
    for (int r = 0; r < mr; ++r) {
      bf16_t* row = out + r * ldo;
      _mm256_mask_storeu_epi16(row, m0, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(acc0[r])));
      _mm256_mask_storeu_epi16(row + 16, m1, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(acc1[r])));
    }
    return;
  }
  if (mr == kMRb && nr == 32) {
#pragma GCC unroll 16
    for (int r = 0; r < kMRb; ++r) {
      float* row = c + r * ldc;
      if (first) {
        _mm512_storeu_ps(row, acc0[r]);
        _mm512_storeu_ps(row + 16, acc1[r]);
      } else {
        _mm512_storeu_ps(row, _mm512_add_ps(_mm512_loadu_ps(row), acc0[r]));
        _mm512_storeu_ps(row + 16, _mm512_add_ps(_mm512_loadu_ps(row + 16), acc1[r]));
      }
    }
    return;
  }
  alignas(64) float tile[kMRb * 32];
  for (int r = 0; r < kMRb; ++r) {
    _mm512_store_ps(tile + r * 32, acc0[r]);
    _mm512_store_ps(tile + r * 32 + 16, acc1[r]);
  }
  for (int r = 0; r < mr; ++r)
    for (int j = 0; j < nr; ++j) c[r * ldc + j] = (first ? 0.f : c[r * ldc + j]) + tile[r * 32 + j];
}

// In-register transpose of a 16x16 matrix of 32-bit words: v[r] lane c -> v[c] lane r.
inline void transpose16x16_epi32(__m512i v[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // v[4i + c], 128-bit lane L: rows 4i..4i+3 of column 4L + c
    v[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
    v[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
    v[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    v[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i u0 = _mm512_shuffle_i32x4(v[c], v[4 + c], 0x88), u1 = _mm512_shuffle_i32x4(v[c], v[4 + c], 0xdd);
    const __m512i u2 = _mm512_shuffle_i32x4(v[8 + c], v[12 + c], 0x88), u3 = _mm512_shuffle_i32x4(v[8 + c], v[12 + c], 0xdd);
    t[c] = _mm512_shuffle_i32x4(u0, u2, 0x88);
    t[8 + c] = _mm512_shuffle_i32x4(u0, u2, 0xdd);
    t[4 + c] = _mm512_shuffle_i32x4(u1, u3, 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(u1, u3, 0xdd);
  }
  for (int i = 0; i < 16; ++i) v[i] = t[i];
}

inline void gemm_bf16_dot(const tnc::GemmArgs& g, int threads) {
  const int64_t m = g.m, n = g.n, k = g.k;
  if (k == 0) {
    gemm<bf16_t>(g, threads);
    return;
  }
  const int64_t nc_max = std::min(kNCb, (n + 31) / 32 * 32);
  // row blocks: at most 12 micro-tiles tall, at least two per thread, and a multiple of
  // the thread count (11 blocks on 2 threads left one thread idle for a twelfth of the time)
  const int64_t tiles = (m + kMRb - 1) / kMRb;
  int64_t want_blocks = std::max<int64_t>((tiles + 11) / 12, 2 * threads);
  want_blocks = std::min<int64_t>(tiles, (want_blocks + threads - 1) / threads * threads);
  const int64_t mc = (tiles + want_blocks - 1) / want_blocks * kMRb;
  const int64_t kcp_max = (std::min(kKCb, k) + 1) / 2;
  uint16_t* bpack = reinterpret_cast<uint16_t*>(scratch(static_cast<size_t>(kcp_max * nc_max), 2));
  float* cacc = scratch(static_cast<size_t>(m * nc_max), 3);
  auto bits = [](const bf16_t* p, int64_t i) { return p[i].bits; };
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    const bf16_t* A = static_cast<const bf16_t*>(g.a) + bi * g.a_batch;
    const bf16_t* B = static_cast<const bf16_t*>(g.b) + bi * g.b_batch;
    bf16_t* D = static_cast<bf16_t*>(g.d) + bi * g.d_batch;
    for (int64_t jc = 0; jc < n; jc += kNCb) {
      const int64_t nc = std::min(kNCb, n - jc);
      const int64_t panels = (nc + 31) / 32;
      for (int64_t pc = 0; pc < k; pc += kKCb) {
        const int64_t kc = std::min(kKCb, k - pc), kcp = (kc + 1) / 2;
        const bool first = pc == 0, last = pc + kc >= k;
        tnc::parallel_for(panels, 1, threads, [&](int64_t p0, int64_t p1) {
          for (int64_t p = p0; p < p1; ++p) {
            uint16_t* dst = bpack + p * kcp * 64;
            const int64_t col0 = jc + p * 32;
            const bool full = col0 + 32 <= jc + nc && kc % 2 == 0;
            if (full && g.b_col == 1) {  // rows of B contiguous: interleave two rows per K pair
              const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37,
                                                      5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
              const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
              for (int64_t kp = 0; kp < kcp; ++kp) {
                const bf16_t* r0 = B + (pc + 2 * kp) * g.b_row + col0;
                const __m512i x0 = _mm512_loadu_si512(r0), x1 = _mm512_loadu_si512(r0 + g.b_row);
                _mm512_storeu_si512(dst + kp * 64, _mm512_permutex2var_epi16(x0, lo_idx, x1));
                _mm512_storeu_si512(dst + kp * 64 + 32, _mm512_permutex2var_epi16(x0, hi_idx, x1));
              }
              continue;
            }
            if (full && g.b_row == 1) {
              // columns of B contiguous along K (the NT layout): each K pair is one 32-bit
              // word, so a panel is a transpose of 32-bit words: 16 columns x 16 pairs per
              // 16x16 register transpose (a gather per pair was the bottleneck)
              for (int h = 0; h < 2; ++h) {
                const bf16_t* base = B + (col0 + 16 * h) * g.b_col + pc;
                uint16_t* dh = dst + 32 * h;
                for (int64_t kp0 = 0; kp0 < kcp; kp0 += 16) {
                  const int rem = static_cast<int>(std::min<int64_t>(16, kcp - kp0));
                  const __mmask16 mk = static_cast<__mmask16>((1u << rem) - 1u);
                  __m512i rows[16];
                  for (int r = 0; r < 16; ++r) {
                    // 32 row streams at once are more than the hardware prefetcher tracks
                    if (kp0 + 128 < kcp) _mm_prefetch(reinterpret_cast<const char*>(base + r * g.b_col + 2 * (kp0 + 128)), _MM_HINT_T0);
                    rows[r] = _mm512_maskz_loadu_epi32(mk, base + r * g.b_col + 2 * kp0);
                  }
                  transpose16x16_epi32(rows);
                  for (int t = 0; t < rem; ++t) _mm512_storeu_si512(dh + (kp0 + t) * 64, rows[t]);
                }
              }
              continue;
            }
            for (int64_t j = 0; j < 32; ++j) {
              const int64_t col = col0 + j;
              const bool live = col < jc + nc;
              const bf16_t* src = B + (live ? col : 0) * g.b_col + pc * g.b_row;
              for (int64_t kp = 0; kp < kcp; ++kp) {
                const int64_t kk = 2 * kp;
                dst[kp * 64 + 2 * j] = live ? bits(src, kk * g.b_row) : 0;
                dst[kp * 64 + 2 * j + 1] = (live && kk + 1 < kc) ? bits(src, (kk + 1) * g.b_row) : 0;
              }
            }
          }
        });
        const int64_t mblocks = (m + mc - 1) / mc;
        tnc::parallel_for(mblocks, 1, threads, [&](int64_t b0, int64_t b1) {
          uint32_t* apack = reinterpret_cast<uint32_t*>(scratch(static_cast<size_t>(mc * kcp_max), 1));
          for (int64_t blk = b0; blk < b1; ++blk) {
            const int64_t ic = blk * mc, mcur = std::min(mc, m - ic);
            for (int64_t ir = 0; ir < mcur; ir += kMRb) {
              uint32_t* dst = apack + ir * kcp;
              if (g.a_col == 1 && kc % 2 == 0) {
                // rows of A contiguous along K: a micro-panel is a transpose of 32-bit K pairs,
                // 16 pairs x 12 rows (4 zero rows) per 16x16 register transpose
                const int live = static_cast<int>(std::min<int64_t>(kMRb, m - (ic + ir)));
                for (int64_t kp0 = 0; kp0 < kcp; kp0 += 16) {
                  const int rem = static_cast<int>(std::min<int64_t>(16, kcp - kp0));
                  const __mmask16 mk = static_cast<__mmask16>((1u << rem) - 1u);
                  __m512i rows[16];
                  for (int r = 0; r < 16; ++r)
                    rows[r] = r < live ? _mm512_maskz_loadu_epi32(mk, A + (ic + ir + r) * g.a_row + pc + 2 * kp0) : _mm512_setzero_si512();
                  transpose16x16_epi32(rows);
                  for (int t = 0; t < rem; ++t) _mm512_mask_storeu_epi32(dst + (kp0 + t) * kMRb, 0x0fff, rows[t]);
                }
                continue;
              }
              for (int r = 0; r < kMRb; ++r) {
                const int64_t row = ic + ir + r;
                if (row >= m) {
                  for (int64_t kp = 0; kp < kcp; ++kp) dst[kp * kMRb + r] = 0;
                  continue;
                }
                const bf16_t* src = A + row * g.a_row + pc * g.a_col;
                if (g.a_col == 1 && kc % 2 == 0) {
                  for (int64_t kp = 0; kp < kcp; ++kp) std::memcpy(dst + kp * kMRb + r, src + 2 * kp, 4);
                  continue;
                }
                for (int64_t kp = 0; kp < kcp; ++kp) {
                  const int64_t kk = 2 * kp;
                  const uint32_t lo = bits(src, kk * g.a_col);
                  const uint32_t hi = kk + 1 < kc ? bits(src, (kk + 1) * g.a_col) : 0u;
                  dst[kp * kMRb + r] = lo | (hi << 16);
                }
              }
            }
            for (int64_t p = 0; p < panels; ++p) {
              const int nr = static_cast<int>(std::min<int64_t>(32, nc - p * 32));
              for (int64_t ir = 0; ir < mcur; ir += kMRb) {
                const int mr = static_cast<int>(std::min<int64_t>(kMRb, mcur - ir));
                micro_tile_bf16(kcp, apack + ir * kcp, bpack + p * kcp * 64, cacc + (ic + ir) * nc_max + p * 32, nc_max, mr, nr,
                                first, first && last ? D + (ic + ir) * n + jc + p * 32 : nullptr, n);
              }
            }
            if (last && !first) {
              for (int64_t i = ic; i < ic + mcur; ++i) {
                const float* crow = cacc + i * nc_max;
                bf16_t* drow = D + i * n + jc;
                for (int64_t j = 0; j < nc; j += W) storec(drow + j, loadc(crow + j, nc - j), nc - j);
              }
            }
          }
        });
      }
    }
  }
}

// NT bfloat16 GEMM straight from the weight's layout (B is [N, K], K contiguous: the
// F.linear layout), no B packing. The roles of the packed path are swapped: rows of B are
// the broadcast operand, read in place one K pair (one 32-bit word) at a time as the
// {1to16} memory operand of vdpbf16ps, and A, packed once into strips of 32 rows x K pairs,
// is the vector operand. A register tile is 12 columns (B rows) x 32 rows (two vectors), so
// it holds a slice of C^T, accumulated over K blocks in a float buffer laid out column by
// column (ct[col][row]) and transposed to the bfloat16 result after the last K block.
// Packing B cost ~20% of m128 n2112 k7168 (30 MB of weight read, transposed and written
// before any arithmetic); here the weight is read once, by the arithmetic. Used for
// m <= kDirectMaxM, where A (and the C^T buffer) stay small and packing B would be a large
// share of the work.
constexpr int kNBd = 12;                // B rows (result columns) per register tile
constexpr int64_t kKCd = 1024;          // K per block: an A strip block is 64 KB
constexpr int64_t kNCd = 3072;          // result columns per outer block (C^T buffer)
constexpr int64_t kDirectMaxM = 256;
// TILEOPS_NATIVE_CPU_GEMM_NT_DIRECT=0 sends these GEMMs to the packed path (for comparison)
inline bool direct_nt_enabled() {
  static const bool on = [] {
    const char* s = std::getenv("TILEOPS_NATIVE_CPU_GEMM_NT_DIRECT");
    return s == nullptr || std::strcmp(s, "0") != 0;
  }();
  return on;
}

template <int MV>
inline void micro_tile_bf16_nt(int64_t kp_count, const uint32_t* __restrict ap, const bf16_t* __restrict b, int64_t ldb, int nb,
                               float* __restrict ct, int64_t ldct, bool first, const bf16_t* prefetch = nullptr) {
  __m512 acc[kNBd][MV];
#pragma GCC unroll 16
  for (int j = 0; j < kNBd; ++j)
#pragma GCC unroll 2
    for (int v = 0; v < MV; ++v) acc[j][v] = _mm512_setzero_ps();
  const bf16_t* rows[kNBd];
#pragma GCC unroll 16
  for (int j = 0; j < kNBd; ++j) rows[j] = b + std::min(j, nb - 1) * ldb;  // dead columns repeat the last one
  for (int64_t kp = 0; kp < kp_count; ++kp) {
    // the next tile's 12 B rows, one line of each per 16 K pairs (one line of these rows),
    // so that they come from DRAM while this one computes
    if (prefetch != nullptr && kp % 16 == 0) {
#pragma GCC unroll 16
      for (int j = 0; j < kNBd; ++j) _mm_prefetch(reinterpret_cast<const char*>(prefetch + j * ldb + 2 * kp), _MM_HINT_T0);
    }
    __m512bh av[MV];
#pragma GCC unroll 2
    for (int v = 0; v < MV; ++v) av[v] = (__m512bh)_mm512_loadu_si512(ap + kp * 32 + v * 16);
#pragma GCC unroll 16
    for (int j = 0; j < kNBd; ++j) {
      const __m512bh bv = (__m512bh)_mm512_broadcastd_epi32(_mm_loadu_si32(rows[j] + 2 * kp));
#pragma GCC unroll 2
      for (int v = 0; v < MV; ++v) acc[j][v] = _mm512_dpbf16_ps(acc[j][v], av[v], bv);
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < kNBd; ++j) {
    if (j >= nb) break;
    float* col = ct + j * ldct;
#pragma GCC unroll 2
    for (int v = 0; v < MV; ++v) {
      if (first) {
        _mm512_storeu_ps(col + v * 16, acc[j][v]);
      } else {
        _mm512_storeu_ps(col + v * 16, _mm512_add_ps(_mm512_loadu_ps(col + v * 16), acc[j][v]));
      }
    }
  }
}

inline void gemm_bf16_nt_direct(const tnc::GemmArgs& g, int threads) {
  const int64_t m = g.m, n = g.n, k = g.k, kp_total = k / 2;
  const int64_t strips = (m + 31) / 32, m_pad = strips * 32;
  const int64_t nc_max = std::min(kNCd, (n + kNBd - 1) / kNBd * kNBd);
  // A packed for all of K: strip s, K pair p at apack[(s * kp_total + p) * 32 + row % 32]
  uint32_t* apack = reinterpret_cast<uint32_t*>(scratch(static_cast<size_t>(m_pad * kp_total), 1));
  float* ct = scratch(static_cast<size_t>(nc_max * m_pad), 3);
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    const bf16_t* A = static_cast<const bf16_t*>(g.a) + bi * g.a_batch;
    const bf16_t* B = static_cast<const bf16_t*>(g.b) + bi * g.b_batch;
    bf16_t* D = static_cast<bf16_t*>(g.d) + bi * g.d_batch;
    // pack A: 16 rows x 16 pairs per 16x16 register transpose when rows are contiguous in K
    const int64_t pblocks = (kp_total + 255) / 256;
    tnc::parallel_for(strips * 2 * pblocks, 1, threads, [&](int64_t i0, int64_t i1) {
      for (int64_t item = i0; item < i1; ++item) {
        const int64_t s = item / (2 * pblocks), h = (item / pblocks) % 2, pb = item % pblocks;
        const int64_t row0 = s * 32 + h * 16, p0 = pb * 256, p1 = std::min(kp_total, p0 + 256);
        const int live = static_cast<int>(std::clamp<int64_t>(m - row0, 0, 16));
        uint32_t* dst = apack + s * kp_total * 32 + h * 16;
        if (g.a_col == 1) {
          for (int64_t kp0 = p0; kp0 < p1; kp0 += 16) {
            const int rem = static_cast<int>(std::min<int64_t>(16, p1 - kp0));
            const __mmask16 mk = static_cast<__mmask16>((1u << rem) - 1u);
            __m512i rows[16];
            for (int r = 0; r < 16; ++r)
              rows[r] = r < live ? _mm512_maskz_loadu_epi32(mk, A + (row0 + r) * g.a_row + 2 * kp0) : _mm512_setzero_si512();
            transpose16x16_epi32(rows);
            for (int t = 0; t < rem; ++t) _mm512_storeu_si512(dst + (kp0 + t) * 32, rows[t]);
          }
        } else {
          for (int64_t kp = p0; kp < p1; ++kp)
            for (int r = 0; r < 16; ++r) {
              uint32_t word = 0;
              if (r < live) {
                const bf16_t* src = A + (row0 + r) * g.a_row + 2 * kp * g.a_col;
                word = static_cast<uint32_t>(src[0].bits) | (static_cast<uint32_t>(src[g.a_col].bits) << 16);
              }
              dst[kp * 32 + r] = word;
            }
        }
      }
    });
    for (int64_t jc = 0; jc < n; jc += kNCd) {
      const int64_t nc = std::min(kNCd, n - jc);
      const int64_t groups = (nc + kNBd - 1) / kNBd;
      for (int64_t pc = 0; pc < kp_total; pc += kKCd / 2) {
        const int64_t kcp = std::min(kKCd / 2, kp_total - pc);
        const bool first = pc == 0, last = pc + kcp >= kp_total;
        tnc::parallel_for(groups, 1, threads, [&](int64_t g0, int64_t g1) {
          for (int64_t grp = g0; grp < g1; ++grp) {
            const int64_t c0 = grp * kNBd;
            const int nb = static_cast<int>(std::min<int64_t>(kNBd, nc - c0));
            const bf16_t* brows = B + (jc + c0) * g.b_col + 2 * pc;
            float* ctg = ct + c0 * m_pad;
            // the next group's rows (or the next K block's) are prefetched during the first strip
            const bf16_t* next = grp + 1 < groups ? brows + kNBd * g.b_col : nullptr;
            const int next_rows = grp + 1 < groups ? static_cast<int>(std::min<int64_t>(kNBd, nc - c0 - kNBd)) : 0;
            for (int64_t s = 0; s < strips; ++s) {
              const uint32_t* ap = apack + (s * kp_total + pc) * 32;
              const bf16_t* pf = s == 0 && next_rows == kNBd ? next : nullptr;
              if (m - s * 32 > 16) {
                micro_tile_bf16_nt<2>(kcp, ap, brows, g.b_col, nb, ctg + s * 32, m_pad, first, pf);
              } else {
                micro_tile_bf16_nt<1>(kcp, ap, brows, g.b_col, nb, ctg + s * 32, m_pad, first, pf);
              }
            }
            if (!last) continue;
            // C^T columns c0..c0+nb -> result rows: 16 rows x 16 columns per transpose
            for (int64_t r0 = 0; r0 < m; r0 += 16) {
              const int rows_live = static_cast<int>(std::min<int64_t>(16, m - r0));
              __m512i v[16];
              for (int j = 0; j < 16; ++j)
                v[j] = j < nb ? _mm512_castps_si512(_mm512_loadu_ps(ctg + j * m_pad + r0)) : _mm512_setzero_si512();
              transpose16x16_epi32(v);
              const __mmask16 mk = static_cast<__mmask16>((1u << nb) - 1u);
              for (int r = 0; r < rows_live; ++r)
                _mm256_mask_storeu_epi16(D + (r0 + r) * n + jc + c0, mk,
                                         reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_castsi512_ps(v[r]))));
            }
          }
        });
      }
    }
  }
}
#endif

// ---------------------------------------------------------------------------------------
// skinny GEMM (m <= kSkinnyM, the decode GEMV): memory-bound on B, which is streamed once.
// A (a few rows) is widened to float in a zero-padded scratch; B is read in place in its
// own layout, never packed. NT (B rows contiguous along K, the F.linear weight layout):
// NB rows of B at a time, one accumulator per (A row, B row), reduced horizontally once
// per output. NN (B rows contiguous along N): CV vectors of columns at a time over all K.

constexpr int64_t kSkinnyM = 16;

template <int MR>
constexpr int skinny_nt_rows() {
  // accumulators MR x NB within half the register file
  return W >= 16 ? (MR <= 2 ? 8 : MR <= 4 ? 4 : 2) : (W >= 8 ? (MR <= 2 ? 4 : MR <= 4 ? 2 : 1) : (MR <= 4 ? 2 : 1));
}

template <class T, int MR, int NB>
inline void skinny_nt_block(const float* __restrict ap, int64_t kp, const T* __restrict b, int64_t ldb, int64_t k, int nb,
                            float out[MR][NB]) {
  F acc[MR][NB];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) acc[r][j] = S::zero();
  const T* rows[NB];
  for (int j = 0; j < NB; ++j) rows[j] = b + std::min(j, nb - 1) * ldb;  // dead rows repeat the last one
  int64_t kk = 0;
  for (; kk + W <= k; kk += W) {
    F av[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) av[r] = S::load(ap + r * kp + kk);
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      const F bv = S::load(rows[j] + kk);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) acc[r][j] = S::fma(av[r], bv, acc[r][j]);
    }
  }
  if (kk < k) {
    const int c = static_cast<int>(k - kk);
    F av[MR];
    for (int r = 0; r < MR; ++r) av[r] = S::load(ap + r * kp + kk);  // padded with zeros
    for (int j = 0; j < NB; ++j) {
      const F bv = S::load_n(rows[j] + kk, c);
      for (int r = 0; r < MR; ++r) acc[r][j] = S::fma(av[r], bv, acc[r][j]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NB; ++j) out[r][j] = S::reduce_add(acc[r][j]);
}

template <class T, int MR>
void skinny_nt(const float* ap, int64_t kp, const T* B, int64_t ldb, int64_t k, T* D, int64_t n, int64_t j0, int64_t j1) {
  constexpr int NB = skinny_nt_rows<MR>();
  float out[MR][NB];
  for (int64_t j = j0; j < j1; j += NB) {
    const int nb = static_cast<int>(std::min<int64_t>(NB, j1 - j));
    skinny_nt_block<T, MR, NB>(ap, kp, B + j * ldb, ldb, k, nb, out);
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < nb; ++c) D[r * n + j + c] = tnc::from_float<T>(out[r][c]);
  }
}

template <class T, int MR>
void skinny_nn(const float* ap, int64_t kp, const T* B, int64_t ldb, int64_t k, T* D, int64_t n, int64_t c0, int64_t c1) {
  constexpr int CV = W >= 16 ? (MR <= 2 ? 8 : MR <= 4 ? 4 : 2) : (W >= 8 ? (MR <= 2 ? 4 : MR <= 4 ? 2 : 1) : 4);
  for (int64_t j = c0; j < c1; j += CV * W) {
    const int64_t cols = std::min<int64_t>(CV * W, c1 - j);
    F acc[MR][CV];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < CV; ++v) acc[r][v] = S::zero();
    if (cols == CV * W) {
      for (int64_t kk = 0; kk < k; ++kk) {
        const T* brow = B + kk * ldb + j;
        F bv[CV];
#pragma GCC unroll 8
        for (int v = 0; v < CV; ++v) bv[v] = S::load(brow + v * W);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          const F av = S::set1(ap[r * kp + kk]);
#pragma GCC unroll 8
          for (int v = 0; v < CV; ++v) acc[r][v] = S::fma(av, bv[v], acc[r][v]);
        }
      }
    } else {
      for (int64_t kk = 0; kk < k; ++kk) {
        const T* brow = B + kk * ldb + j;
        for (int v = 0; v < CV; ++v) {
          if (v * W >= cols) break;
          const F bv = loadc(brow + v * W, cols - v * W);
          for (int r = 0; r < MR; ++r) acc[r][v] = S::fma(S::set1(ap[r * kp + kk]), bv, acc[r][v]);
        }
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < CV && v * W < cols; ++v) storec(D + r * n + j + v * W, acc[r][v], cols - v * W);
  }
}

template <class T>
void gemm_skinny(const tnc::GemmArgs& g, int threads) {
  const int64_t m = g.m, n = g.n, k = g.k;
  const int64_t kp = (k + W - 1) / W * W;
  const bool nt = g.b_row == 1 && !(g.b_col == 1 && n > 1);  // B[j, :] contiguous along K
  // chunks of at least ~32 KB of B, in whole vector blocks of columns for NN
  const int64_t bytes_per_col = std::max<int64_t>(1, k * static_cast<int64_t>(sizeof(T)));
  const int64_t grain_cols = std::max<int64_t>(nt ? 4 : 4 * W, 32768 / bytes_per_col);
  float* ap = scratch(static_cast<size_t>(m * kp + W), 0);
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    const T* A = static_cast<const T*>(g.a) + bi * g.a_batch;
    const T* B = static_cast<const T*>(g.b) + bi * g.b_batch;
    T* D = static_cast<T*>(g.d) + bi * g.d_batch;
    for (int64_t r = 0; r < m; ++r) {
      float* dst = ap + r * kp;
      const T* src = A + r * g.a_row;
      if (g.a_col == 1) {
        for (int64_t kk = 0; kk < k; kk += W) storec(dst + kk, loadc(src + kk, k - kk), k - kk);
      } else {
        for (int64_t kk = 0; kk < k; ++kk) dst[kk] = tnc::to_float(src[kk * g.a_col]);
      }
      for (int64_t kk = k; kk < kp; ++kk) dst[kk] = 0.f;
    }
    if (nt) {
      const int64_t ldb = g.b_col;
      // more than 8 rows: groups of 8 over sub-blocks of B rows small enough to stay in L2
      const int64_t jb = std::max<int64_t>(8, (int64_t{1} << 18) / bytes_per_col);
      tnc::parallel_for(n, grain_cols, threads, [&](int64_t j0, int64_t j1) {
        for (int64_t jj0 = j0; jj0 < j1; jj0 += jb) {
          const int64_t jj1 = std::min(j1, jj0 + jb);
          for (int64_t r0 = 0; r0 < m; r0 += 8) {
            switch (std::min<int64_t>(8, m - r0)) {
              case 1: skinny_nt<T, 1>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
              case 2: skinny_nt<T, 2>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
              case 3: skinny_nt<T, 3>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
              case 4: skinny_nt<T, 4>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
              case 5: skinny_nt<T, 5>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
              case 6: skinny_nt<T, 6>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
              case 7: skinny_nt<T, 7>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
              default: skinny_nt<T, 8>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
            }
          }
        }
      });
    } else {
      const int64_t ldb = g.b_row;
      const int64_t blocks = (n + W - 1) / W;  // split on whole vectors of columns
      tnc::parallel_for(blocks, std::max<int64_t>(1, grain_cols / W), threads, [&](int64_t b0, int64_t b1) {
        const int64_t c0 = b0 * W, c1 = std::min(n, b1 * W);
        for (int64_t cc0 = c0; cc0 < c1; cc0 += 8 * W) {  // groups of 8 rows share each column block
          const int64_t cc1 = std::min(c1, cc0 + 8 * W);
          for (int64_t r0 = 0; r0 < m; r0 += 8) {
            switch (std::min<int64_t>(8, m - r0)) {
              case 1: skinny_nn<T, 1>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, cc0, cc1); break;
              case 2: skinny_nn<T, 2>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, cc0, cc1); break;
              case 3: skinny_nn<T, 3>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, cc0, cc1); break;
              case 4: skinny_nn<T, 4>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, cc0, cc1); break;
              case 5: skinny_nn<T, 5>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, cc0, cc1); break;
              case 6: skinny_nn<T, 6>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, cc0, cc1); break;
              case 7: skinny_nn<T, 7>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, cc0, cc1); break;
              default: skinny_nn<T, 8>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, cc0, cc1); break;
            }
          }
        }
      });
    }
  }
}

#if defined(TNC_AVX512_BF16_GEMM)
// bfloat16 skinny NT on AVX512-BF16: A and B are both K-contiguous bf16, so consecutive
// elements already form vdpbf16ps's K pairs: 32 products per instruction, no widening.
template <int MR, int NB>
inline void skinny_nt_bf16_block(const uint16_t* __restrict ap, int64_t kp, const uint16_t* __restrict b, int64_t ldb, int64_t k,
                                 int nb, float out[MR][NB]) {
  __m512 acc[MR][NB];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_setzero_ps();
  const uint16_t* rows[NB];
  for (int j = 0; j < NB; ++j) rows[j] = b + std::min(j, nb - 1) * ldb;
  int64_t kk = 0;
  for (; kk + 32 <= k; kk += 32) {
    __m512bh av[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) av[r] = (__m512bh)_mm512_loadu_si512(ap + r * kp + kk);
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      const __m512bh bv = (__m512bh)_mm512_loadu_si512(rows[j] + kk);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], av[r], bv);
    }
  }
  if (kk < k) {
    const __mmask32 mk = static_cast<__mmask32>((uint64_t{1} << (k - kk)) - 1);
    __m512bh av[MR];
    for (int r = 0; r < MR; ++r) av[r] = (__m512bh)_mm512_loadu_si512(ap + r * kp + kk);  // zero-padded
    for (int j = 0; j < NB; ++j) {
      const __m512bh bv = (__m512bh)_mm512_maskz_loadu_epi16(mk, rows[j] + kk);
      for (int r = 0; r < MR; ++r) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], av[r], bv);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NB; ++j) out[r][j] = _mm512_reduce_add_ps(acc[r][j]);
}

template <int MR>
void skinny_nt_bf16(const uint16_t* ap, int64_t kp, const uint16_t* B, int64_t ldb, int64_t k, bf16_t* D, int64_t n, int64_t j0,
                    int64_t j1) {
  constexpr int NB = MR <= 2 ? 8 : MR <= 4 ? 4 : 2;
  float out[MR][NB];
  for (int64_t j = j0; j < j1; j += NB) {
    const int nb = static_cast<int>(std::min<int64_t>(NB, j1 - j));
    skinny_nt_bf16_block<MR, NB>(ap, kp, B + j * ldb, ldb, k, nb, out);
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < nb; ++c) D[r * n + j + c] = tnc::from_float<bf16_t>(out[r][c]);
  }
}

inline void gemm_skinny_bf16_nt(const tnc::GemmArgs& g, int threads) {
  const int64_t m = g.m, n = g.n, k = g.k, ldb = g.b_col;
  const int64_t kp = (k + 31) / 32 * 32;
  const int64_t grain = std::max<int64_t>(4, 16384 / std::max<int64_t>(1, k));
  uint16_t* ap = reinterpret_cast<uint16_t*>(scratch(static_cast<size_t>(m * kp / 2 + 32), 0));
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    const bf16_t* A = static_cast<const bf16_t*>(g.a) + bi * g.a_batch;
    const uint16_t* B = reinterpret_cast<const uint16_t*>(static_cast<const bf16_t*>(g.b) + bi * g.b_batch);
    bf16_t* D = static_cast<bf16_t*>(g.d) + bi * g.d_batch;
    for (int64_t r = 0; r < m; ++r) {
      uint16_t* dst = ap + r * kp;
      const bf16_t* src = A + r * g.a_row;
      if (g.a_col == 1) {
        std::memcpy(dst, src, static_cast<size_t>(k) * 2);
      } else {
        for (int64_t kk = 0; kk < k; ++kk) dst[kk] = src[kk * g.a_col].bits;
      }
      for (int64_t kk = k; kk < kp; ++kk) dst[kk] = 0;
    }
    const int64_t jb = std::max<int64_t>(8, (int64_t{1} << 18) / (2 * std::max<int64_t>(1, k)));
    tnc::parallel_for(n, grain, threads, [&](int64_t j0, int64_t j1) {
      for (int64_t jj0 = j0; jj0 < j1; jj0 += jb) {  // groups of 8 rows over L2-sized blocks of B
        const int64_t jj1 = std::min(j1, jj0 + jb);
        for (int64_t r0 = 0; r0 < m; r0 += 8) {
          switch (std::min<int64_t>(8, m - r0)) {
            case 1: skinny_nt_bf16<1>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
            case 2: skinny_nt_bf16<2>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
            case 3: skinny_nt_bf16<3>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
            case 4: skinny_nt_bf16<4>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
            case 5: skinny_nt_bf16<5>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
            case 6: skinny_nt_bf16<6>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
            case 7: skinny_nt_bf16<7>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
            default: skinny_nt_bf16<8>(ap + r0 * kp, kp, B, ldb, k, D + r0 * n, n, jj0, jj1); break;
          }
        }
      }
    });
  }
}
#endif

// The table's GEMM entry: a skinny product streams B; everything else is blocked.
template <class T>
void gemm_entry(const tnc::GemmArgs& g, int threads) {
  if (g.m <= kSkinnyM && (g.b_row == 1 || g.b_col == 1)) {
#if defined(TNC_AVX512_BF16_GEMM)
    if constexpr (std::is_same_v<T, bf16_t>) {
      if (g.b_row == 1 && (g.b_col != 1 || g.n == 1) && g.k > 0) {
        gemm_skinny_bf16_nt(g, threads);
        return;
      }
    }
#endif
    gemm_skinny<T>(g, threads);
    return;
  }
#if defined(TNC_AVX512_BF16_GEMM)
  if constexpr (std::is_same_v<T, bf16_t>) {
    if (g.b_row == 1 && g.k % 2 == 0 && g.k > 0 && g.m <= kDirectMaxM && direct_nt_enabled()) {
      gemm_bf16_nt_direct(g, threads);
      return;
    }
    gemm_bf16_dot(g, threads);
    return;
  }
#endif
  gemm<T>(g, threads);
}

// ---------------------------------------------------------------------------------------
// attention: blocked online softmax in float32

constexpr int64_t kAttnBQ = 32;
constexpr int64_t kAttnBK = (64 + W - 1) / W * W;

template <class T>
void attention(const tnc::AttentionArgs& a, int threads) {
  const int64_t D = a.head_dim, Dp = (D + W - 1) / W * W, G = a.heads / a.heads_kv;
  const int64_t qblocks = (a.seq_q + kAttnBQ - 1) / kAttnBQ;
  const int64_t items = a.batch * a.heads_kv * qblocks;
  const int64_t q_tok = a.heads * D, kv_tok = a.heads_kv * D;
  tnc::parallel_for(items, 1, threads, [&](int64_t i0, int64_t i1) {
    const int64_t rows_max = G * kAttnBQ;
    float* Q = scratch(static_cast<size_t>(rows_max * Dp + rows_max * Dp + rows_max * kAttnBK + 2 * rows_max), 0);
    float* O = Q + rows_max * Dp;
    float* P = O + rows_max * Dp;
    float* Mx = P + rows_max * kAttnBK;
    float* L = Mx + rows_max;
    float* Kt = scratch(static_cast<size_t>(D * kAttnBK), 1);
    float* V = scratch(static_cast<size_t>(kAttnBK * Dp), 2);
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t qb = item % qblocks, hkv = (item / qblocks) % a.heads_kv, b = item / (qblocks * a.heads_kv);
      const int64_t q0 = qb * kAttnBQ, bq = std::min(kAttnBQ, a.seq_q - q0);
      const int64_t rows = G * bq;
      for (int64_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < bq; ++i) {
          const T* src = static_cast<const T*>(a.q) + (b * a.seq_q + q0 + i) * q_tok + (hkv * G + g) * D;
          float* dst = Q + (g * bq + i) * Dp;
          for (int64_t d = 0; d < D; ++d) dst[d] = tnc::to_float(src[d]) * a.scale;
          for (int64_t d = D; d < Dp; ++d) dst[d] = 0.f;
        }
      for (int64_t r = 0; r < rows; ++r) {
        Mx[r] = -std::numeric_limits<float>::infinity();
        L[r] = 0.f;
        for (int64_t d = 0; d < Dp; ++d) O[r * Dp + d] = 0.f;
      }
      // causal: top-left aligned, key j is visible to query i when j <= i
      const int64_t kv_end = a.causal ? std::min(a.seq_kv, q0 + bq) : a.seq_kv;
      for (int64_t k0 = 0; k0 < kv_end; k0 += kAttnBK) {
        const int64_t bk = std::min(kAttnBK, kv_end - k0);
        for (int64_t j = 0; j < kAttnBK; ++j) {
          float* vdst = V + j * Dp;
          if (j >= bk) {
            for (int64_t d = 0; d < D; ++d) Kt[d * kAttnBK + j] = 0.f;
            for (int64_t d = 0; d < Dp; ++d) vdst[d] = 0.f;
            continue;
          }
          const int64_t tok = (b * a.seq_kv + k0 + j) * kv_tok + hkv * D;
          const T* ks = static_cast<const T*>(a.k) + tok;
          const T* vs = static_cast<const T*>(a.v) + tok;
          for (int64_t d = 0; d < D; ++d) Kt[d * kAttnBK + j] = tnc::to_float(ks[d]);
          for (int64_t d = 0; d < D; d += W) storec(vdst + d, loadc(vs + d, D - d), D - d);
          for (int64_t d = D; d < Dp; ++d) vdst[d] = 0.f;
        }
        // scores, four query rows at a time
        for (int64_t r0 = 0; r0 < rows; r0 += 4) {
          const float* q[4];
          for (int i = 0; i < 4; ++i) q[i] = Q + std::min(r0 + i, rows - 1) * Dp;
          for (int64_t c = 0; c < kAttnBK; c += W) {
            F s0 = S::zero(), s1 = S::zero(), s2 = S::zero(), s3 = S::zero();
            for (int64_t d = 0; d < D; ++d) {
              const F kv = S::load(Kt + d * kAttnBK + c);
              s0 = S::fma(S::set1(q[0][d]), kv, s0);
              s1 = S::fma(S::set1(q[1][d]), kv, s1);
              s2 = S::fma(S::set1(q[2][d]), kv, s2);
              s3 = S::fma(S::set1(q[3][d]), kv, s3);
            }
            const F s[4] = {s0, s1, s2, s3};
            for (int i = 0; i < 4 && r0 + i < rows; ++i) S::store(P + (r0 + i) * kAttnBK + c, s[i]);
          }
        }
        // online softmax per row
        for (int64_t r = 0; r < rows; ++r) {
          float* p = P + r * kAttnBK;
          const int64_t qi = q0 + r % bq;
          const int64_t visible = a.causal ? std::min(bk, qi - k0 + 1) : bk;
          for (int64_t j = std::max<int64_t>(visible, 0); j < kAttnBK; ++j) p[j] = -std::numeric_limits<float>::infinity();
          F row_max = S::load(p);
          for (int64_t j = W; j < kAttnBK; j += W) row_max = S::max(row_max, S::load(p + j));
          const float mx = std::max(Mx[r], S::reduce_max(row_max));
          if (mx == -std::numeric_limits<float>::infinity()) {  // nothing visible yet in this row
            for (int64_t j = 0; j < kAttnBK; ++j) p[j] = 0.f;
            continue;
          }
          const float corr = std::exp(Mx[r] - mx);
          Mx[r] = mx;
          const F m = S::set1(mx);
          F sum = S::zero();
          for (int64_t j = 0; j < kAttnBK; j += W) {
            const F e = vexp(S::sub(S::load(p + j), m));
            S::store(p + j, e);
            sum = S::add(sum, e);
          }
          L[r] = L[r] * corr + S::reduce_add(sum);
          if (corr != 1.f) {
            const F vc = S::set1(corr);
            float* o = O + r * Dp;
            for (int64_t d = 0; d < Dp; d += W) S::store(o + d, S::mul(S::load(o + d), vc));
          }
        }
        // O += P V, four rows at a time
        for (int64_t r0 = 0; r0 < rows; r0 += 4) {
          const int64_t rn = std::min<int64_t>(4, rows - r0);
          const float* p[4];
          for (int i = 0; i < 4; ++i) p[i] = P + std::min(r0 + i, rows - 1) * kAttnBK;
          for (int64_t d = 0; d < Dp; d += W) {
            F o0 = S::load(O + r0 * Dp + d);
            F o1 = rn > 1 ? S::load(O + (r0 + 1) * Dp + d) : S::zero();
            F o2 = rn > 2 ? S::load(O + (r0 + 2) * Dp + d) : S::zero();
            F o3 = rn > 3 ? S::load(O + (r0 + 3) * Dp + d) : S::zero();
            for (int64_t j = 0; j < bk; ++j) {
              const F vv = S::load(V + j * Dp + d);
              o0 = S::fma(S::set1(p[0][j]), vv, o0);
              o1 = S::fma(S::set1(p[1][j]), vv, o1);
              o2 = S::fma(S::set1(p[2][j]), vv, o2);
              o3 = S::fma(S::set1(p[3][j]), vv, o3);
            }
            S::store(O + r0 * Dp + d, o0);
            if (rn > 1) S::store(O + (r0 + 1) * Dp + d, o1);
            if (rn > 2) S::store(O + (r0 + 2) * Dp + d, o2);
            if (rn > 3) S::store(O + (r0 + 3) * Dp + d, o3);
          }
        }
      }
      for (int64_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < bq; ++i) {
          const int64_t r = g * bq + i;
          const F inv = S::set1(L[r] > 0.f ? 1.f / L[r] : 0.f);
          T* dst = static_cast<T*>(a.o) + (b * a.seq_q + q0 + i) * q_tok + (hkv * G + g) * D;
          for (int64_t d = 0; d < D; d += W) storec(dst + d, S::mul(S::load(O + r * Dp + d), inv), D - d);
        }
    }
  });
}

#if defined(TNC_AVX512_BF16_GEMM)
// Decode scores for bfloat16 on AVX512-BF16: q (unscaled, exact in bf16) and K rows are
// both D-contiguous bf16, so vdpbf16ps takes 32 products per instruction with no widening.
// acc[jj][i] gets the 16-lane partial dot product of key jj and head i.
inline void decode_scores_bf16(const uint16_t* const qr[4], const uint16_t* const kr[4], int64_t D, __m512 acc[4][4]) {
#pragma GCC unroll 4
  for (int jj = 0; jj < 4; ++jj)
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) acc[jj][i] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 32) {
    const __mmask32 mk = D - d >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << (D - d)) - 1);
    __m512bh qv[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) qv[i] = (__m512bh)_mm512_loadu_si512(qr[i] + d);  // zero-padded
#pragma GCC unroll 4
    for (int jj = 0; jj < 4; ++jj) {
      const __m512bh kv = (__m512bh)_mm512_maskz_loadu_epi16(mk, kr[jj] + d);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) acc[jj][i] = _mm512_dpbf16_ps(acc[jj][i], qv[i], kv);
    }
  }
}
#endif

// Decode: one query per sequence. Memory-bound on K and V, which are streamed once: a
// task owns a range of cached positions of one sequence and walks it in blocks of W
// tokens over every KV head (the cache is [B, N, Hkv, D], so a block is one contiguous
// run; walking one KV head alone would touch a new page every few rows). Every query head
// of a group is served by the same load of a K or V row. The G x W dot products of a
// block are finished by one transpose-add per query head (no horizontal reduction per
// key), the softmax update is vectorised over the block's keys, and P V runs over
// register blocks of (4 heads x 4 vectors of D). The positions are split when the batch
// alone cannot keep every thread busy; the splits are merged at the end.
template <class T>
void attention_decode(const tnc::AttentionArgs& a, int threads) {
  const int64_t D = a.head_dim, Dp = (D + W - 1) / W * W, G = a.heads / a.heads_kv, N = a.seq_kv, H = a.heads;
  const int64_t dfull = D / W * W;
  const int64_t groups = a.batch * a.heads_kv;
#if defined(TNC_AVX512_BF16_GEMM)
  constexpr bool kBfDot = std::is_same_v<T, bf16_t>;
#else
  constexpr bool kBfDot = false;
#endif
  int64_t splits = 1;
  if (a.batch < 4 * threads)
    splits = std::max<int64_t>(1, std::min<int64_t>((4 * threads + a.batch - 1) / a.batch, N * groups / (256 * a.batch)));
  const int64_t span = (N + splits - 1) / std::max<int64_t>(splits, 1);
  const int64_t part_stride = Dp + 2;
  std::vector<float> parts(static_cast<size_t>(groups * splits * G * part_stride));
  const int64_t kv_tok = a.heads_kv * D;
  tnc::parallel_for(a.batch * splits, 1, threads, [&, D, Dp, G, N, H, dfull, kv_tok, splits, span](int64_t i0, int64_t i1) {
    float* Q = scratch(static_cast<size_t>(2 * H * Dp + 2 * H + G * W + G * W * W), 0);
    float* O = Q + H * Dp;
    float* mx = O + H * Dp;
    float* l = mx + H;
    float* P = l + H;    // [G][W] probabilities of the current block and KV head
    float* Acc = P + G * W;  // [G][W keys][W lanes] partial dot products
    const int64_t Db = (D + 31) / 32 * 32;
    uint16_t* Qb = kBfDot ? reinterpret_cast<uint16_t*>(scratch(static_cast<size_t>(H * Db / 2 + 16), 1)) : nullptr;
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t b = item / splits, sp = item % splits;
      const int64_t n0 = sp * span, n1 = std::min(N, n0 + span);
      for (int64_t h = 0; h < H; ++h) {
        const T* src = static_cast<const T*>(a.q) + (b * H + h) * D;
        for (int64_t d = 0; d < Dp; ++d) Q[h * Dp + d] = d < D ? tnc::to_float(src[d]) * a.scale : 0.f;
        for (int64_t d = 0; d < Dp; ++d) O[h * Dp + d] = 0.f;
        if constexpr (kBfDot)
          for (int64_t d = 0; d < Db; ++d) Qb[h * Db + d] = d < D ? reinterpret_cast<const uint16_t*>(src)[d] : uint16_t{0};
        mx[h] = -std::numeric_limits<float>::infinity();
        l[h] = 0.f;
      }
      for (int64_t k0 = n0; k0 < n1; k0 += W) {
        const int bk = static_cast<int>(std::min<int64_t>(W, n1 - k0));
        if (bk < W)  // lanes of dead keys are masked after the transpose-add, but must be finite
          for (int64_t i = 0; i < G * W * W; ++i) Acc[i] = 0.f;
        for (int64_t hkv = 0; hkv < a.heads_kv; ++hkv) {
          const T* kbase = static_cast<const T*>(a.k) + (b * N + k0) * kv_tok + hkv * D;
          const T* vbase = static_cast<const T*>(a.v) + (b * N + k0) * kv_tok + hkv * D;
          const float* Qg = Q + hkv * G * Dp;
          float* Og = O + hkv * G * Dp;
          if (k0 + W < n1) {  // the next block of this KV head into L2 while this one computes
            const int nb = static_cast<int>(std::min<int64_t>(W, n1 - k0 - W));
            for (int j = 0; j < nb; ++j)
              for (int64_t byte = 0; byte < D * static_cast<int64_t>(sizeof(T)); byte += 64) {
                __builtin_prefetch(reinterpret_cast<const char*>(kbase + (W + j) * kv_tok) + byte, 0, 2);
                __builtin_prefetch(reinterpret_cast<const char*>(vbase + (W + j) * kv_tok) + byte, 0, 2);
              }
          }
          // scores: register blocks of 4 keys x 4 query heads (16 independent FMA chains;
          // one K row load serves four heads). Dead keys and heads repeat the last live one:
          // dead keys' lanes are masked below, dead heads are not stored.
          for (int j0 = 0; j0 < bk; j0 += 4) {
            const T* kr[4];
#pragma GCC unroll 4
            for (int jj = 0; jj < 4; ++jj) kr[jj] = kbase + std::min(j0 + jj, bk - 1) * kv_tok;
            for (int64_t g0 = 0; g0 < G; g0 += 4) {
              const int gn = static_cast<int>(std::min<int64_t>(4, G - g0));
              const float* qr[4];
#pragma GCC unroll 4
              for (int i = 0; i < 4; ++i) qr[i] = Qg + (g0 + std::min(i, gn - 1)) * Dp;
              F acc[4][4];
#if defined(TNC_AVX512_BF16_GEMM)
              if constexpr (kBfDot) {
                const uint16_t* qb[4];
                const uint16_t* kb[4];
                for (int i = 0; i < 4; ++i) qb[i] = Qb + (hkv * G + g0 + std::min(i, gn - 1)) * Db;
                for (int jj = 0; jj < 4; ++jj) kb[jj] = reinterpret_cast<const uint16_t*>(kr[jj]);
                decode_scores_bf16(qb, kb, D, acc);
              } else
#endif
              {
#pragma GCC unroll 4
              for (int jj = 0; jj < 4; ++jj)
#pragma GCC unroll 4
                for (int i = 0; i < 4; ++i) acc[jj][i] = S::zero();
              for (int64_t d = 0; d < dfull; d += W) {
                F qv[4];
#pragma GCC unroll 4
                for (int i = 0; i < 4; ++i) qv[i] = S::load(qr[i] + d);
#pragma GCC unroll 4
                for (int jj = 0; jj < 4; ++jj) {
                  const F kv = S::load(kr[jj] + d);
#pragma GCC unroll 4
                  for (int i = 0; i < 4; ++i) acc[jj][i] = S::fma(qv[i], kv, acc[jj][i]);
                }
              }
              if (dfull < D) {
                const int c = static_cast<int>(D - dfull);
                F qv[4];
#pragma GCC unroll 4
                for (int i = 0; i < 4; ++i) qv[i] = S::load(qr[i] + dfull);  // zero-padded
#pragma GCC unroll 4
                for (int jj = 0; jj < 4; ++jj) {
                  const F kv = S::load_n(kr[jj] + dfull, c);
#pragma GCC unroll 4
                  for (int i = 0; i < 4; ++i) acc[jj][i] = S::fma(qv[i], kv, acc[jj][i]);
                }
              }
              }
#pragma GCC unroll 4
              for (int jj = 0; jj < 4; ++jj)
#pragma GCC unroll 4
                for (int i = 0; i < 4; ++i)
                  if (i < gn && j0 + jj < W) S::store(Acc + ((g0 + i) * W + j0 + jj) * W, acc[jj][i]);
            }
          }
          // online softmax over the block, vectorised over its keys
          for (int64_t g = 0; g < G; ++g) {
            const int64_t h = hkv * G + g;
            F acc_rows[W];
            for (int j = 0; j < W; ++j) acc_rows[j] = S::load(Acc + (g * W + j) * W);
            F sc = S::transpose_add(acc_rows);
            if constexpr (kBfDot) sc = S::mul(sc, S::set1(a.scale));
            if (bk < W) {
              alignas(64) float lanes[W];
              S::store(lanes, sc);
              sc = S::load_n(static_cast<const float*>(lanes), bk, -std::numeric_limits<float>::infinity());
            }
            const float m = std::max(mx[h], S::reduce_max(sc));
            const float corr = mx[h] == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(mx[h] - m);
            mx[h] = m;
            const F p = vexp(S::sub(sc, S::set1(m)));
            S::store(P + g * W, p);
            l[h] = l[h] * corr + S::reduce_add(p);
            if (corr != 1.f) {
              const F vc = S::set1(corr);
              float* o = Og + g * Dp;
              for (int64_t d = 0; d < Dp; d += W) S::store(o + d, S::mul(S::load(o + d), vc));
            }
          }
          // O += P V: register blocks of 4 heads x 4 vectors of D (constant indices only, so
          // the block stays in registers; dead heads repeat the last live one)
          for (int64_t d0 = 0; d0 < Dp; d0 += 4 * W) {
            const int dv = static_cast<int>(std::min<int64_t>(4, (Dp - d0) / W));
            for (int64_t g0 = 0; g0 < G; g0 += 4) {
              const int gn = static_cast<int>(std::min<int64_t>(4, G - g0));
              const float* prow[4];
              float* orow[4];
              F acc[4][4];
#pragma GCC unroll 4
              for (int i = 0; i < 4; ++i) {
                const int64_t g = g0 + std::min(i, gn - 1);
                prow[i] = P + g * W;
                orow[i] = Og + g * Dp + d0;
#pragma GCC unroll 4
                for (int v = 0; v < 4; ++v) acc[i][v] = v < dv ? S::load(orow[i] + v * W) : S::zero();
              }
              for (int j = 0; j < bk; ++j) {
                const T* vr = vbase + j * kv_tok + d0;
                F vv[4];
#pragma GCC unroll 4
                for (int v = 0; v < 4; ++v) vv[v] = v < dv ? loadc(vr + v * W, D - d0 - v * W) : S::zero();
#pragma GCC unroll 4
                for (int i = 0; i < 4; ++i) {
                  const F pj = S::set1(prow[i][j]);
#pragma GCC unroll 4
                  for (int v = 0; v < 4; ++v) acc[i][v] = S::fma(pj, vv[v], acc[i][v]);
                }
              }
#pragma GCC unroll 4
              for (int i = 0; i < 4; ++i)
                if (i < gn)
#pragma GCC unroll 4
                  for (int v = 0; v < 4; ++v)
                    if (v < dv) S::store(orow[i] + v * W, acc[i][v]);
            }
          }
        }
      }
      for (int64_t h = 0; h < H; ++h) {
        const int64_t grp = b * a.heads_kv + h / G, g = h % G;
        float* part = parts.data() + ((grp * splits + sp) * G + g) * part_stride;
        part[0] = mx[h];
        part[1] = l[h];
        for (int64_t d = 0; d < Dp; ++d) part[2 + d] = O[h * Dp + d];
      }
    }
  });
  // merge the splits of each (sequence, head)
  tnc::parallel_for(groups * G, 64, threads, [&](int64_t h0, int64_t h1) {
    for (int64_t hg = h0; hg < h1; ++hg) {
      const int64_t grp = hg / G, g = hg % G;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t sp = 0; sp < splits; ++sp) m = std::max(m, parts[static_cast<size_t>(((grp * splits + sp) * G + g) * part_stride)]);
      float acc[1024];
      float l = 0.f;
      for (int64_t d = 0; d < Dp; ++d) acc[d] = 0.f;
      for (int64_t sp = 0; sp < splits; ++sp) {
        const float* part = parts.data() + ((grp * splits + sp) * G + g) * part_stride;
        if (part[1] == 0.f) continue;
        const float w = std::exp(part[0] - m);
        l += part[1] * w;
        for (int64_t d = 0; d < Dp; ++d) acc[d] += part[2 + d] * w;
      }
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int64_t b = grp / a.heads_kv, hkv = grp % a.heads_kv;
      T* dst = static_cast<T*>(a.o) + (b * a.heads + hkv * G + g) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = tnc::from_float<T>(acc[d] * inv);
    }
  });
}

// ---------------------------------------------------------------------------------------

inline tnc::Table make_table() {
  tnc::Table t{};
  t.name = S::kName;
#define TNC_FILL3(field, fn) \
  t.field[0] = fn<float>;    \
  t.field[1] = fn<half_t>;   \
  t.field[2] = fn<bf16_t>
  TNC_FILL3(rms_norm, rms_norm);
  TNC_FILL3(fused_add_rms_norm, fused_add_rms_norm);
  TNC_FILL3(layer_norm, layer_norm);
  TNC_FILL3(group_norm, group_norm);
  TNC_FILL3(softmax, softmax);
  TNC_FILL3(unary, unary);
  TNC_FILL3(silu_and_mul, silu_and_mul);
  TNC_FILL3(reduce, reduce);
  TNC_FILL3(clamp, clamp);
  TNC_FILL3(rope, rope);
  TNC_FILL3(gemm, gemm_entry);
  TNC_FILL3(attention, attention);
  TNC_FILL3(attention_decode, attention_decode);
#undef TNC_FILL3
  t.binary[0] = binary_float<float>;
  t.binary[1] = binary_float<half_t>;
  t.binary[2] = binary_float<bf16_t>;
  t.binary[3] = binary_bool;
  t.binary[4] = binary_int<uint8_t>;
  t.binary[5] = binary_int<int8_t>;
  t.binary[6] = binary_int<int16_t>;
  t.binary[7] = binary_int<int32_t>;
  t.binary[8] = binary_int<int64_t>;
  return t;
}
