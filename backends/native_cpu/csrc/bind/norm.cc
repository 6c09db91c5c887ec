// Marshalling of the norm family (kernels/norm.h): RMSNorm, LayerNorm, their fused add + norm
// forms, and GroupNorm kernel objects.
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include "bind/kernel.h"
#include "kernels/norm_args.h"

namespace tnc {
namespace {

const char* row_norm_kernel_name(RowNorm kind) {
  switch (kind) {
    case RowNorm::rms: return "rms_norm";
    case RowNorm::fused_add_rms: return "fused_add_rms_norm";
    case RowNorm::layer: return "layer_norm";
    case RowNorm::fused_add_layer: return "fused_add_layer_norm";
  }
  return "";
}

// Normalises the last n elements of x (n = 0: x has no elements, the results neither).
// Inputs: x, [residual,] weight, [bias]; the fused kinds return (output, residual_out).
struct RowNormKernel final : Kernel {
  RowNorm kind;
  int64_t n;
  float eps;
  KernelFn<NormArgs> run;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    const bool fused = kind == RowNorm::fused_add_rms || kind == RowNorm::fused_add_layer;
    const bool biased = kind == RowNorm::layer || kind == RowNorm::fused_add_layer;
    if (!expect_args(*this, nargs, 2 + (fused ? 1 : 0) + (biased ? 1 : 0))) return nullptr;
    TensorView x, residual, w, bias;
    Py_ssize_t at = 0;
    if (!read(*this, args[at++], x, "x")) return nullptr;
    if (fused && !read(*this, args[at++], residual, "residual")) return nullptr;
    if (!read(*this, args[at++], w, "weight")) return nullptr;
    if (biased && !read(*this, args[at++], bias, "bias")) return nullptr;
    if (x.ndim == 0 || (n == 0 ? x.numel != 0 : x.numel % n != 0))
      return shape_error(*this, "x must end in the normalized shape", x, "x");
    if (w.numel != n) return shape_error(*this, "weight must hold the normalized shape", w, "weight");
    if (fused && residual.numel != x.numel)
      return shape_error(*this, "residual must have x's shape", residual, "residual");
    if (biased && bias.numel != n) return shape_error(*this, "bias must hold the normalized shape", bias, "bias");
    NormArgs a{};
    a.x = x.data;
    a.rows = n == 0 ? 0 : x.numel / n;
    a.n = n;
    a.eps = eps;
    a.weight = w.data;
    a.bias = biased ? bias.data : nullptr;
    a.residual = fused ? residual.data : nullptr;
    PyObject* out = new_tensor(x.ndim, x.shape, dtype, &a.out);
    if (out == nullptr) return nullptr;
    if (!fused) {
      run_released(x.numel, [&] { run(a, threads); });
      return out;
    }
    PyObject* rout = new_tensor(x.ndim, x.shape, dtype, &a.residual_out);
    if (rout == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    run_released(x.numel, [&] { run(a, threads); });
    return new_pair(out, rout);
  }
};

struct GroupNormKernel final : Kernel {
  int64_t groups;
  float eps;
  bool affine;
  KernelFn<GroupNormArgs> run;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 3)) return nullptr;
    TensorView x, w, b;
    if (!read(*this, args[0], x, "x")) return nullptr;
    const bool has_w = args[1] != Py_None, has_b = args[2] != Py_None;
    if (has_w != affine || has_b != affine) {
      PyErr_Format(PyExc_ValueError, "%s was built %s weight and bias; got weight %s and bias %s", description.c_str(),
                   affine ? "with" : "without", has_w ? "given" : "None", has_b ? "given" : "None");
      return nullptr;
    }
    if (affine && (!read(*this, args[1], w, "weight") || !read(*this, args[2], b, "bias"))) return nullptr;
    if (x.ndim < 2 || x.shape[1] % groups != 0)
      return shape_error(*this, "x must be [N, C, *] with C divisible by num_groups", x, "x");
    GroupNormArgs a{};
    a.x = x.data;
    a.batch = x.shape[0];
    a.channels = x.shape[1];
    a.groups = groups;
    a.spatial = x.shape[1] == 0 ? 0 : x.numel / (x.shape[0] * x.shape[1] == 0 ? 1 : x.shape[0] * x.shape[1]);
    a.eps = eps;
    if (affine) {
      if (w.numel != a.channels || b.numel != a.channels)
        return shape_error(*this, "weight and bias must be [C]", w, "weight");
      a.weight = w.data;
      a.bias = b.data;
    }
    PyObject* out = new_tensor(x.ndim, x.shape, dtype, &a.out);
    if (out == nullptr) return nullptr;
    if (x.numel > 0) run_released(x.numel, [&] { run(a, threads); });
    return out;
  }
};

}  // namespace

void bind_norm(nb::module_& m) {
  nb::enum_<RowNorm>(m, "RowNorm")
      .value("rms", RowNorm::rms)
      .value("fused_add_rms", RowNorm::fused_add_rms)
      .value("layer", RowNorm::layer)
      .value("fused_add_layer", RowNorm::fused_add_layer);
  m.def("row_norm", [](RowNorm kind, DType dtype, int64_t n, float eps, int threads, const std::string& d) {
    if (n < 0) throw nb::value_error("row_norm: the normalized size n must be >= 0");
    auto k = std::make_unique<RowNormKernel>();
    k->kind = kind;
    k->n = n;
    k->eps = eps;
    k->run = require_kernel<NormArgs>(row_norm_kernel_name(kind), dtype);
    return finish(std::move(k), dtype, threads, d);
  });
  m.def("group_norm", [](DType dtype, int64_t groups, float eps, bool affine, int threads, const std::string& d) {
    if (groups <= 0) throw nb::value_error("group_norm: num_groups must be positive");
    auto k = std::make_unique<GroupNormKernel>();
    k->groups = groups;
    k->eps = eps;
    k->affine = affine;
    k->run = require_kernel<GroupNormArgs>("group_norm", dtype);
    return finish(std::move(k), dtype, threads, d);
  });
}

}  // namespace tnc
