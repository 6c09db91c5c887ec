// What the softmax family's marshalling (bind/softmax.cc) hands its kernels (kernels/softmax.h).
#pragma once

#include <cstdint>

namespace tnc {

struct SoftmaxArgs {
  const void* x;
  void* out;
  int64_t outer;
  int64_t n;      // the softmax axis
  int64_t inner;  // product of the axes after it
  bool log;
};

}  // namespace tnc
