#include "bind/tape.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <string>
#include <vector>

#include "dlpack_bridge.h"

namespace tnc {
namespace {

struct RecordedOutput {
  PyObject* tensor;  // strong
  void* data;
  DType dtype;
  std::vector<int64_t> shape;
};

struct RecordedCall {
  PyObject* kernel;  // strong, as are the arguments' tuple and the outputs
  PyObject* args;
  std::vector<RecordedOutput> outputs;
};

class Tape final : public OutputTap {
 public:
  Tape() = default;
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;
  ~Tape() override { clear(); }

  void record();
  void stop();
  void replay(std::vector<double>* seconds = nullptr);
  size_t size() const { return calls_.size(); }
  std::vector<std::string> descriptions() const;
  PyObject* call(PyObject* self, Kernel* k, PyObject* args);
  PyObject* output(int ndim, const int64_t* shape, DType dtype, void** data) override;

 private:
  void clear();
  std::vector<RecordedCall> calls_;
  RecordedCall* current_ = nullptr;  // the call in progress
  size_t cursor_ = 0;                // its next output (replay)
  bool recording_ = false;
};

thread_local Tape* tls_recording = nullptr;

// Runs a kernel object's call, turning a C++ exception into a Python one.
PyObject* run_call(PyObject* args, Kernel* k) {
  try {
    return k->call(&PyTuple_GET_ITEM(args, 0), PyTuple_GET_SIZE(args));
  } catch (const std::exception& e) {
    PyErr_Format(PyExc_RuntimeError, "%s failed: %s", k->description.c_str(), e.what());
    return nullptr;
  }
}

// Drops the references a recorded call holds.
void release(RecordedCall& c) {
  Py_DECREF(c.kernel);
  Py_DECREF(c.args);
  for (RecordedOutput& o : c.outputs) Py_DECREF(o.tensor);
}

void Tape::clear() {
  for (RecordedCall& c : calls_) release(c);
  calls_.clear();
}

void Tape::record() {
  if (tls_recording != nullptr) throw nb::value_error("a tape is already recording on this thread");
  if (!calls_.empty()) throw nb::value_error("this tape already holds a recording (make a new Tape)");
  tls_recording = this;
  recording_ = true;
}

void Tape::stop() {
  if (tls_recording == this) tls_recording = nullptr;
  recording_ = false;
}

PyObject* Tape::call(PyObject* self, Kernel* k, PyObject* args) {
  Py_INCREF(self);
  Py_INCREF(args);
  calls_.push_back(RecordedCall{self, args, {}});
  current_ = &calls_.back();
  output_tap() = this;
  PyObject* out = run_call(args, k);
  output_tap() = nullptr;
  current_ = nullptr;
  if (out == nullptr) {  // a failed call is not part of the recording
    release(calls_.back());
    calls_.pop_back();
  }
  return out;
}

PyObject* Tape::output(int ndim, const int64_t* shape, DType dtype, void** data) {
  if (recording_) {
    PyObject* t = allocate_tensor(ndim, shape, dtype, data);
    if (t != nullptr) {
      Py_INCREF(t);
      current_->outputs.push_back(RecordedOutput{t, *data, dtype, std::vector<int64_t>(shape, shape + ndim)});
    }
    return t;
  }
  const Kernel* k = nb::inst_ptr<Kernel>(current_->kernel);
  if (cursor_ >= current_->outputs.size() || current_->outputs[cursor_].dtype != dtype ||
      !std::equal(shape, shape + ndim, current_->outputs[cursor_].shape.begin(), current_->outputs[cursor_].shape.end())) {
    PyErr_Format(PyExc_ValueError, "tape replay: %s asked for an output the recording did not make (its inputs changed shape)",
                 k->description.c_str());
    return nullptr;
  }
  RecordedOutput& o = current_->outputs[cursor_++];
  *data = o.data;
  Py_INCREF(o.tensor);
  return o.tensor;
}

// seconds: when given, each call's wall time is appended (a profile of a replayed step)
void Tape::replay(std::vector<double>* seconds) {
  if (recording_) throw nb::value_error("a tape cannot replay while it records");
  for (RecordedCall& c : calls_) {
    const auto start = seconds != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    current_ = &c;
    cursor_ = 0;
    output_tap() = this;
    PyObject* out = run_call(c.args, nb::inst_ptr<Kernel>(c.kernel));
    output_tap() = nullptr;
    current_ = nullptr;
    if (out == nullptr) throw nb::python_error();
    Py_DECREF(out);
    if (seconds != nullptr) seconds->push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
}

// "[1, 5632]"
std::string shape_text(const int64_t* shape, size_t ndim) {
  std::string s = "[";
  for (size_t j = 0; j < ndim; ++j) s += (j ? ", " : "") + std::to_string(shape[j]);
  return s + "]";
}

// "native_cpu GemmFwdOp(bfloat16, ...): [1, 1024], [5632, 1024] -> [1, 5632]": the kernel,
// its arguments' shapes (an argument without one as str() writes it: None) and its outputs'
// shapes
std::vector<std::string> Tape::descriptions() const {
  std::vector<std::string> out;
  for (const RecordedCall& c : calls_) {
    std::string d = nb::inst_ptr<Kernel>(c.kernel)->description + ":";
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(c.args); ++i) {
      nb::handle arg(PyTuple_GET_ITEM(c.args, i));
      d += i ? ", " : " ";
      if (nb::hasattr(arg, "shape")) {
        const auto shape = nb::cast<std::vector<int64_t>>(nb::tuple(arg.attr("shape")));
        d += shape_text(shape.data(), shape.size());
      } else {  // None for an absent optional input
        d += nb::cast<std::string>(nb::str(arg));
      }
    }
    for (size_t i = 0; i < c.outputs.size(); ++i) d += (i ? ", " : " -> ") + shape_text(c.outputs[i].shape.data(), c.outputs[i].shape.size());
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

PyObject* call_kernel(PyObject* self, Kernel* k, PyObject* args) {
  if (tls_recording != nullptr) return tls_recording->call(self, k, args);
  return run_call(args, k);
}

void bind_tape(nb::module_& m) {
  nb::class_<Tape>(m, "Tape",
                   "The native kernel calls made while recording (`with tape:`), replayed by replay() on the same "
                   "argument tensors and into the same outputs")
      .def(nb::init<>())
      .def("__enter__", [](Tape& t) -> Tape& { t.record(); return t; }, nb::rv_policy::reference)
      .def("__exit__", [](Tape& t, nb::args) { t.stop(); })
      .def("replay", [](Tape& t) { t.replay(); }, "runs every recorded call again, in order")
      .def(
          "replay_timed",
          [](Tape& t) {
            std::vector<double> seconds;
            t.replay(&seconds);
            return seconds;
          },
          "replay(), returning each call's wall time in seconds (in the order of descriptions())")
      .def("__len__", &Tape::size)
      .def("descriptions", &Tape::descriptions, "the recorded calls, in order: each kernel, its arguments' shapes and its outputs' shapes");
}

}  // namespace tnc
