#include "bindings/capture.h"

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <utility>
#include <vector>

#include "tileops/capture_abi.h"

namespace tileops::bindings {
namespace {

// An output a kernel made through the capture ABI while capturing.
struct Output {
  nb::object tensor;
  void* data;
  int64_t dtype_word;
  std::vector<int64_t> shape;
};

struct Launch {
  nb::object owner;  // the dispatcher's Python object: keeps `launcher` alive
  Launcher* launcher;
  nb::object kernel;
  nb::object args;    // the inputs, as a tuple
  nb::object result;  // what the launch returned while capturing
  std::vector<Output> outputs;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void begin();
  std::pair<std::string, bool> end();
  void replay(std::vector<double>* seconds = nullptr);
  void reset();
  size_t size() const { return launches_.size(); }
  std::vector<std::string> descriptions() const;

  nb::object record(nb::handle owner, Launcher& launcher, PyObject* kernel, PyObject* const* items, size_t count,
                    const std::function<nb::object()>& run);
  void fail(const std::string& why, bool built) {
    if (failure_.empty()) failure_ = why;
    built_ = built_ || built;
  }

 private:
  std::deque<Launch> launches_;  // a deque: a launch in progress keeps its address
  std::string failure_;
  bool built_ = false;  // a kernel was built during the capture
  bool capturing_ = false;
  bool captured_ = false;  // a capture ended well: the graph holds it until reset()
};

// This thread's capture, and the launch it records or replays (what the ABI serves).
thread_local Graph* t_capturing = nullptr;
thread_local Launch* t_launch = nullptr;
thread_local bool t_replaying = false;
thread_local size_t t_next_output = 0;

// Sets the launch in progress for the ABI; clears it on leaving, however it leaves.
class InLaunch {
 public:
  InLaunch(Launch& launch, bool replaying) {
    t_launch = &launch;
    t_replaying = replaying;
    t_next_output = 0;
  }
  ~InLaunch() {
    t_launch = nullptr;
    t_replaying = false;
  }
  InLaunch(const InLaunch&) = delete;
  InLaunch& operator=(const InLaunch&) = delete;
};

void Graph::begin() {
  if (t_capturing != nullptr) throw nb::value_error("a capture is already in progress on this thread");
  if (captured_) throw nb::value_error("this graph holds a capture already (reset() it, or make a new Graph)");
  failure_.clear();
  built_ = false;
  capturing_ = true;
  t_capturing = this;
}

std::pair<std::string, bool> Graph::end() {
  if (t_capturing == this) t_capturing = nullptr;
  capturing_ = false;
  std::string failure = std::move(failure_);
  failure_.clear();
  if (failure.empty()) {
    captured_ = true;
  } else {
    launches_.clear();
  }
  return {failure, built_};
}

void Graph::reset() {
  if (capturing_) throw nb::value_error("a graph cannot be reset while it captures");
  launches_.clear();
  captured_ = false;
}

nb::object Graph::record(nb::handle owner, Launcher& launcher, PyObject* kernel, PyObject* const* items, size_t count,
                         const std::function<nb::object()>& run) {
  nb::object args = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(count)));
  if (!args.is_valid()) throw nb::python_error();
  for (size_t i = 0; i < count; ++i) {
    Py_INCREF(items[i]);
    PyTuple_SET_ITEM(args.ptr(), static_cast<Py_ssize_t>(i), items[i]);
  }
  launches_.push_back(Launch{nb::borrow(owner), &launcher, nb::borrow(kernel), std::move(args), nb::none(), {}});
  Launch& launch = launches_.back();
  nb::object result;
  try {
    InLaunch in(launch, false);
    result = run();
  } catch (...) {
    launches_.pop_back();  // a failed launch is not part of the capture
    throw;
  }
  launch.result = result;
  return result;
}

// A kernel that made a fresh result instead of writing the captured one: its values go
// into the captured output, where later launches and the caller read them.
void copy_into(const nb::object& captured, const nb::object& fresh) {
  if (captured.is(fresh) || captured.is_none()) return;
  if (PyTuple_Check(captured.ptr()) && PyTuple_Check(fresh.ptr())) {
    const Py_ssize_t n = PyTuple_GET_SIZE(captured.ptr());
    if (PyTuple_GET_SIZE(fresh.ptr()) != n)
      throw nb::value_error("a replayed launch returned another number of outputs");
    for (Py_ssize_t i = 0; i < n; ++i) {
      copy_into(nb::borrow(PyTuple_GET_ITEM(captured.ptr(), i)), nb::borrow(PyTuple_GET_ITEM(fresh.ptr(), i)));
    }
    return;
  }
  captured.attr("copy_")(fresh);
}

void Graph::replay(std::vector<double>* seconds) {
  if (capturing_) throw nb::value_error("a graph cannot replay while it captures");
  for (Launch& launch : launches_) {
    const auto start = seconds != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    nb::object result;
    {
      InLaunch in(launch, true);
      result = launch.launcher->relaunch(launch.kernel.ptr(), &PyTuple_GET_ITEM(launch.args.ptr(), 0));
    }
    copy_into(launch.result, result);
    if (seconds != nullptr) {
      seconds->push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
}

// "[1, 5632]", or str() of what has no shape (None for an absent optional input)
std::string shape_text(nb::handle value) {
  auto text_of = [](nb::handle h) {
    nb::object text = nb::steal(PyObject_Str(h.ptr()));
    if (!text.is_valid()) throw nb::python_error();
    return nb::cast<std::string>(text);
  };
  if (!nb::hasattr(value, "shape")) return text_of(value);
  std::string text = "[";
  for (nb::handle d : value.attr("shape")) text += (text.size() > 1 ? ", " : "") + text_of(d);
  return text + "]";
}

// "GemmFwdOp: [1, 1024], [5632, 1024] -> [1, 5632]": the op, its inputs' and its result's shapes
std::vector<std::string> Graph::descriptions() const {
  std::vector<std::string> out;
  for (const Launch& launch : launches_) {
    std::string text = launch.launcher->op_name() + ":";
    nb::tuple args = nb::borrow<nb::tuple>(launch.args);
    for (size_t i = 0; i < args.size(); ++i) text += (i ? ", " : " ") + shape_text(args[i]);
    if (PyTuple_Check(launch.result.ptr())) {
      nb::tuple results = nb::borrow<nb::tuple>(launch.result);
      for (size_t i = 0; i < results.size(); ++i) text += (i ? ", " : " -> ") + shape_text(results[i]);
    } else if (!launch.result.is_none()) {
      text += " -> " + shape_text(launch.result);
    }
    out.push_back(std::move(text));
  }
  return out;
}

// ---- the ABI kernels allocate their outputs through (tileops/capture_abi.h) ----------

int abi_in_launch() { return t_launch != nullptr; }

void* abi_output(int ndim, const int64_t* shape, int64_t dtype_word, void** data, tileops_make_output make, void* ctx) {
  Launch* launch = t_launch;
  if (launch == nullptr) return make(ctx, ndim, shape, data);
  if (!t_replaying) {
    void* made = make(ctx, ndim, shape, data);
    if (made == nullptr) return nullptr;
    launch->outputs.push_back(
        Output{nb::borrow(static_cast<PyObject*>(made)), *data, dtype_word, std::vector<int64_t>(shape, shape + ndim)});
    return made;
  }
  const size_t i = t_next_output++;
  if (i >= launch->outputs.size() || launch->outputs[i].dtype_word != dtype_word ||
      !std::equal(shape, shape + ndim, launch->outputs[i].shape.begin(), launch->outputs[i].shape.end())) {
    PyErr_Format(PyExc_ValueError,
                 "graph replay: %s asked for an output its capture did not make (output %zu: its inputs changed "
                 "shape since the capture; capture again)",
                 launch->launcher->op_name().c_str(), i);
    return nullptr;
  }
  *data = launch->outputs[i].data;
  return launch->outputs[i].tensor.inc_ref().ptr();
}

tileops_capture_abi g_abi = {TILEOPS_CAPTURE_ABI_VERSION, abi_in_launch, abi_output};

}  // namespace

bool capturing() { return t_capturing != nullptr; }

nb::object capture_launch(nb::handle owner, Launcher& launcher, PyObject* kernel, PyObject* const* items, size_t count,
                          bool contiguous, const std::function<nb::object()>& run) {
  if (!contiguous) {
    t_capturing->fail(launcher.op_name() +
                          ": an input is strided (the launch copies it first, which a replay "
                          "would not redo); make it contiguous before the capture",
                      false);
    return run();
  }
  return t_capturing->record(owner, launcher, kernel, items, count, run);
}

void capture_failed(const std::string& why, bool built) {
  if (t_capturing != nullptr) t_capturing->fail(why, built);
}

void replay_graph(nb::handle graph) { nb::cast<Graph&>(graph).replay(); }

void bind_capture(nb::module_& m) {
  m.attr("_capture_abi") = nb::capsule(&g_abi, TILEOPS_CAPTURE_ABI_CAPSULE);
  m.def("capturing", &capturing, "Whether this thread is capturing op launches.");
  m.def(
      "in_launch", [] { return t_launch != nullptr; },
      "Whether this thread runs a launch that a capture records or a replay re-runs (its kernel's own work).");
  nb::class_<Graph>(m, "Graph", "Op launches captured on one thread and replayed from C++ (tileops.capture.Graph)")
      .def(nb::init<>())
      .def("begin", &Graph::begin, "starts capturing this thread's op launches")
      .def("end", &Graph::end,
           "stops capturing; returns (why the capture failed, '' when it did not; whether a kernel was built in it)")
      .def(
          "replay", [](Graph& g) { g.replay(); }, "runs every captured launch again, in order")
      .def(
          "replay_timed",
          [](Graph& g) {
            std::vector<double> seconds;
            g.replay(&seconds);
            return seconds;
          },
          "replay(), returning each launch's wall time in seconds (in the order of descriptions())")
      .def("reset", &Graph::reset, "drops the capture")
      .def("__len__", &Graph::size)
      .def("descriptions", &Graph::descriptions, "each captured launch: its op, its inputs' and its result's shapes");
}

}  // namespace tileops::bindings
