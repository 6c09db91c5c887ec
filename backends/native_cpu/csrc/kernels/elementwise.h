// The elementwise family: activations (unary, in place or not), gated activations
// act(x[:, :n]) * x[:, n:], and broadcasting add, mul (every dtype) and clamp. Included
// inside a per-ISA namespace by kernels/families.h (after kernels/common.h); marshalling
// in bind/elementwise.cc.
//
// An activation is a struct below with its name (its member of _C.Activation), the unary
// kernel's grain and apply<Fast>(v) (Fast: float16/bfloat16 results, which tolerate the
// fast exp and reciprocal). A new activation: its struct, appended to `Activations`. A new
// gated op over an existing activation: the activation appended to `GatedActivations`.
// Nothing outside this file changes for either (the builder table aside).
#pragma once
// (no includes here on purpose: see kernels/common.h)

// ---------------------------------------------------------------------------------------
// activations

// x * sigmoid(x) = x / (1 + e^-x), with a reciprocal instead of the division (1/inf = 0:
// far below zero the result is -0, as the exact value underflows)
template <bool Fast = false>
inline F vsilu(F x) {
  return S::mul(x, vrcp<Fast>(S::add(S::set1(1.f), vexp_neg<Fast>(x))));
}

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

// kGrain: elements per task of the unary kernel; cheap activations override it.
struct ActivationDefaults {
  static constexpr int64_t kGrain = 8192;
};
struct Silu : ActivationDefaults {
  static constexpr const char* kName = "silu";
  template <bool Fast>
  static F apply(F v) {
    return vsilu<Fast>(v);
  }
};
struct Gelu : ActivationDefaults {
  static constexpr const char* kName = "gelu";
  template <bool Fast>
  static F apply(F v) {
    return vgelu<Fast>(v);
  }
};
struct GeluTanh : ActivationDefaults {
  static constexpr const char* kName = "gelu_tanh";
  template <bool Fast>
  static F apply(F v) {
    return vgelu_tanh<Fast>(v);
  }
};
struct Relu {
  static constexpr const char* kName = "relu";
  static constexpr int64_t kGrain = 65536;
  template <bool Fast>
  static F apply(F v) {
    return S::max(S::zero(), v);
  }
};

template <class... A>
struct ActivationList {};

// Every activation, in the order of their tnc::Activation values: a new one goes last.
using Activations = ActivationList<Silu, Gelu, GeluTanh, Relu>;
// The activations the gated kernel is compiled for (SiluAndMul).
using GatedActivations = ActivationList<Silu, GeluTanh, Gelu>;

template <class... A, class Fn>
inline void for_each_activation(ActivationList<A...>, Fn fn) {
  (fn.template operator()<A>(), ...);
}

template <class A, class... All>
constexpr int position_in(ActivationList<All...>) {
  int i = 0, at = -1;
  ((at = std::is_same_v<A, All> ? i : at, ++i), ...);
  return at;
}
template <class A>
constexpr int kActivationValue = position_in<A>(Activations{});

template <class T, class Act>
inline F unary_apply(F v) {
  return Act::template apply<kHalfT<T>>(v);
}

// ---------------------------------------------------------------------------------------
// unary and gated

// Stream: the result is written with streaming stores (the range is peeled to their
// alignment first), for results far larger than the caches.
template <class T, class Act, bool Stream = false>
void unary_range(const T* x, T* y, int64_t n) {
  int64_t i = 0;
  if constexpr (Stream) {
    const int64_t pe = std::min<int64_t>(n, to_stream_alignment(y));
    for (; i < pe; i += W) storec(y + i, unary_apply<T, Act>(loadc(x + i, pe - i)), std::min<int64_t>(W, pe - i));
    i = pe;
  }
  for (; i + 2 * W <= n; i += 2 * W) {
    F a, b;
    load_pair(x + i, a, b);
    store_pair_full<Stream>(y + i, unary_apply<T, Act>(a), unary_apply<T, Act>(b));
  }
  for (; i < n; i += W) {
    const int64_t c = n - i;
    storec(y + i, unary_apply<T, Act>(loadc(x + i, c)), c);
  }
}

template <class T, class Act>
void unary(const tnc::UnaryArgs& a, int threads) {
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.out);
  const bool stream = x != y && large_enough_to_stream<T>(a.numel);
  tnc::parallel_for(a.numel, Act::kGrain, threads, [&](int64_t b, int64_t e) {
    if (stream) {
      unary_range<T, Act, true>(x + b, y + b, e - b);
      S::stream_fence();
      return;
    }
    unary_range<T, Act>(x + b, y + b, e - b);
  });
}

template <class T, class Act>
void gated(const tnc::GatedArgs& a, int threads) {
  const int64_t n = a.n;
  // split columns too, so that one long row still uses every thread
  const int64_t col_block = std::max<int64_t>(2 * W, ((n + 3) / 4 + 2 * W - 1) / (2 * W) * (2 * W));
  const int64_t blocks = (n + col_block - 1) / col_block;
  // A result much larger than the caches goes out with streaming stores (no read for
  // ownership of lines that are overwritten whole); a small one stays in cache for the
  // next op.
  with_stream(large_enough_to_stream<T>(a.rows * n), [&](auto stream) {
    constexpr bool St = decltype(stream)::value;
    tnc::parallel_for(a.rows * blocks, std::max<int64_t>(1, 8192 / col_block), threads, [&](int64_t i0, int64_t i1) {
      for (int64_t item = i0; item < i1; ++item) {
        const int64_t r = item / blocks, c0 = (item % blocks) * col_block, c1 = std::min(n, c0 + col_block);
        const T* gate = static_cast<const T*>(a.x) + r * 2 * n;
        const T* val = gate + n;
        T* y = static_cast<T*>(a.out) + r * n;
        const auto one = [&](int64_t i, int64_t c) {
          storec(y + i, S::mul(unary_apply<T, Act>(loadc(gate + i, c)), loadc(val + i, c)), c);
        };
        int64_t i = c0;
        if constexpr (St) {
          const int64_t e = std::min(c1, c0 + to_stream_alignment(y + c0));
          for (; i < e; i += W) one(i, std::min<int64_t>(W, e - i));
          i = e;
        }
        for (; i + 2 * W <= c1; i += 2 * W) {
          F ga, gb, va, vb;
          load_pair(gate + i, ga, gb);
          load_pair(val + i, va, vb);
          store_pair_full<St>(y + i, S::mul(unary_apply<T, Act>(ga), va), S::mul(unary_apply<T, Act>(gb), vb));
        }
        for (; i < c1; i += W) one(i, c1 - i);
      }
      if constexpr (St) S::stream_fence();
    });
  });
}

// ---------------------------------------------------------------------------------------
// broadcasting binary ops and clamp

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
  int64_t total = 1;
  for (int d = 0; d <= last; ++d) total *= a.sizes[d];
  // broadcast_for's pieces start at multiples of the last axis or of 32768
  with_stream(streams<T, 1>(out, total, a.sizes[last]), [&](auto stream) {
    constexpr bool St = decltype(stream)::value;
    broadcast_for(a, threads, 32768, [&](const int64_t* off, int64_t out_at, int64_t c0, int64_t count) {
      const T* xa = pa + off[0] + (a_vec ? c0 : 0);
      const T* xb = pb + off[1] + (b_vec ? c0 : 0);
      T* y = out + out_at;
      const F sa = S::set1(tnc::to_float(*xa)), sb = S::set1(tnc::to_float(*xb)), va = S::set1(alpha);
      const auto op = [&](F u, F v) { return mul ? S::mul(u, v) : (scaled ? S::fma(v, va, u) : S::add(u, v)); };
      int64_t i = 0;
      for (; i + W <= count; i += W)
        store_full<St>(y + i, op(a_vec ? S::load(xa + i) : sa, b_vec ? S::load(xb + i) : sb));
      if (i < count) {
        const int64_t c = count - i;
        storec(y + i, op(a_vec ? loadc(xa + i, c) : sa, b_vec ? loadc(xb + i, c) : sb), c);
      }
      if constexpr (St) S::stream_fence();
    });
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

inline void register_elementwise(tnc::KernelTable& t) {
  for_each_activation(Activations{}, [&]<class A>() { t.add_member("Activation", A::kName); });
  for_each_float_type([&]<class T>(tnc::DType d) {
    for_each_activation(Activations{},
                        [&]<class A>() { t.add<tnc::UnaryArgs>("unary", d, unary<T, A>, kActivationValue<A>); });
    for_each_activation(GatedActivations{},
                        [&]<class A>() { t.add<tnc::GatedArgs>("gated", d, gated<T, A>, kActivationValue<A>); });
    t.add<tnc::BroadcastArgs>("binary", d, binary_float<T>);
    t.add<tnc::BroadcastArgs>("clamp", d, clamp<T>);
  });
  t.add<tnc::BroadcastArgs>("binary", tnc::DType::b8, binary_bool);
  t.add<tnc::BroadcastArgs>("binary", tnc::DType::u8, binary_int<uint8_t>);
  t.add<tnc::BroadcastArgs>("binary", tnc::DType::i8, binary_int<int8_t>);
  t.add<tnc::BroadcastArgs>("binary", tnc::DType::i16, binary_int<int16_t>);
  t.add<tnc::BroadcastArgs>("binary", tnc::DType::i32, binary_int<int32_t>);
  t.add<tnc::BroadcastArgs>("binary", tnc::DType::i64, binary_int<int64_t>);
}
