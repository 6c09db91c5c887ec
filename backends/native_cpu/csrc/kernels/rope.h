// The rope family: rotary position embedding, NeoX half split, from float cos/sin tables
// (positions 0..S-1, or one position id per token). Included inside a per-ISA namespace by
// kernels/families.h (after kernels/common.h); marshalling in bind/rope.cc.
#pragma once
// (no includes here on purpose: see kernels/common.h)

template <class T>
void rope(const tnc::RopeArgs& a, int threads) {
  const int64_t half = a.rotary_dim / 2, d = a.head_dim, heads = a.heads;
  // stores land at multiples of `half` (and of d, itself a multiple of half then)
  with_stream(streams<T>(a.out, a.tokens * heads * d, half) && d % half == 0, [&](auto stream) {
    constexpr bool St = decltype(stream)::value;
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
            if constexpr (St) {  // half is a multiple of W: whole vectors only
              S::stream(y + i, S::fnma(x2, si, S::mul(x1, co)));
              S::stream(y + half + i, S::fma(x1, si, S::mul(x2, co)));
            } else {
              storec(y + i, S::fnma(x2, si, S::mul(x1, co)), c);
              storec(y + half + i, S::fma(x1, si, S::mul(x2, co)), c);
            }
          }
          for (int64_t i = a.rotary_dim; i < d; ++i) y[i] = x[i];
        }
      }
      if constexpr (St) S::stream_fence();
    });
  });
}

inline void register_rope(tnc::KernelTable& t) {
  for_each_float_type([&]<class T>(tnc::DType d) { t.add<tnc::RopeArgs>("rope", d, rope<T>); });
}
