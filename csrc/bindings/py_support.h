// What the binding files share: turning Python objects into engine handles and back,
// and raising engine errors as the Python classes of tileops.backend.
#pragma once

#include <nanobind/nanobind.h>

#include "engine/errors.h"
#include "engine/handle.h"

namespace tileops::bindings {

namespace nb = nanobind;

// Keeps `object` alive inside the engine; the last release takes the GIL to drop it.
engine::Handle to_handle(nb::handle object);
// A new reference to the Python object behind a handle made by to_handle.
inline nb::object from_handle(const engine::Handle& handle) { return nb::borrow(static_cast<PyObject*>(handle.get())); }

// A Python KeyboardInterrupt / SystemExit crossing the engine: restored as it was.
class PythonInterrupt : public engine::PassThrough {
 public:
  explicit PythonInterrupt(nb::python_error error) : error(std::move(error)) {}
  nb::python_error error;
};

// Sets the Python error for an engine error (its class, its text, and its nested cause as
// __cause__). Used by the exception translator and wherever C++ catches one itself.
void set_python_error(const engine::EngineError& error);

void bind_registry(nb::module_& m);
void bind_dispatcher(nb::module_& m);
void bind_machine(nb::module_& m);

}  // namespace tileops::bindings
