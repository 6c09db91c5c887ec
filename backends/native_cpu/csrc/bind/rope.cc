// Marshalling of the rope family (kernels/rope.h): RoPE (NeoX half split or adjacent pairs) over [S, D], [B, S, H, D]
// or [T, H, D] with position ids, and its cos/sin tables.
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <vector>

#include "bind/kernel.h"
#include "kernels/rope_args.h"

namespace tnc {
namespace {

struct RopeKernel final : Kernel {
  RopeLayout layout;
  int64_t head_dim, rotary_dim;
  std::vector<float> cos, sin;  // [positions, rotary_dim / 2]
  int64_t positions = 0;
  KernelFn<RopeArgs> run;
  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    const bool with_positions = layout == RopeLayout::thd_position_ids, layout_2d = layout == RopeLayout::bshd;
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
        const int64_t p =
            a.positions_are_i64 ? static_cast<const int64_t*>(pos.data)[t] : static_cast<const int32_t*>(pos.data)[t];
        if (p < 0 || p >= positions) {
          PyErr_Format(PyExc_IndexError, "%s: position_ids must lie in [0, max_position=%lld); got %lld at token %lld",
                       description.c_str(), static_cast<long long>(positions), static_cast<long long>(p),
                       static_cast<long long>(t));
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
        PyErr_Format(PyExc_ValueError,
                     "%s holds cos/sin tables for %lld positions; got seq_len %lld (build it for this shape)",
                     description.c_str(), static_cast<long long>(positions), static_cast<long long>(a.seq));
        return nullptr;
      }
    }
    PyObject* out = new_tensor(x.ndim, x.shape, dtype, &a.out);
    if (out == nullptr) return nullptr;
    if (x.numel > 0) run_released(x.numel, [&] { run(a, threads); });
    return out;
  }
};

}  // namespace

void bind_rope(nb::module_& m) {
  nb::enum_<RopeLayout>(m, "RopeLayout")
      .value("sd", RopeLayout::sd)
      .value("bshd", RopeLayout::bshd)
      .value("thd_position_ids", RopeLayout::thd_position_ids);
  nb::enum_<RopeRotation>(m, "RopeRotation").value("neox", RopeRotation::neox).value("pairs", RopeRotation::pairs);
  m.def("rope", [](RopeLayout layout, RopeRotation rotation, DType dtype, int64_t head_dim, int64_t rotary_dim,
                   int threads, const std::string& d) {
    if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim)
      throw nb::value_error("rope: rotary_dim must be positive, even and at most head_dim");
    auto k = std::make_unique<RopeKernel>();
    k->layout = layout;
    k->head_dim = head_dim;
    k->rotary_dim = rotary_dim;
    k->run = require_kernel<RopeArgs>(rotation == RopeRotation::pairs ? "rope_pairs" : "rope", dtype);
    return finish(std::move(k), dtype, threads, d);
  });
  // Replaces the cos/sin tables of a RoPE kernel (build time only): float32 [P, rotary_dim/2].
  m.def("set_rope_tables", [](Kernel& kernel, nb::handle cos, nb::handle sin) {
    auto* k = dynamic_cast<RopeKernel*>(&kernel);
    if (k == nullptr) throw nb::type_error("set_rope_tables needs a RoPE kernel");
    TensorView c, s;
    if (!read_tensor(cos.ptr(), c, "cos") || !read_tensor(sin.ptr(), s, "sin")) throw nb::python_error();
    if (c.dtype != DType::f32 || s.dtype != DType::f32 || c.numel != s.numel || c.ndim != 2 ||
        c.shape[1] != k->rotary_dim / 2)
      throw nb::value_error("cos and sin must be float32 [positions, rotary_dim/2]");
    k->cos.assign(static_cast<const float*>(c.data), static_cast<const float*>(c.data) + c.numel);
    k->sin.assign(static_cast<const float*>(s.data), static_cast<const float*>(s.data) + s.numel);
    k->positions = c.shape[0];
  });
  m.def("rope_positions", [](const Kernel& kernel) {
    auto* k = dynamic_cast<const RopeKernel*>(&kernel);
    return k ? k->positions : int64_t{0};
  });
}

}  // namespace tnc
