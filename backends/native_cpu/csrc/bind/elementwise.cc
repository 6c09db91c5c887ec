// Marshalling of the elementwise family (kernels/elementwise.h): activations, gated
// activations, broadcasting add / mul and clamp.
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "bind/kernel.h"
#include "kernels/elementwise_args.h"

namespace tnc {
namespace {

struct UnaryKernel final : Kernel {
  bool inplace;
  KernelFn<UnaryArgs> run;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 1)) return nullptr;
    TensorView x;
    if (!read(*this, args[0], x, "input")) return nullptr;
    UnaryArgs a{x.data, nullptr, x.numel};
    PyObject* out;
    if (inplace) {
      out = args[0];
      Py_INCREF(out);
      a.out = x.data;
    } else {
      out = new_tensor(x.ndim, x.shape, dtype, &a.out);
      if (out == nullptr) return nullptr;
    }
    if (x.numel > 0) run_released(x.numel, [&] { run(a, threads); });
    return out;
  }
};

// act(x[:, :n]) * x[:, n:] for x [M, 2n]
struct GatedKernel final : Kernel {
  KernelFn<GatedArgs> run;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 1)) return nullptr;
    TensorView x;
    if (!read(*this, args[0], x, "x")) return nullptr;
    if (x.ndim != 2 || x.shape[1] % 2 != 0) return shape_error(*this, "x must be [M, 2N]", x, "x");
    GatedArgs a{};
    a.x = x.data;
    a.n = x.shape[x.ndim - 1] / 2;
    a.rows = a.n == 0 ? 0 : x.numel / (2 * a.n);
    int64_t shape[kMaxDims];
    std::memcpy(shape, x.shape, sizeof(int64_t) * static_cast<size_t>(x.ndim));
    shape[x.ndim - 1] = a.n;
    PyObject* out = new_tensor(x.ndim, shape, dtype, &a.out);
    if (out == nullptr) return nullptr;
    if (a.rows * a.n > 0) run_released(x.numel, [&] { run(a, threads); });
    return out;
  }
};

// Broadcast plan for up to three operands: output shape, merged axes, element strides.
bool plan_broadcast(const Kernel& k, const TensorView* ops[3], BroadcastArgs& a, int& out_ndim, int64_t* out_shape) {
  out_ndim = 0;
  for (int i = 0; i < 3; ++i)
    if (ops[i]) out_ndim = std::max(out_ndim, ops[i]->ndim);
  for (int d = 0; d < out_ndim; ++d) {
    int64_t size = 1;
    for (int i = 0; i < 3; ++i) {
      if (!ops[i]) continue;
      const int od = d - (out_ndim - ops[i]->ndim);
      const int64_t s = od >= 0 ? ops[i]->shape[od] : 1;
      if (s == 1) continue;
      if (size != 1 && size != s) {
        PyErr_Format(PyExc_ValueError, "%s: operand shapes do not broadcast (axis %d has sizes %lld and %lld)",
                     k.description.c_str(), d, static_cast<long long>(size), static_cast<long long>(s));
        return false;
      }
      size = s;
    }
    out_shape[d] = size;
  }
  // strides of each operand along each output axis, then merge axes that stay contiguous
  int64_t st[3][kMaxDims];
  for (int i = 0; i < 3; ++i) {
    int64_t stride = 1;
    for (int d = out_ndim - 1; d >= 0; --d) {
      const int od = ops[i] ? d - (out_ndim - ops[i]->ndim) : -1;
      const int64_t s = od >= 0 ? ops[i]->shape[od] : 1;
      st[i][d] = (s == 1 || !ops[i]) ? 0 : stride;
      stride *= s;
    }
  }
  a.ndim = 0;
  for (int d = 0; d < out_ndim; ++d) {
    if (out_shape[d] == 1) continue;
    if (a.ndim > 0) {
      const int p = a.ndim - 1;
      bool mergeable = true;
      for (int i = 0; i < 3; ++i) mergeable = mergeable && a.strides[i][p] == st[i][d] * out_shape[d];
      if (mergeable) {
        a.sizes[p] *= out_shape[d];
        for (int i = 0; i < 3; ++i) a.strides[i][p] = st[i][d];
        continue;
      }
    }
    a.sizes[a.ndim] = out_shape[d];
    for (int i = 0; i < 3; ++i) a.strides[i][a.ndim] = st[i][d];
    ++a.ndim;
  }
  if (a.ndim == 0) {
    a.ndim = 1;
    a.sizes[0] = 1;
    for (int i = 0; i < 3; ++i) a.strides[i][0] = 0;
  }
  return true;
}

struct BinaryKernel final : Kernel {
  BinaryOp op;
  double alpha;
  KernelFn<BroadcastArgs> run;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 2)) return nullptr;
    TensorView x, y;
    if (!read(*this, args[0], x, "input") || !read(*this, args[1], y, "other")) return nullptr;
    BroadcastArgs a{};
    const TensorView* ops[3] = {&x, &y, nullptr};
    int out_ndim;
    int64_t out_shape[kMaxDims];
    if (!plan_broadcast(*this, ops, a, out_ndim, out_shape)) return nullptr;
    a.in[0] = x.data;
    a.in[1] = y.data;
    a.op = op;
    a.alpha = alpha;
    PyObject* out = new_tensor(out_ndim, out_shape, dtype, &a.out);
    if (out == nullptr) return nullptr;
    int64_t numel = 1;
    for (int d = 0; d < out_ndim; ++d) numel *= out_shape[d];
    if (numel > 0) run_released(numel, [&] { run(a, threads); });
    return out;
  }
};

struct ClampKernel final : Kernel {
  bool has_min, has_max;
  KernelFn<BroadcastArgs> run;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 3)) return nullptr;
    TensorView x, lo, hi;
    if (!read(*this, args[0], x, "input")) return nullptr;
    if ((args[1] != Py_None) != has_min || (args[2] != Py_None) != has_max) {
      PyErr_Format(PyExc_ValueError, "%s was built with min %s and max %s; got min %s and max %s", description.c_str(),
                   has_min ? "given" : "None", has_max ? "given" : "None", args[1] != Py_None ? "given" : "None",
                   args[2] != Py_None ? "given" : "None");
      return nullptr;
    }
    if (has_min && !read(*this, args[1], lo, "min")) return nullptr;
    if (has_max && !read(*this, args[2], hi, "max")) return nullptr;
    BroadcastArgs a{};
    const TensorView* ops[3] = {&x, has_min ? &lo : nullptr, has_max ? &hi : nullptr};
    int out_ndim;
    int64_t out_shape[kMaxDims];
    if (!plan_broadcast(*this, ops, a, out_ndim, out_shape)) return nullptr;
    a.in[0] = x.data;
    a.in[1] = has_min ? lo.data : nullptr;
    a.in[2] = has_max ? hi.data : nullptr;
    PyObject* out = new_tensor(out_ndim, out_shape, dtype, &a.out);
    if (out == nullptr) return nullptr;
    int64_t numel = 1;
    for (int d = 0; d < out_ndim; ++d) numel *= out_shape[d];
    if (numel > 0) run_released(numel, [&] { run(a, threads); });
    return out;
  }
};

const char* activation_name(Activation act) {
  static const std::vector<const char*> names = isa().members("Activation");
  const size_t i = static_cast<size_t>(act);
  return i < names.size() ? names[i] : "an unknown activation";
}

}  // namespace

void bind_elementwise(nb::module_& m) {
  // The members come from the kernels (kernels/elementwise.h, `Activations`).
  nb::enum_<Activation> activation(m, "Activation");
  const std::vector<const char*> names = isa().members("Activation");
  for (size_t i = 0; i < names.size(); ++i) activation.value(names[i], static_cast<Activation>(i));
  nb::enum_<BinaryOp>(m, "BinaryOp").value("add", BinaryOp::add).value("mul", BinaryOp::mul);

  m.def("unary", [](Activation act, DType dtype, bool inplace, int threads, const std::string& d) {
    auto k = std::make_unique<UnaryKernel>();
    k->inplace = inplace;
    k->run = require_kernel<UnaryArgs>("unary", dtype, static_cast<int>(act), activation_name(act));
    return finish(std::move(k), dtype, threads, d);
  });
  m.def("gated", [](Activation act, DType dtype, int threads, const std::string& d) {
    auto k = std::make_unique<GatedKernel>();
    k->run = require_kernel<GatedArgs>("gated", dtype, static_cast<int>(act), activation_name(act));
    return finish(std::move(k), dtype, threads, d);
  });
  m.def("binary", [](BinaryOp op, DType dtype, double alpha, int threads, const std::string& d) {
    auto k = std::make_unique<BinaryKernel>();
    k->op = op;
    k->alpha = alpha;
    k->run = require_kernel<BroadcastArgs>("binary", dtype);
    return finish(std::move(k), dtype, threads, d);
  });
  m.def("clamp", [](DType dtype, bool has_min, bool has_max, int threads, const std::string& d) {
    auto k = std::make_unique<ClampKernel>();
    k->has_min = has_min;
    k->has_max = has_max;
    k->run = require_kernel<BroadcastArgs>("clamp", dtype);
    return finish(std::move(k), dtype, threads, d);
  });
}

}  // namespace tnc
