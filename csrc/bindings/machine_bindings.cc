// tileops._C.machine: the probes of machine/probes.h, with the GIL released while they run.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings/py_support.h"
#include "machine/probes.h"

namespace tileops::bindings {
namespace {

template <typename Fn>
std::vector<double> released(Fn&& fn) {
  nb::gil_scoped_release release;
  return fn();
}

}  // namespace

void bind_machine(nb::module_& m) {
  nb::module_ machine = m.def_submodule("machine", "Micro-kernels that measure this CPU.");
  nb::exception<machine::Unavailable>(machine, "Unavailable", PyExc_RuntimeError);
  machine.def(
      "bandwidth",
      [](const std::string& kind, int64_t mib, int threads, int repeats) {
        return released([&] { return machine::bandwidth(kind, mib, threads, repeats); });
      },
      nb::arg("kind"), nb::arg("mib"), nb::arg("threads"), nb::arg("repeats"),
      "GB/s of each repeat of a 'read', 'copy' or 'copy_stream' pass over `mib` MiB on `threads` "
      "threads");
  machine.def(
      "fp32_fma_peak",
      [](int threads, int repeats, double ms, const std::string& isa) {
        return released([&] { return machine::fp32_fma_peak(threads, repeats, ms, isa); });
      },
      nb::arg("threads"), nb::arg("repeats"), nb::arg("ms") = 50.0, nb::arg("isa") = "",
      "GFLOP/s of each repeat of fp32 FMA throughput on `threads` threads, with the widest "
      "instructions or those `isa` names ('avx512f', 'avx2+fma', 'scalar')");
  machine.def("fp32_fma_isa", &machine::fp32_fma_isa, "the instructions fp32_fma_peak uses");
  machine.def(
      "bf16_dot_peak",
      [](int threads, int repeats, double ms) {
        return released([&] { return machine::bf16_dot_peak(threads, repeats, ms); });
      },
      nb::arg("threads"), nb::arg("repeats"), nb::arg("ms") = 50.0,
      "GFLOP/s of each repeat of bf16 dot-product throughput; raises Unavailable without AVX-512 BF16");
  machine.def("bf16_dot_missing", &machine::bf16_dot_missing, "why bf16_dot_peak cannot run here; empty when it can");
}

}  // namespace tileops::bindings
