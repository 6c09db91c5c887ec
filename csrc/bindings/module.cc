// tileops._C: the only code that knows Python. It maps Python objects to engine handles
// and engine errors to tileops.backend's exception classes; the rules live in csrc/engine.
#include <nanobind/stl/string.h>

#include "bindings/capture.h"
#include "bindings/py_support.h"
#include "engine/kernel_cache.h"

namespace tileops::bindings {
namespace {

// Exception classes are defined in Python (tileops/backend/errors.py) and handed over
// once at import, so `except tileops.BackendError` catches what the engine raises.
// Kept for the life of the process on purpose: they outlive every engine error.
PyObject* g_error_classes[5] = {};

PyObject* error_class(engine::EngineError::Kind kind) {
  PyObject* cls = g_error_classes[static_cast<int>(kind)];
  if (cls) return cls;
  return kind == engine::EngineError::Kind::kValue ? PyExc_ValueError : PyExc_RuntimeError;
}

nb::object cause_of(const engine::EngineError& error) {
  try {
    std::rethrow_if_nested(error);
  } catch (nb::python_error& nested) {
    return nb::borrow(nested.value());
  } catch (const engine::EngineError& nested) {
    return nb::borrow(error_class(nested.kind()))(nb::str(nested.what()));
  } catch (const std::exception& nested) {
    return nb::borrow(PyExc_RuntimeError)(nb::str(nested.what()));
  } catch (...) {
    return nb::borrow(PyExc_RuntimeError)(nb::str("unknown C++ exception"));
  }
  return nb::none();
}

}  // namespace

engine::Handle to_handle(nb::handle object) {
  object.inc_ref();
  return engine::Handle(object.ptr(), [](void* pointer) {
    if (!Py_IsInitialized()) return;  // the interpreter is gone; so is the object
    nb::gil_scoped_acquire gil;
    Py_DECREF(static_cast<PyObject*>(pointer));
  });
}

void set_python_error(const engine::EngineError& error) {
  PyObject* cls = error_class(error.kind());
  nb::object cause = cause_of(error);
  nb::object exception = nb::borrow(cls)(nb::str(error.what()));
  if (!cause.is_none()) {
    PyException_SetCause(exception.ptr(), cause.inc_ref().ptr());  // steals the reference
  }
  PyErr_SetObject(cls, exception.ptr());
}

}  // namespace tileops::bindings

NB_MODULE(_C, m) {
  namespace nb = nanobind;
  using namespace tileops;
  m.doc() = "tileops' C++ engine: registry, target selection, kernel memo and the call path.";
  // The registry and op dispatchers live in module globals that Python may not tear down
  // before nanobind's exit check; that is not a leak worth a warning at every exit.
  nb::set_leak_warnings(false);

  nb::register_exception_translator([](const std::exception_ptr& pointer, void*) {
    try {
      std::rethrow_exception(pointer);
    } catch (const engine::EngineError& error) {
      bindings::set_python_error(error);
    } catch (bindings::PythonInterrupt& interrupt) {
      interrupt.error.restore();
    }
  });

  m.def(
      "set_error_classes",
      [](nb::object backend, nb::object unknown, nb::object ambiguous, nb::object not_available) {
        nb::handle classes[] = {backend, unknown, ambiguous, not_available};
        for (int i = 0; i < 4; ++i) {
          Py_XDECREF(bindings::g_error_classes[i]);
          bindings::g_error_classes[i] = classes[i].inc_ref().ptr();
        }
      },
      "Hands over the Python classes engine errors are raised as.");

  m.def("kernel_cache_capacity", &engine::KernelCache::capacity);
  m.def(
      "set_kernel_cache_capacity",
      [](int64_t entries) {
        if (entries < 1) {
          throw nb::value_error(
              ("kernel cache capacity must be a positive number of kernels, got " + std::to_string(entries)).c_str());
        }
        engine::KernelCache::set_capacity(static_cast<size_t>(entries));
      },
      nb::arg("entries"));
  m.attr("DEFAULT_KERNEL_CACHE_CAPACITY") = engine::KernelCache::kDefaultCapacity;

  bindings::bind_registry(m);
  bindings::bind_dispatcher(m);
  bindings::bind_machine(m);
  bindings::bind_capture(m);
  bindings::bind_greedy(m);
}
