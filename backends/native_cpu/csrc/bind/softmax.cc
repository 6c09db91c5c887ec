// Marshalling of the softmax family (kernels/softmax.h): softmax and log-softmax along one axis.
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include "bind/kernel.h"
#include "kernels/softmax_args.h"

namespace tnc {
namespace {

struct SoftmaxKernel final : Kernel {
  int dim;  // normalised, or -1 for a 0-dim input
  bool log;
  KernelFn<SoftmaxArgs> run;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 1)) return nullptr;
    TensorView x;
    if (!read(*this, args[0], x, "x")) return nullptr;
    if (dim >= x.ndim && !(x.ndim == 0 && dim == 0)) return shape_error(*this, "dim out of range for x", x, "x");
    SoftmaxArgs a{};
    a.x = x.data;
    a.log = log;
    a.outer = 1;
    a.n = x.ndim == 0 ? 1 : x.shape[dim];
    a.inner = 1;
    for (int d = 0; d < dim && d < x.ndim; ++d) a.outer *= x.shape[d];
    for (int d = dim + 1; d < x.ndim; ++d) a.inner *= x.shape[d];
    PyObject* out = new_tensor(x.ndim, x.shape, dtype, &a.out);
    if (out == nullptr) return nullptr;
    if (x.numel > 0) run_released(x.numel, [&] { run(a, threads); });
    return out;
  }
};

}  // namespace

void bind_softmax(nb::module_& m) {
  // dim: the softmax axis, already normalised (>= 0; 0 for a 0-dim x)
  m.def("softmax", [](DType dtype, int dim, bool log, int threads, const std::string& d) {
    if (dim < 0) throw nb::value_error("softmax: dim must be normalised to >= 0");
    auto k = std::make_unique<SoftmaxKernel>();
    k->dim = dim;
    k->log = log;
    k->run = require_kernel<SoftmaxArgs>("softmax", dtype);
    return finish(std::move(k), dtype, threads, d);
  });
}

}  // namespace tnc
