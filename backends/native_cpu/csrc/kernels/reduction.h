// The reduction family: sum, mean and amax over any set of axes of a contiguous input
// (after merging, alternating kept and reduced axes). Included inside a per-ISA namespace
// by kernels/families.h (after kernels/common.h); marshalling in bind/reduction.cc.
#pragma once
// (no includes here on purpose: see kernels/common.h)

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
  if (items < 2 * threads)
    rparts = std::max<int64_t>(1, std::min<int64_t>((2 * threads + items - 1) / items, n_red / 16));
  const int64_t rspan = (n_red + rparts - 1) / rparts;
  const int64_t cw = std::min(kChunk, len);
  std::vector<float> partial(rparts > 1 ? static_cast<size_t>(items * rparts * cw) : 0);
  const F vs = S::set1(scale);
  auto fold = [is_max](F c, F v) { return is_max ? S::max_nan(c, v) : S::add(c, v); };
  auto accumulate = [&](float* acc, int64_t base, int64_t cnt, int64_t r0, int64_t r1) {
    for (int64_t i = 0; i < cnt; ++i) acc[i] = init;
    int64_t rc = r0;
    // wide rows: four reduced rows per pass over acc, a quarter of acc's loads and stores
    // (8 KiB of floats and more do not stay in the L1 beside the rows). Narrower ones keep
    // one row at a time, a single forward stream (four rows at once were slower there).
    for (; cnt >= 2048 && rc + 4 <= r1; rc += 4) {
      const T* p[4];
      for (int j = 0; j < 4; ++j) p[j] = x + base + offset_of(rc + j, red, nr);
      auto four = [&](int64_t i) {
        return fold(fold(S::load(p[0] + i), S::load(p[1] + i)), fold(S::load(p[2] + i), S::load(p[3] + i)));
      };
      int64_t i = 0;
      for (; i + 2 * W <= cnt; i += 2 * W) {
        const F a = four(i), b = four(i + W);
        S::store(acc + i, fold(S::load(acc + i), a));
        S::store(acc + i + W, fold(S::load(acc + i + W), b));
      }
      for (; i < cnt; i += W) {
        const int64_t c = cnt - i;
        auto row = [&](int j) { return loadc(p[j] + i, c, init); };
        storec(acc + i, fold(loadc(acc + i, c, init), fold(fold(row(0), row(1)), fold(row(2), row(3)))), c);
      }
    }
    for (; rc < r1; ++rc) {
      const T* p = x + base + offset_of(rc, red, nr);
      int64_t i = 0;
      for (; i + 4 * W <= cnt; i += 4 * W) {
        F c0 = S::load(acc + i), c1 = S::load(acc + i + W), c2 = S::load(acc + i + 2 * W),
          c3 = S::load(acc + i + 3 * W);
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

inline void register_reduction(tnc::KernelTable& t) {
  for_each_float_type([&]<class T>(tnc::DType d) { t.add<tnc::ReduceArgs>("reduce", d, reduce<T>); });
}
