// The softmax family: softmax and log-softmax along one axis (rows when it is the
// innermost, lanes along the inner axes otherwise). Included inside a per-ISA namespace by
// kernels/families.h (after kernels/common.h); marshalling in bind/softmax.cc.
#pragma once
// (no includes here on purpose: see kernels/common.h)

template <class T, bool Stream>
void softmax_rows(const tnc::SoftmaxArgs& a, int64_t r0, int64_t r1) {
  const int64_t n = a.n;
  for (int64_t r = r0; r < r1; ++r) {
    const T* x = static_cast<const T*>(a.x) + r * n;
    T* y = static_cast<T*>(a.out) + r * n;
    const T* next = next_row<T>(a.x, r, r1, n);  // read during the exp pass
    const float mx = max_run(x, n);
    const F m = S::set1(mx);
    if (a.log) {
      const float lowest = -std::numeric_limits<float>::infinity();
      F acc0 = S::zero(), acc1 = S::zero();
      int64_t i = 0;
      for (; i + 2 * W <= n; i += 2 * W) {
        prefetch_next<2 * W>(next, i);
        F a, b;
        load_pair(x + i, a, b);
        acc0 = S::add(acc0, vexp<kHalfT<T>>(S::sub(a, m)));
        acc1 = S::add(acc1, vexp<kHalfT<T>>(S::sub(b, m)));
      }
      for (; i < n; i += W) acc0 = S::add(acc0, vexp<kHalfT<T>>(S::sub(loadc(x + i, n - i, lowest), m)));
      const F lse = S::set1(mx + std::log(S::reduce_add(S::add(acc0, acc1))));
      for (i = 0; i + 2 * W <= n; i += 2 * W) {
        F a, b;
        load_pair(x + i, a, b);
        store_pair_full<Stream>(y + i, S::sub(a, lse), S::sub(b, lse));
      }
      for (; i < n; i += W) storec(y + i, S::sub(loadc(x + i, n - i), lse), n - i);
      continue;
    }
    // float results hold the exponentials in place, unless they stream (then they would be
    // read back from memory)
    float* e_buf = std::is_same_v<T, float> && !Stream ? reinterpret_cast<float*>(y) : scratch(static_cast<size_t>(n));
    F acc0 = S::zero(), acc1 = S::zero();
    int64_t i = 0;
    // pairs of vectors keep load_pair's lane order in e_buf, which store_pair undoes
    for (; i + 2 * W <= n; i += 2 * W) {
      prefetch_next<2 * W>(next, i);
      F a, b;
      load_pair(x + i, a, b);
      const F e0 = vexp<kHalfT<T>>(S::sub(a, m)), e1 = vexp<kHalfT<T>>(S::sub(b, m));
      S::store(e_buf + i, e0);
      S::store(e_buf + i + W, e1);
      acc0 = S::add(acc0, e0);
      acc1 = S::add(acc1, e1);
    }
    for (; i < n; i += W) {
      const int64_t c = n - i;
      const F e = vexp<kHalfT<T>>(
          S::sub(loadc(x + i, c, -std::numeric_limits<float>::infinity()), m));  // padding: exp(-inf) = 0
      storec(e_buf + i, e, c);
      acc0 = S::add(acc0, e);
    }
    const F inv = S::set1(1.f / S::reduce_add(S::add(acc0, acc1)));
    for (i = 0; i + 2 * W <= n; i += 2 * W)
      store_pair_full<Stream>(y + i, S::mul(S::load(e_buf + i), inv), S::mul(S::load(e_buf + i + W), inv));
    for (; i < n; i += W) storec(y + i, S::mul(loadc(e_buf + i, n - i), inv), n - i);
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
    with_stream(streams<T>(a.out, a.outer * a.n, a.n), [&](auto stream) {
      constexpr bool St = decltype(stream)::value;
      tnc::parallel_for(a.outer, row_grain(a.n), threads, [&](int64_t r0, int64_t r1) {
        softmax_rows<T, St>(a, r0, r1);
        if constexpr (St) S::stream_fence();
      });
    });
  } else {
    const int64_t items = a.outer * ((a.inner + W - 1) / W);
    tnc::parallel_for(items, row_grain(a.n * W), threads,
                      [&](int64_t i0, int64_t i1) { softmax_columns<T>(a, i0, i1); });
  }
}

inline void register_softmax(tnc::KernelTable& t) {
  for_each_float_type([&]<class T>(tnc::DType d) { t.add<tnc::SoftmaxArgs>("softmax", d, softmax<T>); });
}
