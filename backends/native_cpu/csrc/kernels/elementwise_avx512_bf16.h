// The elementwise family's code for AVX-512 BF16 (vcvtne2ps2bf16): bfloat16 rows of the
// gated kernels. Included by isa_avx512.cc inside its namespace after kernels/families.h;
// register_elementwise_avx512_bf16 replaces the generic bfloat16 gated kernels.
#pragma once
// (no includes here on purpose: see kernels/common.h)

#if !defined(__AVX512BF16__)
#error "kernels/elementwise_avx512_bf16.h needs -mavx512bf16 (isa_avx512.cc only)"
#endif

// 32 bfloat16 per load: even elements widen with a shift, odd ones with a mask (no
// cross-lane unpacking); the two float results are packed by one vcvtne2ps2bf16 and
// re-interleaved by one vpermw. Results of 8 MiB or more go out with streaming stores.
struct Avx512Bf16GatedRows {
  template <class Act>
  static int64_t run(const bf16_t* gate, const bf16_t* val, bf16_t* y, int64_t i, int64_t c1, bool stream) {
    const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5,
                                           20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    if (stream) {  // peel to a 64-byte boundary of the output for the streaming stores
      const int64_t e = i + std::min<int64_t>(c1 - i, static_cast<int64_t>(((64 - (reinterpret_cast<uintptr_t>(y + i) & 63)) & 63) / 2));
      for (int64_t j = i; j < e; j += W) {
        const int64_t c = std::min<int64_t>(W, e - j);
        storec(y + j, S::mul(Act::template apply<true>(loadc(gate + j, c)), loadc(val + j, c)), c);
      }
      i = e;
    }
    for (; i + 32 <= c1; i += 32) {
      const __m512i g = _mm512_loadu_si512(gate + i), v = _mm512_loadu_si512(val + i);
      const F ge = _mm512_castsi512_ps(_mm512_slli_epi32(g, 16)), go = _mm512_castsi512_ps(_mm512_and_si512(g, hi));
      const F ve = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), vo = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
      const F re = S::mul(Act::template apply<true>(ge), ve), ro = S::mul(Act::template apply<true>(go), vo);
      const __m512i packed = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(ro, re));
      if (stream) {
        _mm512_stream_si512(reinterpret_cast<__m512i*>(y + i), _mm512_permutexvar_epi16(inter, packed));
      } else {
        _mm512_storeu_si512(y + i, _mm512_permutexvar_epi16(inter, packed));
      }
    }
    return i;
  }
  static void finish_chunk(bool stream) {
    if (stream) _mm_sfence();
  }
};

inline void register_elementwise_avx512_bf16(tnc::KernelTable& t) {
  for_each_activation(GatedActivations{}, [&]<class A>() {
    t.replace<tnc::GatedArgs>("gated", tnc::DType::bf16, gated<bf16_t, A, Avx512Bf16GatedRows>, kActivationValue<A>);
  });
}
