#include "bind/tape.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
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
  void replay();
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

void Tape::replay() {
  if (recording_) throw nb::value_error("a tape cannot replay while it records");
  for (RecordedCall& c : calls_) {
    current_ = &c;
    cursor_ = 0;
    output_tap() = this;
    PyObject* out = run_call(c.args, nb::inst_ptr<Kernel>(c.kernel));
    output_tap() = nullptr;
    current_ = nullptr;
    if (out == nullptr) throw nb::python_error();
    Py_DECREF(out);
  }
}

std::vector<std::string> Tape::descriptions() const {
  std::vector<std::string> out;
  for (const RecordedCall& c : calls_) out.push_back(nb::inst_ptr<Kernel>(c.kernel)->description);
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
      .def("replay", &Tape::replay, "runs every recorded call again, in order")
      .def("__len__", &Tape::size)
      .def("descriptions", &Tape::descriptions, "the recorded calls' kernels, in order");
}

}  // namespace tnc
