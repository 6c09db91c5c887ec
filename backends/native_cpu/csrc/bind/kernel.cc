#include "bind/kernel.h"

#include <cstdlib>
#include <string>

namespace tnc {
namespace {

struct IsaBuild {
  const char* name;
  void (*register_kernels)(KernelTable&);
};

// The best build this CPU runs, unless TILEOPS_NATIVE_CPU_ISA names another it runs.
IsaBuild pick_build() {
  const IsaBuild baseline{"baseline", register_kernels_baseline};
  const char* forced = std::getenv("TILEOPS_NATIVE_CPU_ISA");
  const std::string want = forced ? forced : "";
#if defined(TNC_HAVE_X86_KERNELS)
  __builtin_cpu_init();
#if defined(TNC_HAVE_AVX512_KERNELS)
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16") &&
                      __builtin_cpu_supports("avx512vnni");
  const IsaBuild avx512_build{"avx512", register_kernels_avx512};
#else
  const bool avx512 = false;  // built without it (TNC_AVX512=OFF), so never picked
  const IsaBuild avx512_build{"avx512", nullptr};
#endif
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  const IsaBuild avx2_build{"avx2", register_kernels_avx2};
  if (want == "baseline") return baseline;
  if (want == "avx2" && avx2) return avx2_build;
  if (want.empty() || want == "avx512") {
    if (avx512) return avx512_build;
    if (avx2) return avx2_build;
  }
  if (want == "avx2" || want.empty()) return avx2 ? avx2_build : baseline;
#endif
  return baseline;
}

}  // namespace

const KernelTable& isa() {
  static const KernelTable table = [] {  // only the picked build registers its kernels
    const IsaBuild build = pick_build();
    KernelTable t(build.name);
    build.register_kernels(t);
    return t;
  }();
  return table;
}

void throw_no_kernel(const char* name, DType dtype, const char* variant_name) {
  std::string message = std::string("native_cpu has no '") + name + "' kernel for " + dtype_name(dtype);
  if (variant_name != nullptr) message += std::string(" and ") + variant_name;
  message +=
      std::string(" in its ") + isa().isa() + " build; its family's kernel file (kernels/) registers what there is";
  throw nb::value_error(message.c_str());
}

bool expect_args(const Kernel& k, Py_ssize_t nargs, Py_ssize_t want) {
  if (nargs == want) return true;
  PyErr_Format(PyExc_TypeError, "%s takes %zd tensors; got %zd", k.description.c_str(), want, nargs);
  return false;
}

bool expect_dtype(const Kernel& k, const TensorView& v, const char* what) {
  if (v.dtype == k.dtype) return true;
  PyErr_Format(PyExc_TypeError, "%s was built for %s; got %s of dtype %s", k.description.c_str(), dtype_name(k.dtype),
               what, dtype_name(v.dtype));
  return false;
}

bool read(const Kernel& k, PyObject* obj, TensorView& v, const char* what) {
  return read_tensor(obj, v, what) && expect_dtype(k, v, what);
}

PyObject* shape_error(const Kernel& k, const char* message, const TensorView& v, const char* what) {
  std::string dims = "(";
  for (int i = 0; i < v.ndim; ++i) dims += std::to_string(v.shape[i]) + (i + 1 < v.ndim || v.ndim == 1 ? ", " : "");
  dims += ")";
  PyErr_Format(PyExc_ValueError, "%s: %s; got %s with shape %s", k.description.c_str(), message, what, dims.c_str());
  return nullptr;
}

PyObject* new_pair(PyObject* first, PyObject* second) {
  PyObject* t = PyTuple_New(2);
  if (t == nullptr) {
    Py_DECREF(first);
    Py_DECREF(second);
    return nullptr;
  }
  PyTuple_SET_ITEM(t, 0, first);
  PyTuple_SET_ITEM(t, 1, second);
  return t;
}

}  // namespace tnc
