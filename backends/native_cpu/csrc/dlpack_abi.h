// The DLPack C ABI (v1.x) as tileops uses it, declared from the DLPack specification
// (names without the spec's DL prefix; members tileops never reads keep their slots).
// torch >= 2.9 publishes a table of C functions as the PyCapsule
// torch.Tensor.__dlpack_c_exchange_api__ ("dlpack_exchange_api", DLPack >= 1.2): its
// dltensor_from_py_object_no_sync fills a non-owning Tensor view of a torch tensor in tens
// of nanoseconds, and managed_tensor_allocator / managed_tensor_to_py_object_no_sync make
// new tensors with torch's allocator. That is how C++ here reads and makes tensors without
// linking libtorch.
//
// Declared once for the repository: csrc/bindings/dlpack_abi.h is the canonical file.
// backends/native_cpu/csrc/dlpack_abi.h is a byte-identical copy, because that package
// builds from its own folder; backends/native_cpu/tests/test_dlpack_abi.py fails when the
// two differ (edit the canonical file, then copy it over).
#pragma once

#include <cstdint>

namespace tileops::dlpack {

struct Version {
  uint32_t major;
  uint32_t minor;
};

enum DeviceType : int32_t { kCPU = 1, kCUDA = 2 };

struct Device {
  int32_t device_type;  // a DeviceType
  int32_t device_id;
};

enum DataTypeCode : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBfloat = 4, kBool = 6 };

struct DataType {
  uint8_t code;  // a DataTypeCode
  uint8_t bits;
  uint16_t lanes;
};

struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null means compact row-major
  uint64_t byte_offset;
};

// Legacy and unversioned: what tensor.__dlpack__() returns by default (capsule "dltensor").
struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};

struct ManagedTensorVersioned {
  Version version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned* self);
  uint64_t flags;
  Tensor dl_tensor;
};

struct ExchangeApiHeader {
  Version version;
  ExchangeApiHeader* prev_api;
};

// The functions return 0 on success; on failure a Python exception is set.
struct ExchangeApi {
  ExchangeApiHeader header;
  int (*managed_tensor_allocator)(Tensor* prototype, ManagedTensorVersioned** out, void* error_ctx,
                                  void (*set_error)(void* error_ctx, const char* kind, const char* message));
  int (*managed_tensor_from_py_object_no_sync)(void* py_object, ManagedTensorVersioned** out);
  int (*managed_tensor_to_py_object_no_sync)(ManagedTensorVersioned* tensor, void** out_py_object);
  int (*dltensor_from_py_object_no_sync)(void* py_object, Tensor* out);
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_stream);
};

}  // namespace tileops::dlpack
