// tileops_native_cpu._C: kernel objects whose __call__ is a C++ type slot. Builders (in
// Python) fix the compile-time values and construct one of these; a call reads its tensors
// through the DLPack bridge, allocates outputs through torch and runs the ISA's kernel.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dlpack_bridge.h"
#include "kernel_table.h"
#include "thread_pool.h"

namespace nb = nanobind;

namespace tnc {
namespace {

const Table* pick_table() {
  const char* forced = std::getenv("TILEOPS_NATIVE_CPU_ISA");
  const std::string want = forced ? forced : "";
#if defined(TNC_HAVE_X86_KERNELS)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  if (want == "baseline") return &table_baseline();
  if (want == "avx2" && avx2) return &table_avx2();
  if (want.empty() || want == "avx512") {
    if (avx512) return &table_avx512();
    if (avx2) return &table_avx2();
  }
  if (want == "avx2" || want.empty()) return avx2 ? &table_avx2() : &table_baseline();
#endif
  return &table_baseline();
}

const Table& isa() {
  static const Table* t = pick_table();
  return *t;
}

int float_index(DType d) { return static_cast<int>(d); }  // f32, f16, bf16 are 0..2

// ---------------------------------------------------------------------------------------

struct Kernel {
  std::string description;
  DType dtype = DType::f32;
  int threads = 1;
  virtual ~Kernel() = default;
  // Returns a new reference, or null with a Python exception set.
  virtual PyObject* call(PyObject* const* args, Py_ssize_t nargs) = 0;
};

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

bool expect_args(const Kernel& k, Py_ssize_t nargs, Py_ssize_t want) {
  if (nargs == want) return true;
  PyErr_Format(PyExc_TypeError, "%s takes %zd tensors; got %zd", k.description.c_str(), want, nargs);
  return false;
}

bool expect_dtype(const Kernel& k, const TensorView& v, const char* what) {
  if (v.dtype == k.dtype) return true;
  PyErr_Format(PyExc_TypeError, "%s was built for %s; got %s of dtype %s", k.description.c_str(), dtype_name(k.dtype), what,
               dtype_name(v.dtype));
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

// ---------------------------------------------------------------------------------------

enum class RowNorm { rms, fused_add_rms, layer };

struct RowNormKernel final : Kernel {
  RowNorm kind;
  int64_t n;
  float eps;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    const Py_ssize_t want = kind == RowNorm::rms ? 2 : 3;
    if (!expect_args(*this, nargs, want)) return nullptr;
    TensorView x, second, third;
    if (!read(*this, args[0], x, "x") || !read(*this, args[1], second, kind == RowNorm::fused_add_rms ? "residual" : "weight"))
      return nullptr;
    if (want == 3 && !read(*this, args[2], third, kind == RowNorm::layer ? "bias" : "weight")) return nullptr;
    const TensorView& w = kind == RowNorm::fused_add_rms ? third : second;
    if (x.ndim == 0 || n <= 0 || x.numel % n != 0)
      return shape_error(*this, "x must end in the normalized shape", x, "x");
    if (w.numel != n) return shape_error(*this, "weight must hold the normalized shape", w, "weight");
    if (kind == RowNorm::fused_add_rms && second.numel != x.numel)
      return shape_error(*this, "residual must have x's shape", second, "residual");
    if (kind == RowNorm::layer && third.numel != n) return shape_error(*this, "bias must hold the normalized shape", third, "bias");
    NormArgs a{};
    a.x = x.data;
    a.rows = x.numel / n;
    a.n = n;
    a.eps = eps;
    a.weight = w.data;
    PyObject* out = new_tensor(x.ndim, x.shape, dtype, &a.out);
    if (out == nullptr) return nullptr;
    const int fi = float_index(dtype);
    if (kind == RowNorm::rms) {
      run_released(x.numel, [&] { isa().rms_norm[fi](a, threads); });
      return out;
    }
    if (kind == RowNorm::layer) {
      a.bias = third.data;
      run_released(x.numel, [&] { isa().layer_norm[fi](a, threads); });
      return out;
    }
    a.residual = second.data;
    PyObject* rout = new_tensor(x.ndim, x.shape, dtype, &a.residual_out);
    if (rout == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    run_released(x.numel, [&] { isa().fused_add_rms_norm[fi](a, threads); });
    PyObject* pair = PyTuple_New(2);
    if (pair == nullptr) {
      Py_DECREF(out);
      Py_DECREF(rout);
      return nullptr;
    }
    PyTuple_SET_ITEM(pair, 0, out);
    PyTuple_SET_ITEM(pair, 1, rout);
    return pair;
  }
};

struct GroupNormKernel final : Kernel {
  int64_t groups;
  float eps;
  bool affine;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 3)) return nullptr;
    TensorView x, w, b;
    if (!read(*this, args[0], x, "x")) return nullptr;
    const bool has_w = args[1] != Py_None, has_b = args[2] != Py_None;
    if (has_w != affine || has_b != affine) {
      PyErr_Format(PyExc_ValueError, "%s was built %s weight and bias; got weight %s and bias %s", description.c_str(),
                   affine ? "with" : "without", has_w ? "given" : "None", has_b ? "given" : "None");
      return nullptr;
    }
    if (affine && (!read(*this, args[1], w, "weight") || !read(*this, args[2], b, "bias"))) return nullptr;
    if (x.ndim < 2 || x.shape[1] % groups != 0) return shape_error(*this, "x must be [N, C, *] with C divisible by num_groups", x, "x");
    GroupNormArgs a{};
    a.x = x.data;
    a.batch = x.shape[0];
    a.channels = x.shape[1];
    a.groups = groups;
    a.spatial = x.shape[1] == 0 ? 0 : x.numel / (x.shape[0] * x.shape[1] == 0 ? 1 : x.shape[0] * x.shape[1]);
    a.eps = eps;
    if (affine) {
      if (w.numel != a.channels || b.numel != a.channels) return shape_error(*this, "weight and bias must be [C]", w, "weight");
      a.weight = w.data;
      a.bias = b.data;
    }
    PyObject* out = new_tensor(x.ndim, x.shape, dtype, &a.out);
    if (out == nullptr) return nullptr;
    if (x.numel > 0) run_released(x.numel, [&] { isa().group_norm[float_index(dtype)](a, threads); });
    return out;
  }
};

struct SoftmaxKernel final : Kernel {
  int dim;  // normalised, or -1 for a 0-dim input
  bool log;
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
    if (x.numel > 0) run_released(x.numel, [&] { isa().softmax[float_index(dtype)](a, threads); });
    return out;
  }
};

struct ReduceKernel final : Kernel {
  std::vector<bool> reduce_axis;  // per input axis
  bool keepdim;
  ReduceOp op;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 1)) return nullptr;
    TensorView x;
    if (!read(*this, args[0], x, "x")) return nullptr;
    if (static_cast<size_t>(x.ndim) != reduce_axis.size()) {
      PyErr_Format(PyExc_ValueError, "%s was built for %zu-dim inputs; got x with %d dims", description.c_str(), reduce_axis.size(),
                   x.ndim);
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
    run_released(x.numel, [&] { isa().reduce[float_index(dtype)](a, threads); });
    return out;
  }
};

struct UnaryKernel final : Kernel {
  UnaryOp op;
  bool inplace;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 1)) return nullptr;
    TensorView x;
    if (!read(*this, args[0], x, "input")) return nullptr;
    UnaryArgs a{x.data, nullptr, x.numel, op};
    PyObject* out;
    if (inplace) {
      out = args[0];
      Py_INCREF(out);
      a.out = x.data;
    } else {
      out = new_tensor(x.ndim, x.shape, dtype, &a.out);
      if (out == nullptr) return nullptr;
    }
    if (x.numel > 0) run_released(x.numel, [&] { isa().unary[float_index(dtype)](a, threads); });
    return out;
  }
};

struct SiluAndMulKernel final : Kernel {
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 1)) return nullptr;
    TensorView x;
    if (!read(*this, args[0], x, "x")) return nullptr;
    if (x.ndim < 1 || x.shape[x.ndim - 1] % 2 != 0) return shape_error(*this, "the last dim of x must be even", x, "x");
    GatedArgs a{};
    a.x = x.data;
    a.n = x.shape[x.ndim - 1] / 2;
    a.rows = a.n == 0 ? 0 : x.numel / (2 * a.n);
    int64_t shape[kMaxDims];
    std::memcpy(shape, x.shape, sizeof(int64_t) * static_cast<size_t>(x.ndim));
    shape[x.ndim - 1] = a.n;
    PyObject* out = new_tensor(x.ndim, shape, dtype, &a.out);
    if (out == nullptr) return nullptr;
    if (a.rows * a.n > 0) run_released(x.numel, [&] { isa().silu_and_mul[float_index(dtype)](a, threads); });
    return out;
  }
};

// Broadcast plan for up to three operands: output shape, merged axes, element strides.
bool plan_broadcast(const Kernel& k, const TensorView* ops[3], BroadcastArgs& a, int& out_ndim, int64_t* out_shape) {
  out_ndim = 0;
  for (int i = 0; i < 3; ++i)
    if (ops[i]) out_ndim = std::max(out_ndim, ops[i]->ndim);
  for (int d = 0; d < out_ndim; ++d) {
    int64_t size = 1;
    for (int i = 0; i < 3; ++i) {
      if (!ops[i]) continue;
      const int od = d - (out_ndim - ops[i]->ndim);
      const int64_t s = od >= 0 ? ops[i]->shape[od] : 1;
      if (s == 1) continue;
      if (size != 1 && size != s) {
        PyErr_Format(PyExc_ValueError, "%s: operand shapes do not broadcast (axis %d has sizes %lld and %lld)", k.description.c_str(),
                     d, static_cast<long long>(size), static_cast<long long>(s));
        return false;
      }
      size = s;
    }
    out_shape[d] = size;
  }
  // strides of each operand along each output axis, then merge axes that stay contiguous
  int64_t st[3][kMaxDims];
  for (int i = 0; i < 3; ++i) {
    int64_t stride = 1;
    for (int d = out_ndim - 1; d >= 0; --d) {
      const int od = ops[i] ? d - (out_ndim - ops[i]->ndim) : -1;
      const int64_t s = od >= 0 ? ops[i]->shape[od] : 1;
      st[i][d] = (s == 1 || !ops[i]) ? 0 : stride;
      stride *= s;
    }
  }
  a.ndim = 0;
  for (int d = 0; d < out_ndim; ++d) {
    if (out_shape[d] == 1) continue;
    if (a.ndim > 0) {
      const int p = a.ndim - 1;
      bool mergeable = true;
      for (int i = 0; i < 3; ++i) mergeable = mergeable && a.strides[i][p] == st[i][d] * out_shape[d];
      if (mergeable) {
        a.sizes[p] *= out_shape[d];
        for (int i = 0; i < 3; ++i) a.strides[i][p] = st[i][d];
        continue;
      }
    }
    a.sizes[a.ndim] = out_shape[d];
    for (int i = 0; i < 3; ++i) a.strides[i][a.ndim] = st[i][d];
    ++a.ndim;
  }
  if (a.ndim == 0) {
    a.ndim = 1;
    a.sizes[0] = 1;
    for (int i = 0; i < 3; ++i) a.strides[i][0] = 0;
  }
  return true;
}

struct BinaryKernel final : Kernel {
  BinaryOp op;
  double alpha;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 2)) return nullptr;
    TensorView x, y;
    if (!read(*this, args[0], x, "input") || !read(*this, args[1], y, "other")) return nullptr;
    BroadcastArgs a{};
    const TensorView* ops[3] = {&x, &y, nullptr};
    int out_ndim;
    int64_t out_shape[kMaxDims];
    if (!plan_broadcast(*this, ops, a, out_ndim, out_shape)) return nullptr;
    a.in[0] = x.data;
    a.in[1] = y.data;
    a.op = op;
    a.alpha = alpha;
    PyObject* out = new_tensor(out_ndim, out_shape, dtype, &a.out);
    if (out == nullptr) return nullptr;
    int64_t numel = 1;
    for (int d = 0; d < out_ndim; ++d) numel *= out_shape[d];
    if (numel > 0) run_released(numel, [&] { isa().binary[static_cast<int>(dtype)](a, threads); });
    return out;
  }
};

struct ClampKernel final : Kernel {
  bool has_min, has_max;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 3)) return nullptr;
    TensorView x, lo, hi;
    if (!read(*this, args[0], x, "input")) return nullptr;
    if ((args[1] != Py_None) != has_min || (args[2] != Py_None) != has_max) {
      PyErr_Format(PyExc_ValueError, "%s was built with min %s and max %s; got min %s and max %s", description.c_str(),
                   has_min ? "given" : "None", has_max ? "given" : "None", args[1] != Py_None ? "given" : "None",
                   args[2] != Py_None ? "given" : "None");
      return nullptr;
    }
    if (has_min && !read(*this, args[1], lo, "min")) return nullptr;
    if (has_max && !read(*this, args[2], hi, "max")) return nullptr;
    BroadcastArgs a{};
    const TensorView* ops[3] = {&x, has_min ? &lo : nullptr, has_max ? &hi : nullptr};
    int out_ndim;
    int64_t out_shape[kMaxDims];
    if (!plan_broadcast(*this, ops, a, out_ndim, out_shape)) return nullptr;
    a.in[0] = x.data;
    a.in[1] = has_min ? lo.data : nullptr;
    a.in[2] = has_max ? hi.data : nullptr;
    PyObject* out = new_tensor(out_ndim, out_shape, dtype, &a.out);
    if (out == nullptr) return nullptr;
    int64_t numel = 1;
    for (int d = 0; d < out_ndim; ++d) numel *= out_shape[d];
    if (numel > 0) run_released(numel, [&] { isa().clamp[float_index(dtype)](a, threads); });
    return out;
  }
};

struct RopeKernel final : Kernel {
  bool with_positions;  // RopeNeoxPositionIds: x [T, H, D] and position_ids [T]
  bool layout_2d;       // RopeNeox '2d': x [B, S, H, D]; '1d': x [S, D]
  int64_t head_dim, rotary_dim;
  std::vector<float> cos, sin;  // [positions, rotary_dim / 2]
  int64_t positions = 0;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, with_positions ? 2 : 1)) return nullptr;
    TensorView x;
    if (!read(*this, args[0], x, "x")) return nullptr;
    const int want_ndim = with_positions ? 3 : (layout_2d ? 4 : 2);
    if (x.ndim != want_ndim || x.shape[x.ndim - 1] != head_dim)
      return shape_error(*this, "x does not match the layout and head_dim this kernel was built for", x, "x");
    RopeArgs a{};
    a.x = x.data;
    a.cos = cos.data();
    a.sin = sin.data();
    a.head_dim = head_dim;
    a.rotary_dim = rotary_dim;
    if (with_positions) {
      TensorView pos;
      if (!read_tensor(args[1], pos, "position_ids")) return nullptr;
      if ((pos.dtype != DType::i32 && pos.dtype != DType::i64) || pos.numel != x.shape[0]) {
        return shape_error(*this, "position_ids must be int32 or int64 with one entry per token", pos, "position_ids");
      }
      a.positions = pos.data;
      a.positions_are_i64 = pos.dtype == DType::i64;
      for (int64_t t = 0; t < pos.numel; ++t) {
        const int64_t p = a.positions_are_i64 ? static_cast<const int64_t*>(pos.data)[t] : static_cast<const int32_t*>(pos.data)[t];
        if (p < 0 || p >= positions) {
          PyErr_Format(PyExc_IndexError, "%s: position_ids must lie in [0, max_position=%lld); got %lld at token %lld",
                       description.c_str(), static_cast<long long>(positions), static_cast<long long>(p), static_cast<long long>(t));
          return nullptr;
        }
      }
      a.tokens = x.shape[0];
      a.seq = 1;
      a.heads = x.shape[1];
    } else {
      a.seq = layout_2d ? x.shape[1] : x.shape[0];
      a.tokens = layout_2d ? x.shape[0] * x.shape[1] : x.shape[0];
      a.heads = layout_2d ? x.shape[2] : 1;
      if (a.seq > positions) {
        PyErr_Format(PyExc_ValueError, "%s holds cos/sin tables for %lld positions; got seq_len %lld (build it for this shape)",
                     description.c_str(), static_cast<long long>(positions), static_cast<long long>(a.seq));
        return nullptr;
      }
    }
    PyObject* out = new_tensor(x.ndim, x.shape, dtype, &a.out);
    if (out == nullptr) return nullptr;
    if (x.numel > 0) run_released(x.numel, [&] { isa().rope[float_index(dtype)](a, threads); });
    return out;
  }
};

struct GemmKernel final : Kernel {
  bool batched;  // Bmm: [B,M,K] x [B,K,N]
  bool trans_a, trans_b;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 2)) return nullptr;
    TensorView x, y;
    if (!read(*this, args[0], x, "a") || !read(*this, args[1], y, "b")) return nullptr;
    const int nd = batched ? 3 : 2;
    if (x.ndim != nd) return shape_error(*this, batched ? "a must be [B, M, K]" : "a must be 2-D", x, "a");
    if (y.ndim != nd) return shape_error(*this, batched ? "b must be [B, K, N]" : "b must be 2-D", y, "b");
    GemmArgs g{};
    const int o = batched ? 1 : 0;
    g.batch = batched ? x.shape[0] : 1;
    if (batched && y.shape[0] != g.batch) return shape_error(*this, "a and b must have the same batch", y, "b");
    const int64_t a0 = x.shape[o], a1 = x.shape[o + 1], b0 = y.shape[o], b1 = y.shape[o + 1];
    g.m = trans_a ? a1 : a0;
    g.k = trans_a ? a0 : a1;
    g.n = trans_b ? b0 : b1;
    const int64_t kb = trans_b ? b1 : b0;
    if (kb != g.k) return shape_error(*this, ("a gives K=" + std::to_string(g.k) + ", b must give the same K").c_str(), y, "b");
    g.a = x.data;
    g.b = y.data;
    g.a_row = trans_a ? 1 : a1;
    g.a_col = trans_a ? a1 : 1;
    g.b_row = trans_b ? 1 : b1;
    g.b_col = trans_b ? b1 : 1;
    g.a_batch = a0 * a1;
    g.b_batch = b0 * b1;
    g.d_batch = g.m * g.n;
    int64_t shape[3] = {g.batch, g.m, g.n};
    PyObject* out = new_tensor(nd, batched ? shape : shape + 1, dtype, &g.d);
    if (out == nullptr) return nullptr;
    if (g.batch * g.m * g.n > 0) run_released(g.batch * g.m * g.n * std::max<int64_t>(g.k, 1), [&] { isa().gemm[float_index(dtype)](g, threads); });
    return out;
  }
};

struct AttentionKernel final : Kernel {
  bool decode;
  bool causal;
  int64_t head_dim, group;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 3)) return nullptr;
    TensorView q, k, v;
    if (!read(*this, args[0], q, "q") || !read(*this, args[1], k, "k") || !read(*this, args[2], v, "v")) return nullptr;
    const int qd = decode ? 3 : 4;
    if (q.ndim != qd || q.shape[qd - 1] != head_dim) return shape_error(*this, decode ? "q must be [B, H, D]" : "q must be [B, S, H, D]", q, "q");
    if (k.ndim != 4 || k.shape[3] != head_dim || k.shape[0] != q.shape[0])
      return shape_error(*this, "k must be [B, S_kv, H_kv, D]", k, "k");
    for (int d = 0; d < 4; ++d)
      if (v.shape[d] != k.shape[d] || v.ndim != 4) return shape_error(*this, "v must have k's shape", v, "v");
    AttentionArgs a{};
    a.q = q.data;
    a.k = k.data;
    a.v = v.data;
    a.batch = q.shape[0];
    a.seq_q = decode ? 1 : q.shape[1];
    a.heads = decode ? q.shape[1] : q.shape[2];
    a.seq_kv = k.shape[1];
    a.heads_kv = k.shape[2];
    a.head_dim = head_dim;
    a.causal = causal;
    a.scale = 1.f / std::sqrt(static_cast<float>(head_dim));
    if (a.heads_kv == 0 || a.heads != a.heads_kv * group)
      return shape_error(*this, ("q heads must be " + std::to_string(group) + " x the kv heads").c_str(), k, "k");
    if (!decode && a.seq_kv != a.seq_q) return shape_error(*this, "k must have q's sequence length", k, "k");
    PyObject* out = new_tensor(q.ndim, q.shape, dtype, &a.o);
    if (out == nullptr) return nullptr;
    if (q.numel > 0) {
      const int fi = float_index(dtype);
      run_released(q.numel * std::max<int64_t>(a.seq_kv, 1), [&] { (decode ? isa().attention_decode[fi] : isa().attention[fi])(a, threads); });
    }
    return out;
  }
};

// ---------------------------------------------------------------------------------------
// the call slot: straight from the interpreter into Kernel::call

PyObject* kernel_tp_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  if (kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0) {
    PyErr_SetString(PyExc_TypeError, "native_cpu kernels take tensors by position only");
    return nullptr;
  }
  Kernel* k = nb::inst_ptr<Kernel>(self);
  try {
    return k->call(&PyTuple_GET_ITEM(args, 0), PyTuple_GET_SIZE(args));
  } catch (const std::exception& e) {
    PyErr_Format(PyExc_RuntimeError, "%s failed: %s", k->description.c_str(), e.what());
    return nullptr;
  }
}

PyType_Slot kernel_slots[] = {{Py_tp_call, reinterpret_cast<void*>(kernel_tp_call)}, {0, nullptr}};

template <class K>
std::unique_ptr<Kernel> finish(std::unique_ptr<K> k, int dtype, int threads, const std::string& description) {
  k->dtype = static_cast<DType>(dtype);
  k->threads = std::max(1, threads);
  k->description = description;
  return k;
}

}  // namespace
}  // namespace tnc

NB_MODULE(_C, m) {
  using namespace tnc;
  m.doc() = "native_cpu kernels: builders in tileops_native_cpu.builders construct these";
  nb::class_<Kernel>(m, "Kernel", nb::type_slots(kernel_slots))
      .def_ro("description", &Kernel::description)
      .def_ro("threads", &Kernel::threads)
      .def("__repr__", [](const Kernel& k) { return "<" + k.description + ">"; });

  m.def("isa", [] { return std::string(isa().name); }, "the instruction set the kernels were picked for");
  m.def("init_bridge", [](nb::handle capsule, nb::handle torch_empty, nb::handle dtypes) {
    bridge_init(capsule.ptr(), torch_empty.ptr(), dtypes.ptr());
  });
  m.def("force_fallback", &bridge_force_fallback, "read and allocate through __dlpack__/torch.empty (for tests)");
  m.def("uses_exchange_api", &bridge_uses_exchange_api);
  m.def("pool_stats", [] {
    const PoolStats s = pool_stats();
    return std::make_tuple(s.rounds, s.chunks, s.caller_chunks, s.openmp_rounds, s.openmp_stalls);
  }, "(parallel regions, chunks in them, chunks the calling thread ran, regions on the OpenMP team, of which stalled) so far");
  m.def("set_use_openmp", &set_use_openmp, "run parallel regions on torch's OpenMP team (True, the default) or our own pool");
  m.def("openmp_available", &openmp_available, "whether an OpenMP runtime is loaded in the process");
  // Runs parallel_for over [0, n) and returns how often each index was visited, the number
  // of ranges, and the largest worker index seen (for the scheduling tests).
  m.def("parallel_for_check", [](int64_t n, int64_t grain, int threads) {
    std::vector<std::atomic<int>> visits(static_cast<size_t>(std::max<int64_t>(n, 0)));
    std::atomic<int> ranges{0}, max_worker{0};
    {
      nb::gil_scoped_release release;
      parallel_for(n, grain, threads, [&](int64_t b, int64_t e) {
        ranges.fetch_add(1);
        int w = worker_index(), cur = max_worker.load();
        while (w > cur && !max_worker.compare_exchange_weak(cur, w)) {
        }
        volatile int64_t spin = 0;  // a little work per index, so that helpers get a share
        for (int64_t i = b; i < e; ++i) {
          for (int j = 0; j < 200; ++j) spin = spin + j;
          visits[static_cast<size_t>(i)].fetch_add(1, std::memory_order_relaxed);
        }
      });
    }
    std::vector<int> out(visits.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = visits[i].load();
    return std::make_tuple(out, ranges.load(), max_worker.load());
  });

  m.def("row_norm", [](int kind, int dtype, int64_t n, float eps, int threads, const std::string& d) {
    auto k = std::make_unique<RowNormKernel>();
    k->kind = static_cast<RowNorm>(kind);
    k->n = n;
    k->eps = eps;
    return finish(std::move(k), dtype, threads, d);
  });
  m.def("group_norm", [](int dtype, int64_t groups, float eps, bool affine, int threads, const std::string& d) {
    auto k = std::make_unique<GroupNormKernel>();
    k->groups = groups;
    k->eps = eps;
    k->affine = affine;
    return finish(std::move(k), dtype, threads, d);
  });
  m.def("softmax", [](int dtype, int dim, bool log, int threads, const std::string& d) {
    auto k = std::make_unique<SoftmaxKernel>();
    k->dim = dim;
    k->log = log;
    return finish(std::move(k), dtype, threads, d);
  });
  m.def("reduce", [](int dtype, std::vector<bool> axes, bool keepdim, int op, int threads, const std::string& d) {
    auto k = std::make_unique<ReduceKernel>();
    k->reduce_axis = std::move(axes);
    k->keepdim = keepdim;
    k->op = static_cast<ReduceOp>(op);
    return finish(std::move(k), dtype, threads, d);
  });
  m.def("unary", [](int dtype, int op, bool inplace, int threads, const std::string& d) {
    auto k = std::make_unique<UnaryKernel>();
    k->op = static_cast<UnaryOp>(op);
    k->inplace = inplace;
    return finish(std::move(k), dtype, threads, d);
  });
  m.def("silu_and_mul", [](int dtype, int threads, const std::string& d) {
    return finish(std::make_unique<SiluAndMulKernel>(), dtype, threads, d);
  });
  m.def("binary", [](int dtype, int op, double alpha, int threads, const std::string& d) {
    auto k = std::make_unique<BinaryKernel>();
    k->op = static_cast<BinaryOp>(op);
    k->alpha = alpha;
    return finish(std::move(k), dtype, threads, d);
  });
  m.def("clamp", [](int dtype, bool has_min, bool has_max, int threads, const std::string& d) {
    auto k = std::make_unique<ClampKernel>();
    k->has_min = has_min;
    k->has_max = has_max;
    return finish(std::move(k), dtype, threads, d);
  });
  m.def("rope", [](int dtype, bool with_positions, bool layout_2d, int64_t head_dim, int64_t rotary_dim, int threads,
                   const std::string& d) {
    auto k = std::make_unique<RopeKernel>();
    k->with_positions = with_positions;
    k->layout_2d = layout_2d;
    k->head_dim = head_dim;
    k->rotary_dim = rotary_dim;
    return finish(std::move(k), dtype, threads, d);
  });
  // Replaces the cos/sin tables of a RoPE kernel (build time only): float32 [P, rotary_dim/2].
  m.def("set_rope_tables", [](Kernel& kernel, nb::handle cos, nb::handle sin) {
    auto* k = dynamic_cast<RopeKernel*>(&kernel);
    if (k == nullptr) throw nb::type_error("set_rope_tables needs a RoPE kernel");
    TensorView c, s;
    if (!read_tensor(cos.ptr(), c, "cos") || !read_tensor(sin.ptr(), s, "sin")) throw nb::python_error();
    if (c.dtype != DType::f32 || s.dtype != DType::f32 || c.numel != s.numel || c.ndim != 2 || c.shape[1] != k->rotary_dim / 2)
      throw nb::value_error("cos and sin must be float32 [positions, rotary_dim/2]");
    k->cos.assign(static_cast<const float*>(c.data), static_cast<const float*>(c.data) + c.numel);
    k->sin.assign(static_cast<const float*>(s.data), static_cast<const float*>(s.data) + s.numel);
    k->positions = c.shape[0];
  });
  m.def("rope_positions", [](const Kernel& kernel) {
    auto* k = dynamic_cast<const RopeKernel*>(&kernel);
    return k ? k->positions : int64_t{0};
  });
  m.def("gemm", [](int dtype, bool batched, bool trans_a, bool trans_b, int threads, const std::string& d) {
    auto k = std::make_unique<GemmKernel>();
    k->batched = batched;
    k->trans_a = trans_a;
    k->trans_b = trans_b;
    return finish(std::move(k), dtype, threads, d);
  });
  m.def("attention", [](int dtype, bool decode, bool causal, int64_t head_dim, int64_t group, int threads, const std::string& d) {
    auto k = std::make_unique<AttentionKernel>();
    k->decode = decode;
    k->causal = causal;
    k->head_dim = head_dim;
    k->group = group;
    return finish(std::move(k), dtype, threads, d);
  });
}
