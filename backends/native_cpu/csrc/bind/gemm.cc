// Marshalling of the gemm family (kernels/gemm*.h): GEMM over 2-D operands (transposes as strides) and batched GEMM.
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <algorithm>
#include <string>

#include "bind/kernel.h"
#include "kernels/gemm_args.h"

namespace tnc {
namespace {

struct GemmKernel final : Kernel {
  bool batched;  // Bmm: [B,M,K] x [B,K,N]
  bool trans_a, trans_b;
  KernelFn<GemmArgs> run;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 2)) return nullptr;
    TensorView x, y;
    if (!read(*this, args[0], x, "a") || !read(*this, args[1], y, "b")) return nullptr;
    const int nd = batched ? 3 : 2;
    if (x.ndim != nd) return shape_error(*this, batched ? "a must be [B, M, K]" : "a must be 2-D", x, "a");
    if (y.ndim != nd) return shape_error(*this, batched ? "b must be [B, K, N]" : "b must be 2-D", y, "b");
    GemmArgs g{};
    const int o = batched ? 1 : 0;
    g.batch = batched ? x.shape[0] : 1;
    if (batched && y.shape[0] != g.batch) return shape_error(*this, "a and b must have the same batch", y, "b");
    const int64_t a0 = x.shape[o], a1 = x.shape[o + 1], b0 = y.shape[o], b1 = y.shape[o + 1];
    g.m = trans_a ? a1 : a0;
    g.k = trans_a ? a0 : a1;
    g.n = trans_b ? b0 : b1;
    const int64_t kb = trans_b ? b1 : b0;
    if (kb != g.k)
      return shape_error(*this, ("a gives K=" + std::to_string(g.k) + ", b must give the same K").c_str(), y, "b");
    g.a = x.data;
    g.b = y.data;
    g.a_row = trans_a ? 1 : a1;
    g.a_col = trans_a ? a1 : 1;
    g.b_row = trans_b ? 1 : b1;
    g.b_col = trans_b ? b1 : 1;
    g.a_batch = a0 * a1;
    g.b_batch = b0 * b1;
    g.d_batch = g.m * g.n;
    int64_t shape[3] = {g.batch, g.m, g.n};
    PyObject* out = new_tensor(nd, batched ? shape : shape + 1, dtype, &g.d);
    if (out == nullptr) return nullptr;
    if (g.batch * g.m * g.n > 0)
      run_released(g.batch * g.m * g.n * std::max<int64_t>(g.k, 1), [&] { run(g, threads); });
    return out;
  }
};

}  // namespace

void bind_gemm(nb::module_& m) {
  m.def("gemm", [](DType dtype, bool batched, bool trans_a, bool trans_b, int threads, const std::string& d) {
    auto k = std::make_unique<GemmKernel>();
    k->batched = batched;
    k->trans_a = trans_a;
    k->trans_b = trans_b;
    k->run = require_kernel<GemmArgs>("gemm", dtype);
    return finish(std::move(k), dtype, threads, d);
  });
}

}  // namespace tnc
