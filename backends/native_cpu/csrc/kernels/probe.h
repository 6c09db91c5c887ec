// Machine probes: what the memory system sustains, measured by the same vector loads and
// stores the kernels use. benchmarks/native_latency.py reports each memory-bound op as a
// share of these, so the figures are the ceiling an op could reach here, not a datasheet.
//   probe_read          sums its share of src (read bandwidth: a decode GEMV's weights)
//   probe_copy          copies src to dst with ordinary stores (read + write)
//   probe_copy_stream   the same with streaming stores, as large activations write
//   probe_bf16_dot      the bfloat16 GEMM's compute ceiling (below; AVX-512 BF16: its own)

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

// The bfloat16 compute ceiling of a build without a bfloat16 dot product: the generic
// bfloat16 GEMM widens its operands to float and multiplies them with FMAs, so its ceiling
// is the FMA throughput; 12 independent chains hide the FMA latency. Each trip is
// kProbeBf16DotFlopPerTrip flops, as the AVX-512 BF16 probe's (which replaces this one).
inline void probe_bf16_fma(const tnc::ProbeArgs& a, int) {
  constexpr int64_t kFmas = tnc::kProbeBf16DotFlopPerTrip / (2 * W);  // per trip
  static_assert(kFmas % 12 == 0, "a trip is whole rounds of the 12 chains");
  const F x = S::set1(1.0f), y = S::set1(0x1p-7f);
  // named variables, not an array: GCC keeps an array of accumulators in memory
#define TNC_PROBE_12(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11)
#define TNC_PROBE_ACC(i) F c##i = S::set1(static_cast<float>(i));
#define TNC_PROBE_FMA(i) c##i = S::fma(x, y, c##i);
#define TNC_PROBE_SUM(i) s = S::add(s, c##i);
  TNC_PROBE_12(TNC_PROBE_ACC)
  for (int64_t it = 0; it < a.iterations; ++it) {
    for (int64_t r = 0; r < kFmas / 12; ++r) {
      TNC_PROBE_12(TNC_PROBE_FMA)
    }
  }
  F s = S::zero();
  TNC_PROBE_12(TNC_PROBE_SUM)
#undef TNC_PROBE_SUM
#undef TNC_PROBE_FMA
#undef TNC_PROBE_ACC
#undef TNC_PROBE_12
  *a.sink += S::reduce_add(s);
}

inline void register_probe(tnc::KernelTable& t) {
  t.add<tnc::ProbeArgs>("probe_bf16_dot", tnc::DType::bf16, probe_bf16_fma);
  t.add<tnc::ProbeArgs>("probe_read", tnc::DType::f32, probe_read<>);
  t.add<tnc::ProbeArgs>("probe_copy", tnc::DType::f32, probe_copy<false>);
  t.add<tnc::ProbeArgs>("probe_copy_stream", tnc::DType::f32, probe_copy<true>);
}
