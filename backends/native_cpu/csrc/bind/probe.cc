// The machine probes the benchmarks hold native_cpu's kernels to, _C.probe_bandwidth and
// _C.probe_bf16_peak: tileops' own probes (tileops._C.machine, csrc/machine/probes.cc at
// the repository root, behind `tileops profile-machine`), so the two report one machine
// measured one way. They run on threads of their own, not on our pool, on huge-page buffers
// like the outputs the kernels write (output_cache.h).
#include <nanobind/stl/string.h>

#include <string>

#include "bind/kernel.h"

namespace tnc {
namespace {

nb::object machine_probes() { return nb::module_::import_("tileops._C").attr("machine"); }

}  // namespace

void bind_probe(nb::module_& m) {
  m.def(
      "probe_bandwidth",
      [](const std::string& kind, int64_t mib, int threads, int repeats) {
        return machine_probes().attr("bandwidth")(kind, mib, threads, repeats);
      },
      nb::arg("kind"), nb::arg("mib"), nb::arg("threads"), nb::arg("repeats"),
      "GB/s of each repeat of a 'read', 'copy' or 'copy_stream' pass over `mib` MiB on `threads` threads");
  m.def(
      "probe_bf16_peak",
      [](int threads, int repeats, double ms) {
        // the bfloat16 GEMM's product ceiling in the build that runs: vdpbf16ps in the
        // AVX-512 BF16 build, else the float FMAs the other builds widen bfloat16 into, at
        // their width
        const std::string build = isa().isa();
        if (build == "avx512") return machine_probes().attr("bf16_dot_peak")(threads, repeats, ms);
        const char* fma = build == "avx2" ? "avx2+fma" : "scalar";
        return machine_probes().attr("fp32_fma_peak")(threads, repeats, ms, fma);
      },
      nb::arg("threads"), nb::arg("repeats"), nb::arg("ms") = 50.0,
      "GFLOP/s of each repeat of the bfloat16 GEMM's product throughput on `threads` threads (vdpbf16ps in the "
      "AVX-512 BF16 build, float FMAs in the others)");
}

}  // namespace tnc
