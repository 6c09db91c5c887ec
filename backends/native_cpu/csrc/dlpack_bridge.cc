#include "dlpack_bridge.h"

#include "output_cache.h"
#include "tileops/capture_abi.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif
#include <cstdint>

namespace tnc {
namespace {

const dl::ExchangeApi* g_api = nullptr;      // null: no exchange API in this torch
bool g_force_fallback = false;
PyObject* g_torch_empty = nullptr;           // torch.empty, for the fallback allocator
PyObject* g_torch_dtypes[kNumDTypes] = {};  // torch dtype objects, indexed by DType
PyObject* g_str_dlpack = nullptr;
PyObject* g_str_dtype = nullptr;

bool dtype_from_dl(dl::DataType t, DType& out) {
  if (t.lanes != 1) return false;
  switch (t.code) {
    case dl::kFloat:
      if (t.bits == 32) return out = DType::f32, true;
      if (t.bits == 16) return out = DType::f16, true;
      return false;
    case dl::kBfloat: return t.bits == 16 ? (out = DType::bf16, true) : false;
    case dl::kBool: return t.bits == 8 ? (out = DType::b8, true) : false;
    case dl::kUInt: return t.bits == 8 ? (out = DType::u8, true) : false;
    case dl::kInt:
      if (t.bits == 8) return out = DType::i8, true;
      if (t.bits == 16) return out = DType::i16, true;
      if (t.bits == 32) return out = DType::i32, true;
      if (t.bits == 64) return out = DType::i64, true;
      return false;
    default: return false;
  }
}

dl::DataType dl_from_dtype(DType d) {
  switch (d) {
    case DType::f32: return {dl::kFloat, 32, 1};
    case DType::f16: return {dl::kFloat, 16, 1};
    case DType::bf16: return {dl::kBfloat, 16, 1};
    case DType::b8: return {dl::kBool, 8, 1};
    case DType::u8: return {dl::kUInt, 8, 1};
    case DType::i8: return {dl::kInt, 8, 1};
    case DType::i16: return {dl::kInt, 16, 1};
    case DType::i32: return {dl::kInt, 32, 1};
    case DType::i64: return {dl::kInt, 64, 1};
  }
  return {dl::kFloat, 32, 1};
}

bool fill_view(const dl::Tensor& t, TensorView& out, const char* what) {
  if (t.device.device_type != dl::kCPU) {
    PyErr_Format(PyExc_ValueError, "native_cpu kernels need CPU tensors; got %s on DLPack device type %d", what,
                 static_cast<int>(t.device.device_type));
    return false;
  }
  if (!dtype_from_dl(t.dtype, out.dtype)) {
    PyErr_Format(PyExc_TypeError, "native_cpu: %s has a dtype this backend has no kernel for (DLPack code %d, %d bits)",
                 what, static_cast<int>(t.dtype.code), static_cast<int>(t.dtype.bits));
    return false;
  }
  if (t.ndim > kMaxDims) {
    PyErr_Format(PyExc_ValueError, "native_cpu: %s has %d dims; at most %d are supported", what,
                 static_cast<int>(t.ndim), kMaxDims);
    return false;
  }
  out.ndim = t.ndim;
  out.numel = 1;
  int64_t expected = 1;
  bool contiguous = true;
  for (int d = t.ndim - 1; d >= 0; --d) {
    out.shape[d] = t.shape[d];
    out.numel *= t.shape[d];
    if (t.strides != nullptr && t.shape[d] != 1 && t.strides[d] != expected) contiguous = false;
    expected *= t.shape[d];
  }
  if (!contiguous && out.numel > 0) {
    PyErr_Format(PyExc_ValueError, "native_cpu kernels take contiguous tensors; %s is strided (call .contiguous())",
                 what);
    return false;
  }
  out.data = static_cast<char*>(t.data) + t.byte_offset;
  return true;
}

bool read_with_dlpack_method(PyObject* obj, TensorView& out, const char* what) {
  PyObject* capsule = PyObject_CallMethodNoArgs(obj, g_str_dlpack);
  if (capsule == nullptr) return false;
  auto* managed = static_cast<dl::ManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed == nullptr) {
    Py_DECREF(capsule);
    return false;
  }
  const bool ok = fill_view(managed->dl_tensor, out, what);
  // We consumed the capsule: release the export now. The tensor itself is still held by
  // the caller's arguments, so the data stays valid for the whole kernel call.
  PyCapsule_SetName(capsule, "used_dltensor");
  if (managed->deleter != nullptr) managed->deleter(managed);
  Py_DECREF(capsule);
  return ok;
}

void set_error(void*, const char* kind, const char* message) {
  PyErr_Format(PyExc_RuntimeError, "%s: %s", kind, message);
}

}  // namespace

void bridge_init(PyObject* capsule, PyObject* torch_empty, PyObject* const torch_dtypes[kNumDTypes]) {
  g_api = nullptr;
  if (capsule != nullptr && capsule != Py_None && PyCapsule_IsValid(capsule, "dlpack_exchange_api")) {
    auto* api = static_cast<const dl::ExchangeApi*>(PyCapsule_GetPointer(capsule, "dlpack_exchange_api"));
    // the members we use exist from DLPack 1.2 on
    if (api != nullptr && api->header.version.major == 1 && api->header.version.minor >= 2) g_api = api;
  }
  Py_XINCREF(torch_empty);
  g_torch_empty = torch_empty;
  for (int i = 0; i < kNumDTypes; ++i) {
    Py_XINCREF(torch_dtypes[i]);
    g_torch_dtypes[i] = torch_dtypes[i];
  }
  if (g_str_dlpack == nullptr) g_str_dlpack = PyUnicode_InternFromString("__dlpack__");
  if (g_str_dtype == nullptr) g_str_dtype = PyUnicode_InternFromString("dtype");
}

void bridge_force_fallback(bool on) { g_force_fallback = on; }
bool bridge_uses_exchange_api() { return g_api != nullptr && !g_force_fallback; }

bool read_tensor(PyObject* obj, TensorView& out, const char* what) {
  if (g_api != nullptr && !g_force_fallback) {
    dl::Tensor t;
    if (g_api->dltensor_from_py_object_no_sync(obj, &t) != 0) {
      if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "native_cpu: %s is not a torch.Tensor", what);
      return false;
    }
    return fill_view(t, out, what);
  }
  return read_with_dlpack_method(obj, out, what);
}

static int64_t byte_size(int ndim, const int64_t* shape, DType dtype) {
  int64_t bytes = dl_from_dtype(dtype).bits / 8;
  for (int i = 0; i < ndim; ++i) bytes *= shape[i];
  return bytes;
}

// A large fresh output is first touched by the kernel: 4 KiB page faults alone are a
// large share of a call writing tens of MiB (glibc maps such blocks anew on every
// allocation). Where
// transparent huge pages are on `madvise`, ask for them on the block's 2 MiB-aligned
// interior (a no-op for memory already mapped, and harmless where THP is off). Outputs
// the warm-output cache serves already are huge pages; this is for the rest (the cache
// off, the fallback bridge).
static void advise_huge_pages(void* data, int64_t bytes) {
#if defined(__linux__)
  constexpr uintptr_t kHuge = kHugePageBytes;
  if (bytes < (int64_t{16} << 20)) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + static_cast<uintptr_t>(bytes)) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data, (void)bytes;
#endif
}

namespace {

// An output in a block of the warm-output cache (output_cache.h): torch owns it through
// DLPack, and its deleter gives the block back.
struct CachedOutput {
  dl::ManagedTensorVersioned managed{};
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  OutputBlock block;
};

void give_back_cached_output(dl::ManagedTensorVersioned* self) {
  auto* out = static_cast<CachedOutput*>(self->manager_ctx);
  output_cache_give(out->block);
  delete out;
}

PyObject* new_cached_tensor(OutputBlock block, int ndim, const int64_t* shape, DType dtype, void** data) {
  auto* out = new CachedOutput();
  out->block = block;
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    out->shape[d] = shape[d];
    out->strides[d] = stride;
    stride *= shape[d];
  }
  dl::ManagedTensorVersioned& m = out->managed;
  m.version = {1, 1};
  m.manager_ctx = out;
  m.deleter = give_back_cached_output;
  m.dl_tensor.data = block.data;
  m.dl_tensor.device = {dl::kCPU, 0};
  m.dl_tensor.ndim = ndim;
  m.dl_tensor.dtype = dl_from_dtype(dtype);
  m.dl_tensor.shape = out->shape;
  m.dl_tensor.strides = out->strides;
  void* result = nullptr;
  if (g_api->managed_tensor_to_py_object_no_sync(&m, &result) != 0) {
    give_back_cached_output(&m);  // not taken: DLPack hands ownership over on success only
    return nullptr;
  }
  *data = block.data;
  return static_cast<PyObject*>(result);
}

// tileops' capture ABI, imported at the first output (tileops is loaded by then: it is
// what builds our kernels); null where this tileops predates it.
const tileops_capture_abi* capture_abi() {
  static const tileops_capture_abi* abi = [] {
    auto* found = static_cast<const tileops_capture_abi*>(PyCapsule_Import(TILEOPS_CAPTURE_ABI_CAPSULE, 0));
    if (found == nullptr || found->version != TILEOPS_CAPTURE_ABI_VERSION) {
      PyErr_Clear();
      return static_cast<const tileops_capture_abi*>(nullptr);
    }
    return found;
  }();
  return abi;
}

}  // namespace

PyObject* new_tensor(int ndim, const int64_t* shape, DType dtype, void** data) {
  const tileops_capture_abi* capture = capture_abi();
  if (capture != nullptr && capture->in_launch()) {
    auto make = [](void* ctx, int n, const int64_t* dims, void** out) -> void* {
      return allocate_tensor(n, dims, *static_cast<const DType*>(ctx), out);
    };
    return static_cast<PyObject*>(capture->output(ndim, shape, static_cast<int64_t>(dtype), data, make, &dtype));
  }
  return allocate_tensor(ndim, shape, dtype, data);
}

PyObject* allocate_tensor(int ndim, const int64_t* shape, DType dtype, void** data) {
  if (g_api != nullptr && !g_force_fallback) {
    const int64_t bytes = byte_size(ndim, shape, dtype);
    const OutputBlock block = output_cache_take(static_cast<size_t>(bytes));
    if (block.data != nullptr) return new_cached_tensor(block, ndim, shape, dtype, data);
    dl::Tensor proto{};
    proto.device = {dl::kCPU, 0};
    proto.ndim = ndim;
    proto.dtype = dl_from_dtype(dtype);
    proto.shape = const_cast<int64_t*>(shape);
    dl::ManagedTensorVersioned* managed = nullptr;
    if (g_api->managed_tensor_allocator(&proto, &managed, nullptr, set_error) != 0 || managed == nullptr) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_MemoryError, "native_cpu: torch could not allocate an output");
      return nullptr;
    }
    *data = static_cast<char*>(managed->dl_tensor.data) + managed->dl_tensor.byte_offset;
    advise_huge_pages(*data, bytes);
    void* result = nullptr;
    if (g_api->managed_tensor_to_py_object_no_sync(managed, &result) != 0) return nullptr;
    return static_cast<PyObject*>(result);
  }
  if (g_torch_empty == nullptr) {
    PyErr_SetString(PyExc_RuntimeError,
                    "native_cpu: the torch bridge was not initialised (tileops_native_cpu.builders does it)");
    return nullptr;
  }
  PyObject* dims = PyTuple_New(ndim);
  for (int i = 0; i < ndim; ++i) PyTuple_SET_ITEM(dims, i, PyLong_FromLongLong(shape[i]));
  PyObject* args = PyTuple_Pack(1, dims);
  PyObject* kwargs = PyDict_New();
  PyDict_SetItem(kwargs, g_str_dtype, g_torch_dtypes[static_cast<int>(dtype)]);
  PyObject* result = PyObject_Call(g_torch_empty, args, kwargs);
  Py_DECREF(kwargs);
  Py_DECREF(args);
  Py_DECREF(dims);
  if (result == nullptr) return nullptr;
  TensorView v;
  if (!read_with_dlpack_method(result, v, "output")) {
    Py_DECREF(result);
    return nullptr;
  }
  *data = v.data;
  advise_huge_pages(*data, byte_size(ndim, shape, dtype));
  return result;
}

}  // namespace tnc
