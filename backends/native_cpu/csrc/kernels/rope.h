// The rope family: rotary position embedding from float cos/sin tables (positions 0..S-1,
// or one position id per token), NeoX half split or adjacent pairs. Included inside a
// per-ISA namespace by kernels/families.h (after kernels/common.h); marshalling in
// bind/rope.cc.
#pragma once
// (no includes here on purpose: see kernels/common.h)

// NeoX: y[c] = x[c] cos[c] - x[c + half] sin[c], y[c + half] = x[c + half] cos[c] + x[c] sin[c].
template <bool St, class T>
inline void rotate_neox(const T* x, T* y, const float* cs, const float* sn, int64_t half) {
  for (int64_t i = 0; i < half; i += W) {
    const int64_t c = half - i;
    const F x1 = loadc(x + i, c), x2 = loadc(x + half + i, c);
    const F co = loadc(cs + i, c), si = loadc(sn + i, c);
    if constexpr (St) {  // half is a multiple of W: whole vectors only
      S::stream(y + i, S::fnma(x2, si, S::mul(x1, co)));
      S::stream(y + half + i, S::fma(x1, si, S::mul(x2, co)));
    } else {
      storec(y + i, S::fnma(x2, si, S::mul(x1, co)), c);
      storec(y + half + i, S::fma(x1, si, S::mul(x2, co)), c);
    }
  }
}

// Adjacent pairs: y[2k] = x[2k] cos[k] - x[2k+1] sin[k], y[2k+1] = x[2k+1] cos[k] + x[2k] sin[k],
// for 2k < rot. One vector of the tables (W angles) serves two vectors of x (2W channels):
// each half is spread over lane pairs, and x * cos -/+ swapped(x) * sin is one fmaddsub.
// One lane holds no pair: W == 1 takes the scalar pair loop.
template <bool St, class T>
inline void rotate_pairs(const T* x, T* y, const float* cs, const float* sn, int64_t rot) {
  if constexpr (W == 1) {
    for (int64_t k = 0; k < rot / 2; ++k) {
      const float x0 = tnc::to_float(x[2 * k]), x1 = tnc::to_float(x[2 * k + 1]);
      y[2 * k] = tnc::from_float<T>(std::fma(x0, cs[k], -x1 * sn[k]));
      y[2 * k + 1] = tnc::from_float<T>(std::fma(x1, cs[k], x0 * sn[k]));
    }
  } else {
    const auto pairs = [](F v, F co, F si) { return S::fmaddsub(v, co, S::mul(S::swap_pairs(v), si)); };
    for (int64_t i = 0; i < rot; i += 2 * W) {
      const int64_t c = rot - i;  // channels left: even, so a partial vector holds whole pairs
      const F co = loadc(cs + i / 2, c / 2), si = loadc(sn + i / 2, c / 2);
      const F lo = pairs(loadc(x + i, c), S::dup_pairs_lo(co), S::dup_pairs_lo(si));
      if constexpr (St) {  // rot is a multiple of W: whole vectors only
        S::stream(y + i, lo);
      } else {
        storec(y + i, lo, c);
      }
      if (c > W) {
        const F hi = pairs(loadc(x + i + W, c - W), S::dup_pairs_hi(co), S::dup_pairs_hi(si));
        if constexpr (St) {
          S::stream(y + i + W, hi);
        } else {
          storec(y + i + W, hi, c - W);
        }
      }
    }
  }
}

template <class T, tnc::RopeRotation R>
void rope(const tnc::RopeArgs& a, int threads) {
  const int64_t half = a.rotary_dim / 2, d = a.head_dim, heads = a.heads;
  constexpr bool kPairs = R == tnc::RopeRotation::pairs;
  // whole-vector stores land at multiples of `half` (NeoX) or of W (pairs) within each
  // row, and rows of d keep that alignment
  const bool stream = kPairs ? streams<T, 1>(a.out, a.tokens * heads * d, a.rotary_dim) && d % W == 0
                             : streams<T, 1>(a.out, a.tokens * heads * d, half) && d % half == 0;
  with_stream(stream, [&](auto stream_kind) {
    constexpr bool St = decltype(stream_kind)::value;
    tnc::parallel_for(a.tokens, row_grain(heads * d), threads, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        int64_t pos;
        if (a.positions == nullptr) {
          pos = t % a.seq;
        } else {
          pos = a.positions_are_i64 ? static_cast<const int64_t*>(a.positions)[t]
                                    : static_cast<const int32_t*>(a.positions)[t];
        }
        const float* cs = a.cos + pos * half;
        const float* sn = a.sin + pos * half;
        for (int64_t h = 0; h < heads; ++h) {
          const T* x = static_cast<const T*>(a.x) + (t * heads + h) * d;
          T* y = static_cast<T*>(a.out) + (t * heads + h) * d;
          if constexpr (kPairs) {
            rotate_pairs<St>(x, y, cs, sn, a.rotary_dim);
          } else {
            rotate_neox<St>(x, y, cs, sn, half);
          }
          for (int64_t i = a.rotary_dim; i < d; ++i) y[i] = x[i];
        }
      }
      if constexpr (St) S::stream_fence();
    });
  });
}

inline void register_rope(tnc::KernelTable& t) {
  for_each_float_type([&]<class T>(tnc::DType d) {
    t.add<tnc::RopeArgs>("rope", d, rope<T, tnc::RopeRotation::neox>);
    t.add<tnc::RopeArgs>("rope_pairs", d, rope<T, tnc::RopeRotation::pairs>);
  });
}
