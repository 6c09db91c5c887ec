// tileops_native_cpu._C: kernel objects whose __call__ is a C++ type slot. Builders (in
// Python) fix the compile-time values and construct one of these through the families'
// constructors (bind/<family>.cc); a call goes from the interpreter straight to
// Kernel::call, which reads its tensors through the DLPack bridge, allocates outputs
// through torch and runs the ISA's kernel. This file holds the module's bindings only.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <string>
#include <vector>

#include "bind/kernel.h"
#include "dlpack_bridge.h"
#include "output_cache.h"
#include "thread_pool.h"

namespace tnc {
namespace {

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

}  // namespace
}  // namespace tnc

NB_MODULE(_C, m) {
  using namespace tnc;
  m.doc() = "native_cpu kernels: builders in tileops_native_cpu.builders construct these";
  nb::class_<Kernel>(m, "Kernel", nb::type_slots(kernel_slots))
      .def_ro("description", &Kernel::description)
      .def_ro("threads", &Kernel::threads)
      .def("__repr__", [](const Kernel& k) { return "<" + k.description + ">"; });

  nb::enum_<DType> dtypes(m, "DType");
  for (int i = 0; i < kNumDTypes; ++i) dtypes.value(kDTypeNames[i], static_cast<DType>(i));

  m.def("isa", [] { return std::string(isa().isa()); }, "the instruction set the kernels were picked for");
  // torch_dtypes: {DType member: torch dtype}; builders.py pairs them by name
  m.def("init_bridge", [](nb::handle capsule, nb::handle torch_empty, nb::dict torch_dtypes) {
    PyObject* by_dtype[kNumDTypes] = {};
    for (auto [member, torch_dtype] : torch_dtypes)
      by_dtype[static_cast<int>(nb::cast<DType>(member))] = torch_dtype.ptr();
    for (int i = 0; i < kNumDTypes; ++i)
      if (by_dtype[i] == nullptr)
        throw nb::value_error((std::string("init_bridge: no torch dtype for ") + kDTypeNames[i]).c_str());
    bridge_init(capsule.ptr(), torch_empty.ptr(), by_dtype);
  });
  m.def("force_fallback", &bridge_force_fallback, "read and allocate through __dlpack__/torch.empty (for tests)");
  m.def("uses_exchange_api", &bridge_uses_exchange_api);
  m.def(
      "pool_stats",
      [] {
        const PoolStats s = pool_stats();
        return std::make_tuple(s.rounds, s.chunks, s.caller_chunks, s.openmp_rounds, s.openmp_stalls,
                               s.alone_after_stall);
      },
      "(parallel regions, chunks in them, chunks the calling thread ran, regions on the OpenMP team, of which stalled, "
      "regions the calling thread ran alone after a stall) so far");
  m.def(
      "output_cache_stats",
      [] {
        const OutputCacheStats s = output_cache_stats();
        return std::make_tuple(s.hits, s.misses, s.idle_bytes, s.budget_bytes);
      },
      "(outputs served by a warm block, by a new mapping, idle bytes held, idle budget) of the warm-output cache");
  m.def("set_output_cache_budget", &output_cache_set_budget, nb::arg("bytes"),
        "idle bytes the warm-output cache may hold (0 turns it off); returns the previous budget");
  m.def("set_use_openmp", &set_use_openmp,
        "run parallel regions on torch's OpenMP team (True, the default) or our own pool");
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

  bind_attention(m);
  bind_elementwise(m);
  bind_gemm(m);
  bind_moe(m);
  bind_norm(m);
  bind_reduction(m);
  bind_probe(m);
  bind_quant(m);
  bind_rope(m);
  bind_softmax(m);
}
