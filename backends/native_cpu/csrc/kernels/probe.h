// Machine probes: what the memory system sustains, measured by the same vector loads and
// stores the kernels use. benchmarks/native_latency.py reports each memory-bound op as a
// share of these, so the figures are the ceiling an op could reach here, not a datasheet.
//   probe_read          sums its share of src (read bandwidth: a decode GEMV's weights)
//   probe_copy          copies src to dst with ordinary stores (read + write)
//   probe_copy_stream   the same with streaming stores, as large activations write

template <int Unroll = 4>
inline void probe_read(const tnc::ProbeArgs& a, int) {
  F acc[Unroll];
  for (auto& v : acc) v = S::zero();
  int64_t i = a.begin;
  for (; i + Unroll * W <= a.end; i += Unroll * W)
    for (int u = 0; u < Unroll; ++u) acc[u] = S::add(acc[u], S::load(a.src + i + u * W));
  for (int u = 1; u < Unroll; ++u) acc[0] = S::add(acc[0], acc[u]);
  *a.sink += S::reduce_add(acc[0]);
}

template <bool Stream>
inline void probe_copy(const tnc::ProbeArgs& a, int) {
  int64_t i = a.begin;
  if constexpr (Stream && S::kHasStream) {
    for (; i + 4 * W <= a.end; i += 4 * W)
      for (int u = 0; u < 4; ++u) S::stream(a.dst + i + u * W, S::load(a.src + i + u * W));
    S::stream_fence();
  } else {
    for (; i + 4 * W <= a.end; i += 4 * W)
      for (int u = 0; u < 4; ++u) S::store(a.dst + i + u * W, S::load(a.src + i + u * W));
  }
}

inline void register_probe(tnc::KernelTable& t) {
  t.add<tnc::ProbeArgs>("probe_read", tnc::DType::f32, probe_read<>);
  t.add<tnc::ProbeArgs>("probe_copy", tnc::DType::f32, probe_copy<false>);
  t.add<tnc::ProbeArgs>("probe_copy_stream", tnc::DType::f32, probe_copy<true>);
}
