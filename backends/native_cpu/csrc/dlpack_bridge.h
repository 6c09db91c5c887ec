// Reading torch tensors and making new ones from C++ without linking libtorch.
//
// Fast path: torch's DLPack C exchange API (a PyCapsule "dlpack_exchange_api" on
// torch.Tensor.__dlpack_c_exchange_api__, DLPack >= 1.2): a non-owning DLTensor view of a
// tensor in tens of nanoseconds, and torch's own allocator for outputs.
// Fallback (older torch, or forced for tests): tensor.__dlpack__() to read, torch.empty to
// allocate. The DLPack structs are the repository's one declaration (dlpack_abi.h).
#pragma once

#include <Python.h>

#include <cstdint>

#include "dlpack_abi.h"
#include "dtypes.h"

namespace tnc {

namespace dl = ::tileops::dlpack;

struct TensorView {
  void* data;
  int ndim;
  DType dtype;
  int64_t numel;
  int64_t shape[kMaxDims];
};

// Set once from Python before the first kernel is built; torch_dtypes[d] is the torch dtype
// of DType d.
void bridge_init(PyObject* exchange_capsule_or_none, PyObject* torch_empty, PyObject* const torch_dtypes[kNumDTypes]);
void bridge_force_fallback(bool on);
bool bridge_uses_exchange_api();

// Both return false with a Python exception set. `what` names the argument in errors.
bool read_tensor(PyObject* obj, TensorView& out, const char* what);
// New CPU tensor (a kernel's output); returns a new reference and its data pointer, or null
// with an exception. While the op layer captures or replays the launch that calls it
// (tileops.capture, through tileops/capture_abi.h), the capture hands it out: made once,
// the same tensor on every replay.
PyObject* new_tensor(int ndim, const int64_t* shape, DType dtype, void** data);
// What new_tensor does outside a capture: a fresh tensor from torch (or the warm-output cache).
PyObject* allocate_tensor(int ndim, const int64_t* shape, DType dtype, void** data);

}  // namespace tnc
