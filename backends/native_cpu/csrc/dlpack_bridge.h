// Reading torch tensors and making new ones from C++ without linking libtorch.
//
// Fast path: torch's DLPack C exchange API (a PyCapsule "dlpack_exchange_api" on
// torch.Tensor.__dlpack_c_exchange_api__, DLPack >= 1.2): a non-owning DLTensor view of a
// tensor in tens of nanoseconds, and torch's own allocator for outputs.
// Fallback (older torch, or forced for tests): tensor.__dlpack__() to read, torch.empty to
// allocate. The struct layouts below are written from the DLPack 1.3 specification; only
// the members we use are named, the rest keep the layout.
#pragma once

#include <Python.h>

#include <cstdint>

#include "dtypes.h"
#include "kernel_table.h"

namespace tnc {

namespace dl {

struct Version {
  uint32_t major;
  uint32_t minor;
};
struct Device {
  int32_t device_type;  // 1 = CPU
  int32_t device_id;
};
struct DataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat, 6 bool
  uint8_t bits;
  uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // may be null: compact row-major
  uint64_t byte_offset;
};
struct ManagedTensor {  // legacy, unversioned: what __dlpack__() returns by default
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor*);
};
struct ManagedTensorVersioned {
  Version version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned*);
  uint64_t flags;
  Tensor dl_tensor;
};
struct ExchangeApiHeader {
  Version version;
  ExchangeApiHeader* prev_api;
};
struct ExchangeApi {
  ExchangeApiHeader header;
  int (*managed_tensor_allocator)(Tensor* prototype, ManagedTensorVersioned** out, void* error_ctx,
                                  void (*set_error)(void* error_ctx, const char* kind, const char* message));
  int (*managed_tensor_from_py_object_no_sync)(void* py_object, ManagedTensorVersioned** out);
  int (*managed_tensor_to_py_object_no_sync)(ManagedTensorVersioned* tensor, void** out_py_object);
  int (*dltensor_from_py_object_no_sync)(void* py_object, Tensor* out);
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_stream);
};

}  // namespace dl

struct TensorView {
  void* data;
  int ndim;
  DType dtype;
  int64_t numel;
  int64_t shape[kMaxDims];
};

// Set once from Python before the first kernel is built.
void bridge_init(PyObject* exchange_capsule_or_none, PyObject* torch_empty, PyObject* torch_dtypes);
void bridge_force_fallback(bool on);
bool bridge_uses_exchange_api();

// Both return false with a Python exception set. `what` names the argument in errors.
bool read_tensor(PyObject* obj, TensorView& out, const char* what);
// New CPU tensor; returns a new reference and its data pointer, or null with an exception.
PyObject* new_tensor(int ndim, const int64_t* shape, DType dtype, void** data);

const char* dtype_name(DType d);

}  // namespace tnc
