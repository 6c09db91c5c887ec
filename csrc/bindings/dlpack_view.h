// The slice of the DLPack C ABI (v1.x) the hot path reads, declared from the DLPack
// specification. torch >= 2.9 publishes a table of C functions as the PyCapsule
// torch.Tensor.__dlpack_c_exchange_api__ ("dlpack_exchange_api"); its
// dltensor_from_py_object_no_sync fills a non-owning DLTensor view of a tensor in tens
// of nanoseconds, which is how the engine reads tensors without linking libtorch.
#pragma once

#include <cstdint>

namespace tileops::dlpack {

struct Version {
  uint32_t major;
  uint32_t minor;
};

enum DeviceType : int32_t { kCPU = 1, kCUDA = 2 };

struct Device {
  int32_t device_type;
  int32_t device_id;
};

struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; NULL means compact row-major
  uint64_t byte_offset;
};

struct ExchangeApiHeader {
  Version version;
  ExchangeApiHeader* prev_api;
};

// Only the member this module calls is typed; the others keep their slots.
struct ExchangeApi {
  ExchangeApiHeader header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, Tensor* out);
  void* current_work_stream;
};

// One int that names a dtype in memo keys: (code, bits, lanes) packed.
inline int64_t dtype_word(DataType t) {
  return (int64_t{t.code} << 24) | (int64_t{t.bits} << 16) | int64_t{t.lanes};
}

}  // namespace tileops::dlpack
