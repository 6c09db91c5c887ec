// Marshalling of the reduction family (kernels/reduction.h): sum, mean and amax over a fixed set of axes.
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <vector>

#include "bind/kernel.h"
#include "kernels/reduction_args.h"

namespace tnc {
namespace {

struct ReduceKernel final : Kernel {
  std::vector<bool> reduce_axis;  // per input axis
  bool keepdim;
  ReduceOp op;
  KernelFn<ReduceArgs> run;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 1)) return nullptr;
    TensorView x;
    if (!read(*this, args[0], x, "x")) return nullptr;
    if (static_cast<size_t>(x.ndim) != reduce_axis.size()) {
      PyErr_Format(PyExc_ValueError, "%s was built for %zu-dim inputs; got x with %d dims", description.c_str(),
                   reduce_axis.size(), x.ndim);
      return nullptr;
    }
    int64_t out_shape[kMaxDims];
    int out_ndim = 0;
    int64_t n_reduced = 1;
    ReduceArgs a{};
    a.ndim = 0;
    for (int d = 0; d < x.ndim; ++d) {
      const bool r = reduce_axis[static_cast<size_t>(d)];
      if (r) n_reduced *= x.shape[d];
      if (!r) out_shape[out_ndim++] = x.shape[d];
      else if (keepdim) out_shape[out_ndim++] = 1;
      if (x.shape[d] == 1) continue;  // size-1 axes change nothing
      if (a.ndim > 0 && a.reduced[a.ndim - 1] == r) {
        a.sizes[a.ndim - 1] *= x.shape[d];
      } else {
        a.sizes[a.ndim] = x.shape[d];
        a.reduced[a.ndim] = r;
        ++a.ndim;
      }
    }
    if (a.ndim == 0) {
      a.ndim = 1;
      a.sizes[0] = 1;
      a.reduced[0] = true;
    }
    if (op == ReduceOp::amax && n_reduced == 0) {
      PyErr_Format(PyExc_ValueError, "%s: amax over zero elements has no value; got x with a reduced axis of size 0",
                   description.c_str());
      return nullptr;
    }
    a.x = x.data;
    a.op = op;
    a.scale = op == ReduceOp::mean ? 1.f / static_cast<float>(n_reduced) : 1.f;
    PyObject* out = new_tensor(out_ndim, out_shape, dtype, &a.out);
    if (out == nullptr) return nullptr;
    int64_t out_numel = 1;
    for (int d = 0; d < out_ndim; ++d) out_numel *= out_shape[d];
    if (out_numel == 0) return out;
    if (x.numel == 0) {  // sum of nothing is 0, mean of nothing is nan
      const float v = op == ReduceOp::mean ? std::nanf("") : 0.f;
      for (int64_t i = 0; i < out_numel; ++i) {
        if (dtype == DType::f32) static_cast<float*>(a.out)[i] = v;
        else if (dtype == DType::f16) static_cast<half_t*>(a.out)[i] = from_float<half_t>(v);
        else static_cast<bf16_t*>(a.out)[i] = from_float<bf16_t>(v);
      }
      return out;
    }
    run_released(x.numel, [&] { run(a, threads); });
    return out;
  }
};

}  // namespace

void bind_reduction(nb::module_& m) {
  nb::enum_<ReduceOp>(m, "ReduceOp")
      .value("sum", ReduceOp::sum)
      .value("mean", ReduceOp::mean)
      .value("amax", ReduceOp::amax);
  // axes: per input axis, whether it is reduced (the kernel object serves inputs of that rank)
  m.def("reduce",
        [](ReduceOp op, DType dtype, std::vector<bool> axes, bool keepdim, int threads, const std::string& d) {
          if (axes.size() > static_cast<size_t>(kMaxDims))
            throw nb::value_error("reduce: at most 16 dims are supported");
          auto k = std::make_unique<ReduceKernel>();
          k->reduce_axis = std::move(axes);
          k->keepdim = keepdim;
          k->op = op;
          k->run = require_kernel<ReduceArgs>("reduce", dtype);
          return finish(std::move(k), dtype, threads, d);
        });
}

}  // namespace tnc
