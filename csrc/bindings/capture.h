// Capture and replay of op launches: the op layer's CPU-side analogue of a CUDA graph
// (tileops.capture.Graph). While a thread captures, each op call that hits its kernel memo
// launches as usual and is recorded (the kernel, its input tensors, its result); a replay
// runs the recorded launches again from C++, on the same input tensors (which the caller
// updated in place) and into the outputs made while capturing. A call that the capture
// cannot hold (a kernel built: a new input signature; a strided input) still runs, and
// fails the capture at its end.
#pragma once

#include <nanobind/nanobind.h>

#include <functional>
#include <string>

namespace tileops::bindings {

namespace nb = nanobind;

// What a recorded launch needs of the dispatcher that made it.
class Launcher {
 public:
  virtual ~Launcher() = default;
  // Runs `kernel` on `items` again as a memo hit does: value rules, then the launch.
  virtual nb::object relaunch(PyObject* kernel, PyObject* const* items) = 0;
  virtual const std::string& op_name() const = 0;
};

// Whether this thread is capturing.
bool capturing();

// While capturing: runs a launch through `run` and records it. `owner` is the dispatcher's
// Python object (kept alive by the record), `items` the call's `count` inputs. A launch
// whose inputs are not all contiguous runs but fails the capture.
nb::object capture_launch(nb::handle owner, Launcher& launcher, PyObject* kernel, PyObject* const* items, size_t count,
                          bool contiguous, const std::function<nb::object()>& run);

// While capturing: notes a call the capture cannot hold; the capture fails at its end.
// `built`: a kernel was built (the stretch had not run before at these signatures).
void capture_failed(const std::string& why, bool built = false);

// Replays a tileops._C.Graph (greedy decoding between replays: greedy.cc).
void replay_graph(nb::handle graph);

void bind_capture(nb::module_& m);
void bind_greedy(nb::module_& m);

}  // namespace tileops::bindings
