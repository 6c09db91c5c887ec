#include "engine/errors.h"

namespace tileops::engine {

std::string py_repr(const std::string& text) {
  // Python prefers single quotes and switches to double quotes when only ' appears.
  const bool has_single = text.find('\'') != std::string::npos;
  const bool has_double = text.find('"') != std::string::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char c : text) {
    if (c == '\\' || c == quote) out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  out += quote;
  return out;
}

std::string py_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += py_repr(items[i]);
  }
  return out + "]";
}

namespace messages {

std::string load_failure_note(size_t failures) {
  if (failures == 0) return "";
  return " (" + std::to_string(failures) + " backend(s) failed to load; see tileops.backend.load_failures())";
}

std::string duplicate_detector(const std::string& target, const std::string& existing, const std::string& incoming) {
  return "target " + py_repr(target) + " already has a detector (" + existing + "); a second one (" + incoming +
         ") cannot be registered: one target is one set of kernels from one provider";
}

std::string duplicate_builder(const std::string& op, const std::string& target, const std::string& existing,
                              const std::string& incoming) {
  return "target " + py_repr(target) + " already registers a kernel builder for " + op + " (" + existing +
         "); a second one (" + incoming +
         ") means two installed packages claim that target — a misinstall: uninstall one of them";
}

std::string unknown_target(const std::string& target, const std::vector<std::string>& known) {
  return "no backend registered target " + py_repr(target) + "; known targets: " + py_list(known);
}

std::string ambiguous_target(const std::string& device, const std::vector<std::string>& claimants) {
  return "targets " + py_list(claimants) + " all claim device " + py_repr(device) +
         "; pass target= to the op (or call tileops.backend.set_default_target) to choose one";
}

std::string detector_raised(const std::string& target, const std::string& detector, const std::string& device) {
  return "the detector of target " + py_repr(target) + " (" + detector + ") raised when asked about device " +
         py_repr(device) + "; a detector must return False for a device that is not its own";
}

std::string no_builder(const std::string& target, const std::string& op,
                       const std::vector<std::string>& targets_that_do) {
  return "target " + py_repr(target) + " registers no kernel builder for " + op +
         "; targets that do: " + py_list(targets_that_do) +
         ". There is no fall back to the in-tree implementation: those kernels do not run on "
         "this target's devices.";
}

std::string not_wired(const std::string& target, const std::string& op, const std::string& role) {
  return "target " + py_repr(target) + " serves " + op + ", but its " + py_repr(role) +
         " call site does not hand over the tensors a builder is described with; that op is not "
         "wired to external targets yet";
}

std::string no_in_tree_kernel(const std::string& op, const std::string& role,
                              const std::vector<std::string>& targets_that_do) {
  return op + " has no in-tree kernel for " + py_repr(role) +
         ", so it needs a target; targets with a builder for it: " + py_list(targets_that_do) +
         ". Install a backend that serves it, or pass target=.";
}

std::string not_callable(const std::string& target, const std::string& op, const std::string& role,
                         const std::string& returned) {
  return "target " + py_repr(target) + " built " + returned + " for " + op + " (" + py_repr(role) +
         "), which is not callable; build_kernel must return a kernel callable as "
         "kernel(*tensors)";
}

std::string wrong_device(const std::string& op, const std::string& target, const std::string& device) {
  return op + " is settled on target " + py_repr(target) + ", whose detector does not claim device " + py_repr(device) +
         "; use a separate op instance for that device";
}

std::string recursive_build(const std::string& op) {
  return "the kernel builder for " + op +
         " called the same op instance with the same input signature while building it; a "
         "builder must not wait on its own result";
}

std::string builder_raised(const std::string& target, const std::string& op) {
  return "raised by the kernel builder of target " + py_repr(target) + " for " + op;
}

std::string kernel_raised(const std::string& target, const std::string& op) {
  return "raised by the kernel that target " + py_repr(target) + " built for " + op;
}

std::string in_tree_wrong_device(const std::string& kernel, const std::string& placements, bool served_elsewhere) {
  std::string text = kernel + " is a CUDA kernel; got " + placements + ".";
  if (served_elsewhere) text += " Another target's backend serves other devices.";
  return text;
}

std::string in_tree_not_built(const std::string& kernel) {
  return kernel +
         " is a CUDA kernel, and this installation of tileops was built without in-tree CUDA "
         "kernels; install a backend that serves cuda devices and pass its name as target=, or "
         "use a tileops build with CUDA kernels";
}

std::string wrong_result_count(const std::string& op, const std::string& who, const std::string& returned,
                               size_t declared, const std::string& names) {
  return op + ": " + who + " returned " + returned + "; the manifest declares " + std::to_string(declared) +
         " output tensor(s): " + names;
}

std::string wrong_result_meta(const std::string& op, const std::string& who, const std::string& output,
                              const std::string& got, const std::string& declared) {
  return op + ": " + who + " returned output " + py_repr(output) + " as " + got + "; the manifest declares " + declared;
}

std::string result_aliases_input(const std::string& op, const std::string& who, const std::string& output) {
  return op + ": " + who + " returned output " + py_repr(output) +
         " sharing memory with an input; outputs must be fresh tensors";
}

}  // namespace messages
}  // namespace tileops::engine
