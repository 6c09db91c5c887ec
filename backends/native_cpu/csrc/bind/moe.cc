// Marshalling of the moe family (kernels/moe*.h): the router (FusedTopKOp) and the MoE
// block (FusedMoeFwdOp) kernel objects.
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <string>

#include "bind/kernel.h"
#include "kernels/moe_args.h"

namespace tnc {
namespace {

// A float32 tensor (the logits of the block, a correction bias), whatever the kernel's dtype.
bool read_f32(const Kernel& k, PyObject* obj, TensorView& v, const char* what) {
  if (!read_tensor(obj, v, what)) return false;
  if (v.dtype == DType::f32) return true;
  PyErr_Format(PyExc_TypeError, "%s takes %s as float32; got %s", k.description.c_str(), what, dtype_name(v.dtype));
  return false;
}

// The bias: None or not as the kernel was built, and [experts] when given.
bool read_bias(const Kernel& k, PyObject* obj, bool has_bias, int64_t experts, TensorView& v) {
  if ((obj != Py_None) != has_bias) {
    PyErr_Format(PyExc_ValueError, "%s was built %s a correction_bias; got %s", k.description.c_str(),
                 has_bias ? "with" : "without", obj == Py_None ? "None" : "one");
    return false;
  }
  if (!has_bias) return true;
  if (!read_f32(k, obj, v, "correction_bias")) return false;
  if (v.ndim != 1 || v.shape[0] != experts) {
    shape_error(k, ("correction_bias must be [" + std::to_string(experts) + "]").c_str(), v, "correction_bias");
    return false;
  }
  return true;
}

// gating_output [T, E] (the kernel's dtype), correction_bias [E] float32 or None ->
// (topk_weights float32 [T, K], topk_ids int32 [T, K]).
struct TopKKernel final : Kernel {
  int64_t top_k;
  MoeScoring scoring;
  bool renormalize, has_bias;
  KernelFn<TopKArgs> run;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 2)) return nullptr;
    TensorView logits, bias;
    if (!read(*this, args[0], logits, "gating_output")) return nullptr;
    if (logits.ndim != 2 || logits.shape[1] < top_k)
      return shape_error(
          *this, ("gating_output must be [tokens, experts] with experts >= top_k = " + std::to_string(top_k)).c_str(),
          logits, "gating_output");
    if (!read_bias(*this, args[1], has_bias, logits.shape[1], bias)) return nullptr;
    TopKArgs a{};
    a.logits = logits.data;
    a.bias = has_bias ? static_cast<const float*>(bias.data) : nullptr;
    a.tokens = logits.shape[0];
    a.experts = logits.shape[1];
    a.top_k = top_k;
    a.scoring = scoring;
    a.renormalize = renormalize;
    const int64_t shape[2] = {a.tokens, top_k};
    void* weights = nullptr;
    void* ids = nullptr;
    PyObject* w = new_tensor(2, shape, DType::f32, &weights);
    if (w == nullptr) return nullptr;
    PyObject* i = new_tensor(2, shape, DType::i32, &ids);
    if (i == nullptr) {
      Py_DECREF(w);
      return nullptr;
    }
    a.weights = static_cast<float*>(weights);
    a.ids = static_cast<int32_t*>(ids);
    if (a.tokens > 0) run_released(logits.numel * top_k, [&] { run(a, threads); });
    return new_pair(w, i);
  }
};

// hidden_states [T, H], gating_output [T, E] float32, w_gate_up [E, 2F, H], w_down [E, H, F],
// correction_bias [E] float32 or None -> output [T, H].
struct MoeKernel final : Kernel {
  int64_t experts, top_k, hidden, ffn;
  MoeScoring scoring;
  bool renormalize, has_bias;
  float scale;
  KernelFn<MoeArgs> run;
  KernelFn<GemmArgs> gemm;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, 5)) return nullptr;
    TensorView x, logits, wgu, wd, bias;
    if (!read(*this, args[0], x, "hidden_states") || !read_f32(*this, args[1], logits, "gating_output") ||
        !read(*this, args[2], wgu, "w_gate_up") || !read(*this, args[3], wd, "w_down"))
      return nullptr;
    const std::string h = std::to_string(hidden), e = std::to_string(experts), f = std::to_string(ffn);
    if (x.ndim != 2 || x.shape[1] != hidden)
      return shape_error(*this, ("hidden_states must be [tokens, " + h + "]").c_str(), x, "hidden_states");
    if (logits.ndim != 2 || logits.shape[0] != x.shape[0] || logits.shape[1] != experts)
      return shape_error(*this, ("gating_output must be [tokens of hidden_states, " + e + "]").c_str(), logits,
                         "gating_output");
    if (wgu.ndim != 3 || wgu.shape[0] != experts || wgu.shape[1] != 2 * ffn || wgu.shape[2] != hidden)
      return shape_error(*this, ("w_gate_up must be [" + e + ", 2 * " + f + ", " + h + "]").c_str(), wgu, "w_gate_up");
    if (wd.ndim != 3 || wd.shape[0] != experts || wd.shape[1] != hidden || wd.shape[2] != ffn)
      return shape_error(*this, ("w_down must be [" + e + ", " + h + ", " + f + "]").c_str(), wd, "w_down");
    if (!read_bias(*this, args[4], has_bias, experts, bias)) return nullptr;
    MoeArgs a{};
    a.x = x.data;
    a.logits = static_cast<const float*>(logits.data);
    a.w_gate_up = wgu.data;
    a.w_down = wd.data;
    a.bias = has_bias ? static_cast<const float*>(bias.data) : nullptr;
    a.tokens = x.shape[0];
    a.experts = experts;
    a.top_k = top_k;
    a.hidden = hidden;
    a.ffn = ffn;
    a.scoring = scoring;
    a.renormalize = renormalize;
    a.scale = scale;
    a.gemm = gemm;
    PyObject* out = new_tensor(2, x.shape, dtype, &a.out);
    if (out == nullptr) return nullptr;
    if (a.tokens > 0) run_released(a.tokens * top_k * hidden * ffn, [&] { run(a, threads); });
    return out;
  }
};

}  // namespace

void bind_moe(nb::module_& m) {
  nb::enum_<MoeScoring>(m, "MoeScoring").value("softmax", MoeScoring::softmax).value("sigmoid", MoeScoring::sigmoid);
  nb::enum_<MoeActivation>(m, "MoeActivation")
      .value("silu_and_mul", MoeActivation::silu_and_mul)
      .value("gelu_and_mul", MoeActivation::gelu_and_mul);
  m.def("fused_topk", [](DType dtype, int64_t top_k, MoeScoring scoring, bool renormalize, bool has_bias, int threads,
                         const std::string& d) {
    if (top_k < 1) throw nb::value_error("fused_topk: top_k must be >= 1");
    auto k = std::make_unique<TopKKernel>();
    k->top_k = top_k;
    k->scoring = scoring;
    k->renormalize = renormalize;
    k->has_bias = has_bias;
    k->run = require_kernel<TopKArgs>("fused_topk", dtype);
    return finish(std::move(k), dtype, threads, d);
  });
  m.def("fused_moe",
        [](DType dtype, int64_t experts, int64_t top_k, int64_t hidden, int64_t ffn, MoeScoring scoring,
           bool renormalize, float scale, MoeActivation activation, bool has_bias, int threads, const std::string& d) {
          if (experts < 1 || top_k < 1 || top_k > experts || hidden < 1 || ffn < 1)
            throw nb::value_error("fused_moe: needs experts >= top_k >= 1, hidden >= 1 and ffn >= 1");
          auto k = std::make_unique<MoeKernel>();
          k->experts = experts;
          k->top_k = top_k;
          k->hidden = hidden;
          k->ffn = ffn;
          k->scoring = scoring;
          k->renormalize = renormalize;
          k->has_bias = has_bias;
          k->scale = scale;
          k->run = require_kernel<MoeArgs>("fused_moe", dtype, static_cast<int>(activation), "this activation");
          k->gemm = require_kernel<GemmArgs>("gemm", dtype);
          return finish(std::move(k), dtype, threads, d);
        });
}

}  // namespace tnc
