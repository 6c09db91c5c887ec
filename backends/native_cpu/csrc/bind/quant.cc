// Marshalling of the quant family (kernels/gemm_quant*.h): GEMMs over GGUF rows of GGML
// blocks and over 4-bit groups, and the GGUF embedding lookup.
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <string>

#include "bind/kernel.h"
#include "kernels/quant_args.h"

namespace tnc {
namespace {

GgmlBlock require_ggml(int type) {
  const GgmlBlock info = ggml_block(static_cast<GgmlType>(type));
  if (info.block == 0) throw nb::value_error(("native_cpu serves no GGML type number " + std::to_string(type)).c_str());
  return info;
}

// A tensor of a fixed dtype, whatever the kernel's (the weights' bytes, zero points, ids).
bool read_as(const Kernel& k, PyObject* obj, TensorView& v, const char* what, DType want) {
  if (!read_tensor(obj, v, what)) return false;
  if (v.dtype == want) return true;
  PyErr_Format(PyExc_TypeError, "%s takes %s as %s; got %s", k.description.c_str(), what, dtype_name(want),
               dtype_name(v.dtype));
  return false;
}

// The [m, n] result of a quantized GEMM's args g (its d set here): zeros for K = 0, else
// run(g) with the GIL released.
template <class Args>
PyObject* gemm_output(const Kernel& k, Args& g, KernelFn<Args> run) {
  const int64_t shape[2] = {g.m, g.n};
  PyObject* out = new_tensor(2, shape, k.dtype, &g.d);
  if (out == nullptr || g.m * g.n == 0) return out;
  if (g.k == 0) {
    std::memset(g.d, 0, static_cast<size_t>(g.m * g.n * dtype_size(k.dtype)));
    return out;
  }
  run_released(g.m * g.n * g.k, [&] { run(g, k.threads); });
  return out;
}

// activation [M, K] (the kernel's dtype), weight uint8 [N, K / block * bytes] -> [M, N]
struct GemmGgufKernel final : Kernel {
  int type;
  GgmlBlock info;
  KernelFn<GemmGgufArgs> run;
  KernelFn<GemmArgs> gemm;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 2)) return nullptr;
    TensorView x, w;
    if (!read(*this, args[0], x, "activation") || !read_as(*this, args[1], w, "weight", DType::u8)) return nullptr;
    if (x.ndim != 2 || x.shape[1] % info.block != 0)
      return shape_error(*this,
                         ("activation must be [M, K] with K a multiple of " + std::to_string(info.block)).c_str(), x,
                         "activation");
    const int64_t row = x.shape[1] / info.block * info.bytes;
    if (w.ndim != 2 || w.shape[1] != row) {
      std::string want = "weight must be [N, ";  // (built by appending: GCC 12 warns falsely on "[" + a + b)
      want.append(std::to_string(row)).append("]: rows of the activation's K=").append(std::to_string(x.shape[1]));
      want.append(" weights in blocks of ").append(std::to_string(info.block)).append(" (");
      want.append(std::to_string(info.bytes)).append(" bytes each)");
      return shape_error(*this, want.c_str(), w, "weight");
    }
    GemmGgufArgs g{};
    g.a = x.data;
    g.w = static_cast<const uint8_t*>(w.data);
    g.m = x.shape[0];
    g.k = x.shape[1];
    g.n = w.shape[0];
    g.row_bytes = row;
    g.gemm = gemm;
    return gemm_output(*this, g, run);
  }
};

// activation [M, K], packed_weight uint8 [N, K / 2], weight_scale float32|float16 [N, K / group],
// weight_zero uint8 [N, K / group] -> [M, N]
struct GemmW4A16Kernel final : Kernel {
  int64_t group;
  KernelFn<GemmW4A16Args> run;
  KernelFn<GemmArgs> gemm;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 4)) return nullptr;
    TensorView x, w, s, z;
    if (!read(*this, args[0], x, "activation") || !read_as(*this, args[1], w, "packed_weight", DType::u8) ||
        !read_tensor(args[2], s, "weight_scale") || !read_as(*this, args[3], z, "weight_zero", DType::u8))
      return nullptr;
    if (s.dtype != DType::f32 && s.dtype != DType::f16) {
      PyErr_Format(PyExc_TypeError, "%s takes weight_scale as float32 or float16; got %s", description.c_str(),
                   dtype_name(s.dtype));
      return nullptr;
    }
    const std::string gs = std::to_string(group);
    if (x.ndim != 2 || x.shape[1] % group != 0)
      return shape_error(*this, ("activation must be [M, K] with K a multiple of group_size " + gs).c_str(), x,
                         "activation");
    const int64_t k = x.shape[1];
    if (w.ndim != 2 || w.shape[1] * 2 != k)
      return shape_error(*this, ("packed_weight must be [N, " + std::to_string(k / 2) + "]").c_str(), w,
                         "packed_weight");
    std::string want = "[";  // (built by appending: GCC 12 warns falsely on "[" + a + b)
    want.append(std::to_string(w.shape[0])).append(", ").append(std::to_string(k / group)).append("]");
    if (s.ndim != 2 || s.shape[0] != w.shape[0] || s.shape[1] != k / group)
      return shape_error(*this, ("weight_scale must be " + want).c_str(), s, "weight_scale");
    if (z.ndim != 2 || z.shape[0] != w.shape[0] || z.shape[1] != k / group)
      return shape_error(*this, ("weight_zero must be " + want).c_str(), z, "weight_zero");
    GemmW4A16Args g{};
    g.a = x.data;
    g.w = static_cast<const uint8_t*>(w.data);
    g.scale = s.data;
    g.zero = static_cast<const uint8_t*>(z.data);
    g.scale_f16 = s.dtype == DType::f16;
    g.m = x.shape[0];
    g.k = k;
    g.n = w.shape[0];
    g.group = group;
    g.gemm = gemm;
    return gemm_output(*this, g, run);
  }
};

// ids int32|int64 [T], weight uint8 [V, row bytes] -> [T, row's weights] (the kernel's dtype)
struct EmbeddingGgufKernel final : Kernel {
  int type;
  GgmlBlock info;
  KernelFn<EmbeddingGgufArgs> run;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 2)) return nullptr;
    TensorView ids, w;
    if (!read_tensor(args[0], ids, "ids") || !read_as(*this, args[1], w, "weight", DType::u8)) return nullptr;
    if (ids.dtype != DType::i32 && ids.dtype != DType::i64) {
      PyErr_Format(PyExc_TypeError, "%s takes ids as int32 or int64; got %s", description.c_str(),
                   dtype_name(ids.dtype));
      return nullptr;
    }
    if (ids.ndim != 1) return shape_error(*this, "ids must be 1-D", ids, "ids");
    if (w.ndim != 2 || w.shape[1] % info.bytes != 0)
      return shape_error(
          *this,
          ("weight must be [V, row bytes], rows of whole " + std::to_string(info.bytes) + "-byte blocks").c_str(), w,
          "weight");
    EmbeddingGgufArgs e{};
    e.ids = ids.data;
    e.ids_64 = ids.dtype == DType::i64;
    e.w = static_cast<const uint8_t*>(w.data);
    e.t = ids.shape[0];
    e.vocab = w.shape[0];
    e.row_bytes = w.shape[1];
    e.dim = w.shape[1] / info.bytes * info.block;
    // every id is checked before any row is read: an id outside the table is refused, never read
    for (int64_t i = 0; i < e.t; ++i) {
      const int64_t id = e.ids_64 ? static_cast<const int64_t*>(e.ids)[i] : static_cast<const int32_t*>(e.ids)[i];
      if (id < 0 || id >= e.vocab) {
        PyErr_Format(PyExc_IndexError, "%s: ids[%lld] = %lld is outside the table's %lld rows", description.c_str(),
                     static_cast<long long>(i), static_cast<long long>(id), static_cast<long long>(e.vocab));
        return nullptr;
      }
    }
    const int64_t shape[2] = {e.t, e.dim};
    PyObject* out = new_tensor(2, shape, dtype, &e.out);
    if (out == nullptr) return nullptr;
    if (e.t * e.dim > 0) run_released(e.t * e.dim, [&] { run(e, threads); });
    return out;
  }
};

}  // namespace

void bind_quant(nb::module_& m) {
  m.def("gemm_gguf", [](DType dtype, int type, int threads, const std::string& d) {
    auto k = std::make_unique<GemmGgufKernel>();
    k->type = type;
    k->info = require_ggml(type);
    k->run = require_kernel<GemmGgufArgs>("gemm_gguf", dtype, type, "this GGML type");
    k->gemm = require_kernel<GemmArgs>("gemm", dtype);
    return finish(std::move(k), dtype, threads, d);
  });
  m.def("gemm_w4a16", [](DType dtype, int64_t group, int threads, const std::string& d) {
    if (group < 2 || group % 2 != 0) throw nb::value_error("gemm_w4a16: group_size must be even and >= 2");
    auto k = std::make_unique<GemmW4A16Kernel>();
    k->group = group;
    k->run = require_kernel<GemmW4A16Args>("gemm_w4a16", dtype);
    k->gemm = require_kernel<GemmArgs>("gemm", dtype);
    return finish(std::move(k), dtype, threads, d);
  });
  m.def("embedding_gguf", [](DType dtype, int type, int threads, const std::string& d) {
    auto k = std::make_unique<EmbeddingGgufKernel>();
    k->type = type;
    k->info = require_ggml(type);
    k->run = require_kernel<EmbeddingGgufArgs>("embedding_gguf", dtype, type, "this GGML type");
    return finish(std::move(k), dtype, threads, d);
  });
}

}  // namespace tnc
