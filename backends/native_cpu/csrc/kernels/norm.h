// The norm family: RMSNorm, LayerNorm and their fused add + norm forms over the last n
// elements of each row, GroupNorm over [N, C, *spatial]. Included inside a per-ISA namespace by
// kernels/families.h (after kernels/common.h); marshalling in bind/norm.cc.
#pragma once
// (no includes here on purpose: see kernels/common.h)

// y = x / sqrt(squares / n + eps) * w over one row whose sum of squares is known; next,
// next2: rows prefetched meanwhile (see prefetch_next), or nullptr.
template <bool St, class T>
inline void rms_norm_row(const T* x, const T* w, T* y, int64_t n, float squares, float eps, const T* next,
                         const T* next2 = nullptr) {
  const F scale = S::set1(1.f / std::sqrt(squares / static_cast<float>(n) + eps));
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    prefetch_next<2 * W>(next, i);
    prefetch_next<2 * W>(next2, i);
    F a, b, wa, wb;
    load_pair(x + i, a, b);
    load_pair(w + i, wa, wb);
    store_pair_full<St>(y + i, S::mul(S::mul(a, scale), wa), S::mul(S::mul(b, scale), wb));
  }
  for (; i < n; i += W) storec(y + i, S::mul(S::mul(loadc(x + i, n - i), scale), loadc(w + i, n - i)), n - i);
}

template <class T>
void rms_norm(const tnc::NormArgs& a, int threads) {
  const int64_t n = a.n;
  with_stream(streams<T>(a.out, a.rows * n, n), [&](auto stream) {
    constexpr bool St = decltype(stream)::value;
    tnc::parallel_for(a.rows, row_grain(n), threads, [&](int64_t r0, int64_t r1) {
      const T* w = static_cast<const T*>(a.weight);
      for (int64_t r = r0; r < r1; ++r) {
        const T* x = static_cast<const T*>(a.x) + r * n;
        T* y = static_cast<T*>(a.out) + r * n;
        const T* next = next_row<T>(a.x, r, r1, n);
        rms_norm_row<St>(x, w, y, n, sum_squares(x, n), a.eps, next);
      }
      if constexpr (St) S::stream_fence();
    });
  });
}

// The fused kernels' first pass over a row: s = x + res rounded to T (the norm is of the
// residual stream as stored), streamed to rout as well when St (then s is this thread's
// cached copy, rout has left the caches). Returns the sum and the sum of squares of the
// rounded s, read back as stored.
struct RowSums {
  float sum, squares;
};
template <bool St, class T>
inline RowSums fused_add_row(const T* x, const T* res, T* s, T* rout, int64_t n) {
  F sum = S::zero(), sq0 = S::zero(), sq1 = S::zero();
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    F xa, xb, ra, rb;
    load_pair(x + i, xa, xb);
    load_pair(res + i, ra, rb);
    const F va = S::add(xa, ra), vb = S::add(xb, rb);
    store_pair(s + i, va, vb);
    if constexpr (St) store_pair_full<true>(rout + i, va, vb);
    F rounded_a, rounded_b;
    load_pair(s + i, rounded_a, rounded_b);
    sum = S::add(sum, S::add(rounded_a, rounded_b));
    sq0 = S::fma(rounded_a, rounded_a, sq0);
    sq1 = S::fma(rounded_b, rounded_b, sq1);
  }
  for (; i < n; i += W) {  // never when streaming (n is whole pairs then)
    storec(s + i, S::add(loadc(x + i, n - i), loadc(res + i, n - i)), n - i);
    const F rounded = loadc(s + i, n - i);
    sum = S::add(sum, rounded);
    sq0 = S::fma(rounded, rounded, sq0);
  }
  return {S::reduce_add(sum), S::reduce_add(S::add(sq0, sq1))};
}

// Runs row(x, res, s, rout, y, next_x, next_res) for every row of a fused kernel, streaming
// both results when they are large (see streams()); s is where the row's rounded sum is,
// next_x and next_res the next row's inputs to prefetch during the second pass (or nullptr).
template <class T, class Row>
void fused_add_rows(const tnc::NormArgs& a, int threads, Row row) {
  const int64_t n = a.n;
  with_stream(streams<T>(a.out, a.rows * n, n) && streams<T>(a.residual_out, a.rows * n, n), [&](auto stream) {
    constexpr bool St = decltype(stream)::value;
    tnc::parallel_for(a.rows, row_grain(n), threads, [&](int64_t r0, int64_t r1) {
      T* cached = St ? reinterpret_cast<T*>(scratch(static_cast<size_t>(n))) : nullptr;
      for (int64_t r = r0; r < r1; ++r) {
        T* rout = static_cast<T*>(a.residual_out) + r * n;
        row(std::bool_constant<St>{}, static_cast<const T*>(a.x) + r * n, static_cast<const T*>(a.residual) + r * n,
            St ? cached : rout, rout, static_cast<T*>(a.out) + r * n, next_row<T>(a.x, r, r1, n),
            next_row<T>(a.residual, r, r1, n));
      }
      if constexpr (St) S::stream_fence();
    });
  });
}

template <class T>
void fused_add_rms_norm(const tnc::NormArgs& a, int threads) {
  const int64_t n = a.n;
  const T* w = static_cast<const T*>(a.weight);
  fused_add_rows<T>(a, threads,
                    [&](auto stream, const T* x, const T* res, T* s, T* rout, T* y, const T* nx, const T* nres) {
                      constexpr bool St = decltype(stream)::value;
                      rms_norm_row<St>(s, w, y, n, fused_add_row<St>(x, res, s, rout, n).squares, a.eps, nx, nres);
                    });
}

template <class T>
inline float centred_sum_squares(const T* x, int64_t n, float mean) {
  const F m = S::set1(mean);
  F a0 = S::zero(), a1 = S::zero();
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    F v0, v1;
    load_pair(x + i, v0, v1);
    const F d0 = S::sub(v0, m), d1 = S::sub(v1, m);
    a0 = S::fma(d0, d0, a0);
    a1 = S::fma(d1, d1, a1);
  }
  for (; i < n; i += W) {
    const F d = S::sub(loadc(x + i, n - i, mean), m);  // padding lanes hold the mean: d = 0
    a0 = S::fma(d, d, a0);
  }
  return S::reduce_add(S::add(a0, a1));
}

// y = (x - mean) / sqrt(var + eps) * w + b over one row whose mean is known, the variance
// from a second pass over the centred row (float32).
// next, next2: as for rms_norm_row.
template <bool St, class T>
inline void layer_norm_row(const T* x, const T* w, const T* b, T* y, int64_t n, float mean, float eps, const T* next,
                           const T* next2 = nullptr) {
  const float var = centred_sum_squares(x, n, mean) / static_cast<float>(n);
  const F rstd = S::set1(1.f / std::sqrt(var + eps));
  const F m = S::set1(mean);
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    prefetch_next<2 * W>(next, i);
    prefetch_next<2 * W>(next2, i);
    F xa, xb, wa, wb, ba, bb;
    load_pair(x + i, xa, xb);
    load_pair(w + i, wa, wb);
    load_pair(b + i, ba, bb);
    store_pair_full<St>(y + i, S::fma(S::mul(S::sub(xa, m), rstd), wa, ba),
                        S::fma(S::mul(S::sub(xb, m), rstd), wb, bb));
  }
  for (; i < n; i += W) {
    const int64_t c = n - i;
    storec(y + i, S::fma(S::mul(S::sub(loadc(x + i, c), m), rstd), loadc(w + i, c), loadc(b + i, c)), c);
  }
}

template <class T>
void layer_norm(const tnc::NormArgs& a, int threads) {
  const int64_t n = a.n;
  with_stream(streams<T>(a.out, a.rows * n, n), [&](auto stream) {
    constexpr bool St = decltype(stream)::value;
    tnc::parallel_for(a.rows, row_grain(n), threads, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* x = static_cast<const T*>(a.x) + r * n;
        layer_norm_row<St>(x, static_cast<const T*>(a.weight), static_cast<const T*>(a.bias),
                           static_cast<T*>(a.out) + r * n, n, sum_run(x, n) / static_cast<float>(n), a.eps,
                           next_row<T>(a.x, r, r1, n));
      }
      if constexpr (St) S::stream_fence();
    });
  });
}

template <class T>
void fused_add_layer_norm(const tnc::NormArgs& a, int threads) {
  const T* w = static_cast<const T*>(a.weight);
  const T* b = static_cast<const T*>(a.bias);
  fused_add_rows<T>(a, threads,
                    [&](auto stream, const T* x, const T* res, T* s, T* rout, T* y, const T* nx, const T* nres) {
                      constexpr bool St = decltype(stream)::value;
                      const float mean = fused_add_row<St>(x, res, s, rout, a.n).sum / static_cast<float>(a.n);
                      layer_norm_row<St>(s, w, b, y, a.n, mean, a.eps, nx, nres);
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

inline void register_norm(tnc::KernelTable& t) {
  for_each_float_type([&]<class T>(tnc::DType d) {
    t.add<tnc::NormArgs>("rms_norm", d, rms_norm<T>);
    t.add<tnc::NormArgs>("fused_add_rms_norm", d, fused_add_rms_norm<T>);
    t.add<tnc::NormArgs>("fused_add_layer_norm", d, fused_add_layer_norm<T>);
    t.add<tnc::NormArgs>("layer_norm", d, layer_norm<T>);
    t.add<tnc::GroupNormArgs>("group_norm", d, group_norm<T>);
  });
}
