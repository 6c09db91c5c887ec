// What every family's marshalling (bind/<family>.cc) shares: the kernel object whose
// __call__ (module.cc) comes straight to Kernel::call, the ISA's kernel table, and the
// helpers a call uses to read its tensors and refuse what it was not built for.
//
// A family's marshalling defines one Kernel subclass per kernel object: call() reads the
// tensors (DLPack views), checks them against what the object was built for, allocates the
// outputs through torch, fills the family's args and runs the kernel function it looked up
// when it was built. Its bind_<family>() adds the constructors (and any kind enums) to the
// module.
#pragma once

#include <nanobind/nanobind.h>

#include <memory>
#include <string>

#include "dlpack_bridge.h"
#include "dtypes.h"
#include "kernel_table.h"

namespace tnc {

namespace nb = nanobind;

struct Kernel {
  std::string description;
  DType dtype = DType::f32;
  int threads = 1;
  virtual ~Kernel() = default;
  // Returns a new reference, or null with a Python exception set.
  virtual PyObject* call(PyObject* const* args, Py_ssize_t nargs) = 0;
};

// The kernels of the instruction set picked for this CPU, once
// (TILEOPS_NATIVE_CPU_ISA=baseline|avx2|avx512 forces one).
const KernelTable& isa();

[[noreturn]] void throw_no_kernel(const char* name, DType dtype, const char* variant_name);

// The kernel registered under (name, dtype, variant); a Python ValueError naming them if
// this build has none (`variant_name` names the variant in that message).
template <class Args>
KernelFn<Args> require_kernel(const char* name, DType dtype, int variant = 0, const char* variant_name = nullptr) {
  if (KernelFn<Args> fn = isa().find<Args>(name, dtype, variant)) return fn;
  throw_no_kernel(name, dtype, variant_name);
}

// Fills what every kernel object carries.
template <class K>
std::unique_ptr<Kernel> finish(std::unique_ptr<K> k, DType dtype, int threads, const std::string& description) {
  k->dtype = dtype;
  k->threads = std::max(1, threads);
  k->description = description;
  return k;
}

// Releases the GIL while a kernel runs on enough data to be worth the switch.
template <class Fn>
void run_released(int64_t work, Fn&& fn) {
  if (work < (1 << 16)) {
    fn();
    return;
  }
  PyThreadState* state = PyEval_SaveThread();
  fn();
  PyEval_RestoreThread(state);
}

// Each returns false (or null) with a Python exception set; `what` names the argument.
bool expect_args(const Kernel& k, Py_ssize_t nargs, Py_ssize_t want);
bool expect_dtype(const Kernel& k, const TensorView& v, const char* what);
// read_tensor, then the dtype the kernel was built for
bool read(const Kernel& k, PyObject* obj, TensorView& v, const char* what);
PyObject* shape_error(const Kernel& k, const char* message, const TensorView& v, const char* what);
// A 2-tuple of two new references, which it steals (both released if it cannot be made).
PyObject* new_pair(PyObject* first, PyObject* second);

// The families' marshalling, called by module.cc.
void bind_attention(nb::module_& m);
void bind_elementwise(nb::module_& m);
void bind_gemm(nb::module_& m);
void bind_moe(nb::module_& m);
void bind_norm(nb::module_& m);
void bind_reduction(nb::module_& m);
void bind_probe(nb::module_& m);
void bind_quant(nb::module_& m);
void bind_rope(nb::module_& m);
void bind_softmax(nb::module_& m);

}  // namespace tnc
