// Marshalling of the attention family (kernels/attention*.h): grouped-query attention, prefill and decode.
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "bind/kernel.h"
#include "kernels/attention_args.h"

namespace tnc {
namespace {

struct AttentionKernel final : Kernel {
  bool decode;
  bool causal;
  int64_t head_dim, group;
  KernelFn<AttentionArgs> run;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 3)) return nullptr;
    TensorView q, k, v;
    if (!read(*this, args[0], q, "q") || !read(*this, args[1], k, "k") || !read(*this, args[2], v, "v")) return nullptr;
    const int qd = decode ? 3 : 4;
    if (q.ndim != qd || q.shape[qd - 1] != head_dim) return shape_error(*this, decode ? "q must be [B, H, D]" : "q must be [B, S, H, D]", q, "q");
    if (k.ndim != 4 || k.shape[3] != head_dim || k.shape[0] != q.shape[0])
      return shape_error(*this, "k must be [B, S_kv, H_kv, D]", k, "k");
    for (int d = 0; d < 4; ++d)
      if (v.shape[d] != k.shape[d] || v.ndim != 4) return shape_error(*this, "v must have k's shape", v, "v");
    AttentionArgs a{};
    a.q = q.data;
    a.k = k.data;
    a.v = v.data;
    a.batch = q.shape[0];
    a.seq_q = decode ? 1 : q.shape[1];
    a.heads = decode ? q.shape[1] : q.shape[2];
    a.seq_kv = k.shape[1];
    a.heads_kv = k.shape[2];
    a.head_dim = head_dim;
    a.causal = causal;
    a.scale = 1.f / std::sqrt(static_cast<float>(head_dim));
    if (a.heads_kv == 0 || a.heads != a.heads_kv * group)
      return shape_error(*this, ("q heads must be " + std::to_string(group) + " x the kv heads").c_str(), k, "k");
    if (!decode && a.seq_kv != a.seq_q) return shape_error(*this, "k must have q's sequence length", k, "k");
    PyObject* out = new_tensor(q.ndim, q.shape, dtype, &a.o);
    if (out == nullptr) return nullptr;
    if (q.numel > 0) run_released(q.numel * std::max<int64_t>(a.seq_kv, 1), [&] { run(a, threads); });
    return out;
  }
};

}  // namespace

void bind_attention(nb::module_& m) {
  m.def("attention", [](DType dtype, bool decode, bool causal, int64_t head_dim, int64_t group, int threads, const std::string& d) {
    auto k = std::make_unique<AttentionKernel>();
    k->decode = decode;
    k->causal = causal;
    k->head_dim = head_dim;
    k->group = group;
    k->run = require_kernel<AttentionArgs>(decode ? "attention_decode" : "attention", dtype);
    return finish(std::move(k), dtype, threads, d);
  });
}

}  // namespace tnc
