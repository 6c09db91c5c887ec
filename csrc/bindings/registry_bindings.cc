// Python face of engine::Registry and target selection. Detectors and builders arrive
// with the names errors print for them ("module.qualname"), computed by tileops.backend.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings/py_support.h"
#include "engine/registry.h"
#include "engine/selection.h"

namespace tileops::bindings {
namespace {

using engine::DefaultTarget;
using engine::Registry;
using engine::TargetChoice;

// Choices cross the boundary as (kind, name): kind is "detect", "builtin" or "named".
std::pair<std::string, std::string> choice_to_py(const TargetChoice& choice) {
  switch (choice.kind) {
    case TargetChoice::Kind::kBuiltin: return {"builtin", ""};
    case TargetChoice::Kind::kNamed: return {"named", choice.name};
    case TargetChoice::Kind::kDetect: break;
  }
  return {"detect", ""};
}

TargetChoice choice_from_py(const std::string& kind, const std::string& name) {
  if (kind == "builtin") return TargetChoice::builtin();
  if (kind == "named") return TargetChoice::named(name);
  return TargetChoice::detect();
}

// Calls a Python detector with the device object, untouched. A detector must answer
// with a bool; anything else is a broken backend, reported through the engine.
engine::AskDetector ask_with(nb::handle device) {
  return [device](const engine::NamedHandle& detector) -> bool {
    nb::object answer;
    try {
      answer = from_handle(detector.object)(device);
    } catch (nb::python_error& error) {
      // Ctrl-C and sys.exit() during target choice reach the caller as they are.
      if (error.matches(PyExc_KeyboardInterrupt) || error.matches(PyExc_SystemExit)) {
        throw PythonInterrupt(std::move(error));
      }
      throw;
    }
    if (!PyBool_Check(answer.ptr())) {
      std::string got = nb::repr(answer).c_str();
      PyErr_SetString(PyExc_TypeError, ("detect must return True or False, got " + got).c_str());
      throw nb::python_error();
    }
    return answer.ptr() == Py_True;
  };
}

}  // namespace

void bind_registry(nb::module_& m) {
  nb::class_<Registry>(m, "Registry", "Detectors, builders, default target and load failures.")
      .def(nb::init<>())
      .def("register_detector",
           [](Registry& self, const std::string& target, nb::handle detect, std::string name) {
             self.register_detector(target, {to_handle(detect), std::move(name)});
           })
      .def("register_builder",
           [](Registry& self, const std::string& op, const std::string& target, nb::handle build, std::string name) {
             self.register_builder(op, target, {to_handle(build), std::move(name)});
           })
      .def("targets", &Registry::targets)
      .def("targets_for_op", &Registry::targets_for_op)
      .def("knows", &Registry::knows)
      .def("builder_keys", &Registry::builder_keys)
      .def("detector",
           [](const Registry& self, const std::string& target) {
             auto detector = self.detector(target);
             return detector ? from_handle(detector->object) : nb::none();
           })
      .def("builder",
           [](const Registry& self, const std::string& op, const std::string& target) {
             auto builder = self.builder(op, target);
             return builder ? from_handle(builder->object) : nb::none();
           })
      .def("builder_name",
           [](const Registry& self, const std::string& op, const std::string& target) {
             auto builder = self.builder(op, target);
             return builder ? builder->name : std::string();
           })
      .def("set_default",
           [](Registry& self, const std::string& kind, const std::string& name) {
             if (kind == "builtin") return self.set_default(DefaultTarget::builtin());
             if (kind == "named") return self.set_default(DefaultTarget::named(name));
             self.set_default(DefaultTarget::none());
           })
      .def("default_target",
           [](const Registry& self) -> std::pair<std::string, std::string> {
             DefaultTarget target = self.default_target();
             switch (target.kind) {
               case DefaultTarget::Kind::kBuiltin: return {"builtin", ""};
               case DefaultTarget::Kind::kNamed: return {"named", target.name};
               case DefaultTarget::Kind::kNone: break;
             }
             return {"none", ""};
           })
      .def("add_load_failure", &Registry::add_load_failure)
      .def("load_failures", &Registry::load_failures)
      .def("begin_transaction", &Registry::begin_transaction)
      .def("commit_transaction", &Registry::commit_transaction)
      .def("rollback_transaction", &Registry::rollback_transaction)
      .def("in_transaction", &Registry::in_transaction)
      .def("clear", &Registry::clear)
      .def("check_requested",
           [](const Registry& self, const std::string& kind, const std::string& name) {
             return choice_to_py(engine::check_requested(self, choice_from_py(kind, name)));
           })
      .def(
          "settle",
          [](const Registry& self, const std::string& kind, const std::string& name, nb::handle device,
             const std::string& device_text) {
            return choice_to_py(engine::settle_target(self, choice_from_py(kind, name), device_text, ask_with(device)));
          })
      .def("claimants",
           [](const Registry& self, nb::handle device) {
             // Every target whose detector says yes; a raising or non-bool answer is a no.
             std::vector<std::string> out;
             for (const auto& [target, detector] : self.detectors()) {
               nb::object answer =
                   nb::steal(PyObject_CallOneArg(static_cast<PyObject*>(detector.object.get()), device.ptr()));
               if (!answer.is_valid()) {
                 PyErr_Clear();
                 continue;
               }
               if (answer.ptr() == Py_True) out.push_back(target);
             }
             return out;
           })
      .def("target_claims",
           [](const Registry& self, const std::string& target, nb::handle device, const std::string& device_text) {
             return engine::target_claims(self, target, device_text, ask_with(device));
           });

  // The process's one registry, owned by this module: tileops.backend's registry functions
  // and discovery's transactions both use it without importing each other.
  m.attr("process_registry") = nb::cast(new Registry(), nb::rv_policy::take_ownership);

  // The error texts the Python side raises itself, so each is still written once.
  nb::module_ messages = m.def_submodule("messages", "Error texts, written once in the engine.");
  namespace msg = engine::messages;
  messages.def("no_builder", &msg::no_builder);
  messages.def("not_wired", &msg::not_wired);
  messages.def("no_in_tree_kernel", &msg::no_in_tree_kernel);
  messages.def("not_callable", &msg::not_callable);
  messages.def("wrong_device", &msg::wrong_device);
  messages.def("builder_raised", &msg::builder_raised);
  messages.def("in_tree_wrong_device", &msg::in_tree_wrong_device);
  messages.def("in_tree_not_built", &msg::in_tree_not_built);
  messages.def("wrong_result_count", &msg::wrong_result_count);
  messages.def("wrong_result_meta", &msg::wrong_result_meta);
  messages.def("result_aliases_input", &msg::result_aliases_input);
  messages.def("load_failure_note", &msg::load_failure_note);
}

}  // namespace tileops::bindings
