// Every protocol error text is written here, once. The bindings map EngineError::Kind
// to the Python exception classes of tileops.backend; the words stay the engine's.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace tileops::engine {

class EngineError : public std::runtime_error {
 public:
  enum class Kind { kBackend, kUnknownTarget, kAmbiguousTarget, kOpNotAvailable, kValue };
  EngineError(Kind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

// Raised by host callbacks (a detector) for what must reach the caller untouched — in
// Python, KeyboardInterrupt and SystemExit. The engine never wraps it.
class PassThrough : public std::exception {
 public:
  const char* what() const noexcept override { return "interrupted"; }
};

// Python's repr of a str, for the plain names targets and ops use.
std::string py_repr(const std::string& text);
// Python's repr of a list of str: ['a', 'b'].
std::string py_list(const std::vector<std::string>& items);

namespace messages {

// B9: appended to target-choice errors while some backend failed to load.
std::string load_failure_note(size_t failures);

std::string duplicate_detector(const std::string& target, const std::string& existing, const std::string& incoming);
std::string duplicate_builder(const std::string& op, const std::string& target, const std::string& existing,
                              const std::string& incoming);
std::string unknown_target(const std::string& target, const std::vector<std::string>& known);
std::string ambiguous_target(const std::string& device, const std::vector<std::string>& claimants);
std::string detector_raised(const std::string& target, const std::string& detector, const std::string& device);
std::string no_builder(const std::string& target, const std::string& op,
                       const std::vector<std::string>& targets_that_do);
std::string not_wired(const std::string& target, const std::string& op, const std::string& role);
std::string no_in_tree_kernel(const std::string& op, const std::string& role,
                              const std::vector<std::string>& targets_that_do);
std::string not_callable(const std::string& target, const std::string& op, const std::string& role,
                         const std::string& returned);
std::string wrong_device(const std::string& op, const std::string& target, const std::string& device);
std::string recursive_build(const std::string& op);
// Notes added to a builder's or a kernel's own exception, naming who raised it.
std::string builder_raised(const std::string& target, const std::string& op);
std::string kernel_raised(const std::string& target, const std::string& op);
// G1: an in-tree (CUDA) kernel asked to serve another device; `placements` reads
// "x on cpu and weight on cpu".
std::string in_tree_wrong_device(const std::string& kernel, const std::string& placements, bool served_elsewhere);
std::string in_tree_not_built(const std::string& kernel);
// E6: a kernel's first result checked against the manifest's outputs.
std::string wrong_result_count(const std::string& op, const std::string& who, const std::string& returned,
                               size_t declared, const std::string& names);
std::string wrong_result_meta(const std::string& op, const std::string& who, const std::string& output,
                              const std::string& got, const std::string& declared);
std::string result_aliases_input(const std::string& op, const std::string& who, const std::string& output);

}  // namespace messages
}  // namespace tileops::engine
