// What the gemm family's marshalling (bind/gemm.cc) hands its kernels (kernels/gemm*.h).
#pragma once

#include <cstdint>

namespace tnc {

struct GemmArgs {
  const void* a;
  const void* b;
  void* d;
  int64_t batch, m, n, k;
  int64_t a_batch, a_row, a_col;  // element (i, kk) of a at a_row*i + a_col*kk
  int64_t b_batch, b_row, b_col;  // element (kk, j) of b at b_row*kk + b_col*j
  int64_t d_batch;                // d rows are contiguous with n columns
};

}  // namespace tnc
