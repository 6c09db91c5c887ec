// The per-call path of every op. One Dispatcher per op instance owns its kernel memo.
//
// A call reads each input's device, dtype, shape and contiguity straight from the tensor
// object (DLPack exchange API when torch has it, attribute reads otherwise), builds the
// memo key on the stack, looks it up and launches the kernel. Validation, target
// settling and building run in Python only on a miss (`on_miss`): their outcome is a
// function of the key and the instance's fixed params, so a hit is already validated.
// The one exception is an op's value rules (offsets, lengths, page tables): values change
// without changing the key, so they are checked here on every call, before the launch.
// Tracers (tensor subclasses such as FakeTensor, active torch-function or dispatch
// modes) are routed to `on_trace`, the op's torch.library custom op.
#include <nanobind/stl/string.h>
#include <structmember.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <array>
#include <vector>

#include "bindings/capture.h"
#include "bindings/dlpack_view.h"
#include "bindings/py_support.h"
#include "engine/kernel_cache.h"
#include "engine/signature.h"
#include "engine/value_rules.h"

namespace tileops::bindings {
namespace {

using engine::Handle;
using engine::KernelCache;
using engine::KeyBuffer;

// What the hot path needs from torch, handed over once by tileops.ops._runtime.
struct TorchFacts {
  PyTypeObject* tensor_type = nullptr;     // torch.Tensor
  PyTypeObject* parameter_type = nullptr;  // torch.nn.Parameter: plain data, common for weights
  const dlpack::ExchangeApi* exchange = nullptr;
  PyObject* describe = nullptr;            // slow reader: t -> (dev_type, dev_index, dtype, shape, contiguous)
  PyObject* function_mode_enabled = nullptr;
  PyObject* dispatch_stack_length = nullptr;
  PyObject* contiguous_name = nullptr;
  PyObject* copy_name = nullptr;
  PyObject* add_note_name = nullptr;
  // Slow reader for value rules: t -> (keep-alive, host data pointer or 0, bits, is_int,
  // shape, strides) of a host copy; for tensors the DLPack exchange does not give on the CPU.
  PyObject* host_values = nullptr;
};
TorchFacts g_torch;

constexpr int64_t kCpuIndex = -1;  // torch.device("cpu") has no index

enum class Kind { kAbsent, kPlain, kSubclass, kOther };

Kind classify(PyObject* object) {
  if (object == Py_None) return Kind::kAbsent;
  PyTypeObject* type = Py_TYPE(object);
  if (type == g_torch.tensor_type || type == g_torch.parameter_type) return Kind::kPlain;
  if (PyType_IsSubtype(type, g_torch.tensor_type)) return Kind::kSubclass;
  return Kind::kOther;
}

// Calls a METH_NOARGS builtin through its C function pointer when it is one (a few ns),
// through the normal protocol otherwise.
PyObject* call_no_args(PyObject* function) {
  if (PyCFunction_Check(function) && (PyCFunction_GET_FLAGS(function) & METH_NOARGS)) {
    return PyCFunction_GET_FUNCTION(function)(PyCFunction_GET_SELF(function), nullptr);
  }
  return PyObject_CallNoArgs(function);
}

// The innermost dispatch modes that only watch (tileops.integrations.transformers' check
// of a kernel tape's recording): ops under them run their kernels as in eager. Per
// thread, as torch's mode stack is.
thread_local long g_watching_modes = 0;

bool tracer_active() {
  PyObject* on = call_no_args(g_torch.function_mode_enabled);
  if (!on) throw nb::python_error();
  const bool function_mode = on == Py_True;
  Py_DECREF(on);
  if (function_mode) return true;
  PyObject* depth = call_no_args(g_torch.dispatch_stack_length);
  if (!depth) throw nb::python_error();
  const long length = PyLong_AsLong(depth);
  Py_DECREF(depth);
  return length > g_watching_modes;
}

bool compact(const dlpack::Tensor& view) {
  if (view.strides == nullptr) return true;
  int64_t expected = 1;
  for (int32_t d = view.ndim - 1; d >= 0; --d) {
    const int64_t size = view.shape[d];
    if (size == 0) return true;  // no elements: every layout is contiguous
    if (size != 1 && view.strides[d] != expected) return false;
    expected *= size;
  }
  return true;
}

struct SlotRead {
  int64_t device_type;
  int64_t device_index;
  bool contiguous;
};

// Appends one tensor's (dtype, shape) to the key and reports its device and layout.
// `refused` remembers, per input slot, that the DLPack exchange turned the last tensor
// down (meta tensors have no DLPack form, and torch's refusal costs about a millisecond):
// such a slot is read through attributes until it sees a DLPack device again.
SlotRead read_tensor(PyObject* tensor, KeyBuffer& key, bool& refused) {
  if (g_torch.exchange != nullptr && !refused) {
    dlpack::Tensor view;
    if (g_torch.exchange->dltensor_from_py_object_no_sync(tensor, &view) == 0) {
      const int64_t type = view.device.device_type;
      const int64_t index = type == dlpack::kCPU ? kCpuIndex : view.device.device_id;
      key.add_tensor(dlpack::dtype_word(view.dtype),
                     std::span<const int64_t>(view.shape, static_cast<size_t>(view.ndim)));
      return {type, index, compact(view)};
    }
    PyErr_Clear();  // e.g. meta tensors have no DLPack form: read attributes instead
    refused = true;
  }
  nb::object info = nb::steal(PyObject_CallOneArg(g_torch.describe, tensor));
  if (!info.is_valid()) throw nb::python_error();
  auto fields = nb::borrow<nb::tuple>(info);
  auto shape = nb::borrow<nb::tuple>(fields[3]);
  std::vector<int64_t> dims(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) dims[i] = nb::cast<int64_t>(shape[i]);
  key.add_tensor(nb::cast<int64_t>(fields[2]), dims);
  const int64_t type = nb::cast<int64_t>(fields[0]);
  if (type == dlpack::kCPU || type == dlpack::kCUDA) refused = false;
  return {type, nb::cast<int64_t>(fields[1]), nb::cast<bool>(fields[4])};
}

class OwnerGil final : public engine::OwnerLock {
 public:
  void unlock() override { state_ = PyEval_SaveThread(); }
  void lock() override { PyEval_RestoreThread(state_); }

 private:
  PyThreadState* state_ = nullptr;
};

constexpr size_t kMaxSlots = 16;

class Dispatcher final : public Launcher {
 public:
  Dispatcher(std::string op, size_t slots, std::vector<bool> mutated, nb::object on_miss, nb::object on_trace,
             nb::object on_first_result)
      : op_(std::move(op)),
        slots_(slots),
        mutated_(std::move(mutated)),
        on_miss_(std::move(on_miss)),
        on_trace_(std::move(on_trace)),
        on_first_result_(std::move(on_first_result)),
        cache_(op_) {
    if (slots_ == 0 || slots_ > kMaxSlots) {
      throw nb::value_error("an op has between 1 and 16 input slots");
    }
    mutated_.resize(slots_, false);
  }

  // op(*slots): the hot path (the vectorcall entry below calls this without a tuple).
  nb::object call(nb::args args) { return dispatch(items_of(args), args.size(), true); }
  // Inside the custom op's eager implementation: tracers were already handled.
  nb::object call_eager(nb::args args) { return dispatch(items_of(args), args.size(), false); }

  nb::object dispatch(PyObject* const* items, size_t count, bool route_tracers) {
    if (count != slots_) return miss(items, count);  // the miss path words the arity error

    if (route_tracers) {
      for (size_t i = 0; i < count; ++i) {
        if (classify(items[i]) == Kind::kSubclass) return forward_to(on_trace_, items, count);
      }
      if (tracer_active()) return forward_to(on_trace_, items, count);
    }

    KeyBuffer key;
    std::array<bool, kMaxSlots> contiguous;
    if (!key_of(items, count, key, contiguous.data())) return miss(items, count);
    if (const Handle* found = cache_.find(key.view())) {
      // Owned for the launch: a kernel that lets the GIL go may be evicted meanwhile.
      nb::object kernel = nb::borrow(static_cast<PyObject*>(found->get()));
      if (!rules_.empty()) check_values(items);
      if (capturing()) {  // one thread-local read on the hot path
        const bool all = std::all_of(contiguous.begin(), contiguous.begin() + count, [](bool c) { return c; });
        return capture_launch(nb::find(this), *this, kernel.ptr(), items, count, all,
                              [&] { return launch(kernel.ptr(), items, contiguous.data()); });
      }
      return launch(kernel.ptr(), items, contiguous.data());
    }
    if (capturing()) {  // it still runs; the capture fails at its end
      capture_failed(
          op_ +
              ": its kernel for this input signature was built during the capture (a replay would "
              "not build it); run the captured stretch once before capturing it, as before a CUDA graph capture",
          /*built=*/true);
    }
    nb::object kernel = miss(items, count);  // validates (values too) before it builds
    nb::object result = launch(kernel.ptr(), items, contiguous.data());
    std::array<PyObject*, kMaxSlots + 2> check_args;
    check_args[0] = kernel.ptr();
    check_args[1] = result.ptr();
    std::copy(items, items + count, check_args.begin() + 2);
    forward_to(on_first_result_, check_args.data(), count + 2);
    return result;
  }

  // The miss path's memo access: the kernel for `tensors`' signature, built by `build`
  // at most once however many threads ask together.
  nb::object fetch(int64_t role, nb::tuple tensors, nb::object build) {
    KeyBuffer key;
    if (tensors.size() == 0 || !key_of(&PyTuple_GET_ITEM(tensors.ptr(), 0), tensors.size(), key)) {
      throw nb::type_error("fetch: every slot must be a tensor or None");
    }
    OwnerGil gil;
    Handle kernel = cache_.get_or_build(key.view(), role, [&] { return to_handle(build()); }, gil);
    return from_handle(kernel);
  }

  // Drops the kernel for these slots (a kernel whose first result broke the manifest).
  void forget(nb::args args) {
    KeyBuffer key;
    if (args.size() == 0 || !key_of(items_of(args), args.size(), key)) return;
    cache_.erase(key.view());
  }

  nb::list items() const {
    nb::list out;
    for (const auto& item : cache_.items()) {
      nb::list words;
      for (int64_t word : item.key) words.append(word);
      out.append(nb::make_tuple(words, item.role, from_handle(item.kernel)));
    }
    return out;
  }

  nb::dict stats() const {
    auto s = cache_.stats();
    nb::dict out;
    out["hits"] = s.hits;
    out["misses"] = s.misses;
    out["builds"] = s.builds;
    out["evictions"] = s.evictions;
    out["size"] = cache_.size();
    return out;
  }

  void clear() { cache_.clear(); }
  size_t slots() const { return slots_; }

  // The op's value rules: (kind, text, tensor slots, scalar programs), and the input names.
  using RuleSpec = std::tuple<int, std::string, std::vector<int>, std::vector<std::vector<int64_t>>>;
  void set_value_rules(const std::vector<RuleSpec>& rules, std::vector<std::string> names) {
    if (names.size() != slots_) throw nb::value_error("set_value_rules: one name per input slot");
    rules_.clear();
    reads_values_.fill(false);
    for (const auto& [kind, text, tensors, scalars] : rules) {
      if (kind < 0 || kind > static_cast<int>(engine::ValueKind::kWritesApart))
        throw nb::value_error("set_value_rules: unknown kind");
      for (int slot : tensors) {
        if (slot < 0 || static_cast<size_t>(slot) >= slots_)
          throw nb::value_error("set_value_rules: slot out of range");
        reads_values_[static_cast<size_t>(slot)] = true;
      }
      rules_.push_back({static_cast<engine::ValueKind>(kind), text, tensors, scalars});
    }
    names_ = std::move(names);
  }

  // Raises ValueError naming the first value rule the call's inputs break.
  void check_values(PyObject* const* items) {
    std::array<engine::SlotValues, kMaxSlots> slots{};
    std::array<dlpack::Tensor, kMaxSlots> views;
    std::array<nb::object, kMaxSlots> copies;  // host copies read through the slow path
    std::array<std::vector<int64_t>, kMaxSlots> shapes, strides;
    for (size_t i = 0; i < slots_; ++i) {
      if (items[i] == Py_None) continue;
      engine::SlotValues& s = slots[i];
      s.present = true;
      if (g_torch.exchange != nullptr && !exchange_refused_[i] &&
          g_torch.exchange->dltensor_from_py_object_no_sync(items[i], &views[i]) == 0) {
        const dlpack::Tensor& v = views[i];
        const bool on_host = v.device.device_type == dlpack::kCPU;
        if (on_host || !reads_values_[i]) {
          s.shape = {v.shape, static_cast<size_t>(v.ndim)};
          if (v.strides != nullptr) s.strides = {v.strides, static_cast<size_t>(v.ndim)};
          s.is_int = v.dtype.code == dlpack::kInt;
          s.bits = v.dtype.bits;
          s.data = on_host ? static_cast<const char*>(v.data) + v.byte_offset : nullptr;
          continue;
        }
      } else if (g_torch.exchange != nullptr) {
        PyErr_Clear();
      }
      // Another device (or no DLPack form): a host copy, made in Python.
      nb::object info = nb::steal(PyObject_CallOneArg(g_torch.host_values, items[i]));
      if (!info.is_valid()) throw nb::python_error();
      auto fields = nb::borrow<nb::tuple>(info);
      copies[i] = fields[0];
      const auto pointer = nb::cast<uintptr_t>(fields[1]);
      if (pointer == 0 && reads_values_[i]) return;  // no values to read (a meta tensor)
      s.data = reinterpret_cast<const void*>(pointer);
      s.bits = nb::cast<int>(fields[2]);
      s.is_int = nb::cast<bool>(fields[3]);
      shapes[i] = nb::cast<std::vector<int64_t>>(fields[4]);
      strides[i] = nb::cast<std::vector<int64_t>>(fields[5]);
      s.shape = shapes[i];
      s.strides = strides[i];
    }
    const std::string why =
        engine::check_value_rules(rules_, std::span<const engine::SlotValues>(slots.data(), slots_), names_);
    if (!why.empty()) {
      PyErr_SetString(PyExc_ValueError, (op_ + ": " + why).c_str());
      throw nb::python_error();
    }
  }

  // A captured launch, again (capture.cc): as a memo hit runs it. Its inputs were
  // contiguous when captured, and are the same tensors.
  nb::object relaunch(PyObject* kernel, PyObject* const* items) override {
    if (!rules_.empty()) check_values(items);
    std::array<bool, kMaxSlots> contiguous;
    contiguous.fill(true);
    return launch(kernel, items, contiguous.data());
  }
  const std::string& op_name() const override { return op_; }

  void set_return_slot(int64_t slot) { return_slot_ = slot; }
  void set_target_label(std::string label) { target_label_ = std::move(label); }

 private:
  // Key of a run of slots; false if one is neither a tensor nor None, if no slot holds a
  // tensor, or if the tensors are on different devices (the miss path words each error).
  bool key_of(PyObject* const* items, size_t count, KeyBuffer& key, bool* contiguous = nullptr) {
    if (count > kMaxSlots) return false;
    bool has_device = false;
    int64_t device_type = 0, device_index = 0;
    key.set_device(0, 0);
    for (size_t i = 0; i < count; ++i) {
      PyObject* item = items[i];
      const Kind kind = classify(item);
      if (contiguous) contiguous[i] = true;
      if (kind == Kind::kAbsent) {
        key.add_absent();
        continue;
      }
      if (kind == Kind::kOther) return false;
      SlotRead read = read_tensor(item, key, exchange_refused_[i]);
      if (contiguous) contiguous[i] = read.contiguous;
      if (!has_device) {
        device_type = read.device_type;
        device_index = read.device_index;
        key.rewrite_device(device_type, device_index);
        has_device = true;
      } else if (read.device_type != device_type || read.device_index != device_index) {
        return false;
      }
    }
    return has_device;
  }

  static PyObject* const* items_of(nb::args& args) { return &PyTuple_GET_ITEM(args.ptr(), 0); }

  static nb::object forward_to(const nb::object& callback, PyObject* const* items, size_t count) {
    PyObject* result = PyObject_Vectorcall(callback.ptr(), items, count, nullptr);
    if (result == nullptr) throw nb::python_error();
    return nb::steal(result);
  }

  // Validates, settles the target and builds (Python); returns the kernel or raises.
  nb::object miss(PyObject* const* items, size_t count) { return forward_to(on_miss_, items, count); }

  nb::object launch(PyObject* kernel, PyObject* const* items, const bool* contiguous) {
    const bool all_contiguous = std::all_of(contiguous, contiguous + slots_, [](bool c) { return c; });
    if (all_contiguous) {
      PyObject* result = PyObject_Vectorcall(kernel, items, slots_, nullptr);
      if (result == nullptr) {
        note_kernel_error();
        throw nb::python_error();
      }
      if (return_slot_ >= 0) {
        Py_DECREF(result);
        return nb::borrow(items[return_slot_]);
      }
      return nb::steal(result);
    }
    // Some input is strided: hand the kernel contiguous copies (E4).
    std::array<PyObject*, kMaxSlots> argv;
    std::array<nb::object, kMaxSlots> copies;
    for (size_t i = 0; i < slots_; ++i) {
      argv[i] = items[i];
      if (contiguous[i] || items[i] == Py_None) continue;
      copies[i] = nb::steal(PyObject_CallMethodNoArgs(items[i], g_torch.contiguous_name));
      if (!copies[i].is_valid()) throw nb::python_error();
      argv[i] = copies[i].ptr();
    }
    PyObject* result = PyObject_Vectorcall(kernel, argv.data(), slots_, nullptr);
    if (result == nullptr) {
      note_kernel_error();
      throw nb::python_error();
    }
    nb::object owned = nb::steal(result);
    // A written input that had to be copied gets its values back.
    for (size_t i = 0; i < slots_; ++i) {
      if (!mutated_[i] || !copies[i].is_valid()) continue;
      PyObject* done = PyObject_CallMethodOneArg(items[i], g_torch.copy_name, copies[i].ptr());
      if (done == nullptr) throw nb::python_error();
      Py_DECREF(done);
    }
    if (return_slot_ >= 0) return nb::borrow(items[return_slot_]);
    return owned;
  }

  // The kernel's own exception reaches the caller unchanged, with a note naming the target.
  void note_kernel_error() {
    if (target_label_.empty()) return;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (value != nullptr && PyObject_HasAttr(value, g_torch.add_note_name)) {
      std::string note = engine::messages::kernel_raised(target_label_, op_);
      PyObject* text = PyUnicode_FromString(note.c_str());
      PyObject* done = PyObject_CallMethodOneArg(value, g_torch.add_note_name, text);
      Py_XDECREF(text);
      if (done == nullptr) PyErr_Clear();
      Py_XDECREF(done);
    }
    PyErr_Restore(type, value, traceback);
  }

  std::string op_;
  size_t slots_;
  std::vector<bool> mutated_;
  nb::object on_miss_, on_trace_, on_first_result_;
  KernelCache cache_;
  int64_t return_slot_ = -1;
  std::string target_label_;
  std::array<bool, kMaxSlots> exchange_refused_{};
  std::vector<engine::ValueRule> rules_;
  std::vector<std::string> names_;
  std::array<bool, kMaxSlots> reads_values_{};
};

// The object an op's forward calls: a tiny CPython type whose vectorcall goes straight
// to Dispatcher::dispatch, with no argument tuple and no binding-layer conversion.
struct CallEntry {
  PyObject_HEAD vectorcallfunc vectorcall;
  PyObject* owner;  // the Python Dispatcher object: keeps `impl` alive
  Dispatcher* impl;
};

PyObject* call_entry_vectorcall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* entry = reinterpret_cast<CallEntry*>(self);
  if (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0) {
    PyErr_SetString(PyExc_TypeError, "an op's dispatcher takes its inputs positionally");
    return nullptr;
  }
  try {
    return entry->impl->dispatch(args, PyVectorcall_NARGS(nargsf), true).release().ptr();
  } catch (nb::python_error& error) {
    error.restore();
  } catch (const engine::EngineError& error) {
    set_python_error(error);
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
  }
  return nullptr;
}

void call_entry_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  Py_XDECREF(reinterpret_cast<CallEntry*>(self)->owner);
  type->tp_free(self);
  Py_DECREF(type);
}

PyMemberDef call_entry_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(CallEntry, vectorcall), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot call_entry_slots[] = {{Py_tp_dealloc, reinterpret_cast<void*>(call_entry_dealloc)},
                                  {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
                                  {Py_tp_members, call_entry_members},
                                  {0, nullptr}};

PyType_Spec call_entry_spec = {"tileops._C.DispatchEntry", sizeof(CallEntry), 0,
                               Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL, call_entry_slots};

PyTypeObject* g_call_entry_type = nullptr;

nb::object make_call_entry(nb::handle dispatcher) {
  auto* entry = PyObject_New(CallEntry, g_call_entry_type);
  if (entry == nullptr) throw nb::python_error();
  Py_INCREF(g_call_entry_type);  // heap-type instances own a reference to their type
  entry->vectorcall = call_entry_vectorcall;
  entry->owner = dispatcher.inc_ref().ptr();
  entry->impl = nb::inst_ptr<Dispatcher>(dispatcher);
  return nb::steal(reinterpret_cast<PyObject*>(entry));
}

}  // namespace

void bind_dispatcher(nb::module_& m) {
  m.def(
      "init_torch_facts",
      [](nb::handle tensor_type, nb::handle parameter_type, nb::handle exchange_capsule, nb::handle describe,
         nb::handle function_mode_enabled, nb::handle dispatch_stack_length) {
        g_torch.tensor_type = reinterpret_cast<PyTypeObject*>(tensor_type.inc_ref().ptr());
        g_torch.parameter_type = reinterpret_cast<PyTypeObject*>(parameter_type.inc_ref().ptr());
        g_torch.exchange = nullptr;
        if (!exchange_capsule.is_none()) {
          auto* api = static_cast<const dlpack::ExchangeApi*>(
              PyCapsule_GetPointer(exchange_capsule.ptr(), "dlpack_exchange_api"));
          if (api == nullptr) throw nb::python_error();
          // Major version 1 is the layout declared in dlpack_abi.h.
          if (api->header.version.major == 1 && api->dltensor_from_py_object_no_sync != nullptr) {
            g_torch.exchange = api;
          }
        }
        g_torch.describe = describe.inc_ref().ptr();
        g_torch.function_mode_enabled = function_mode_enabled.inc_ref().ptr();
        g_torch.dispatch_stack_length = dispatch_stack_length.inc_ref().ptr();
        g_torch.contiguous_name = PyUnicode_InternFromString("contiguous");
        g_torch.copy_name = PyUnicode_InternFromString("copy_");
        g_torch.add_note_name = PyUnicode_InternFromString("add_note");
        return g_torch.exchange != nullptr;
      },
      "Hands the hot path what it reads from torch; returns whether DLPack exchange is used.");
  m.def(
      "set_watching_modes", [](long n) { g_watching_modes = n < 0 ? 0 : n; },
      "How many of the innermost torch dispatch modes only watch: ops under them are not traced.");
  m.def(
      "set_host_values_reader", [](nb::handle reader) { g_torch.host_values = reader.inc_ref().ptr(); },
      "t -> (keep-alive, host data pointer or 0, bits, is_int, shape, strides), for value rules.");

  g_call_entry_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&call_entry_spec));
  if (g_call_entry_type == nullptr) throw nb::python_error();

  nb::class_<Dispatcher>(m, "Dispatcher", "Per-op-instance call path and kernel memo.")
      .def(nb::init<std::string, size_t, std::vector<bool>, nb::object, nb::object, nb::object>(), nb::arg("op"),
           nb::arg("slots"), nb::arg("mutated"), nb::arg("on_miss"), nb::arg("on_trace"), nb::arg("on_first_result"))
      .def("__call__", &Dispatcher::call)
      .def("call_eager", &Dispatcher::call_eager)
      .def(
          "entry", [](nb::handle self) { return make_call_entry(self); },
          "A vectorcall callable running this dispatcher's hot path.")
      .def("fetch", &Dispatcher::fetch, nb::arg("role"), nb::arg("tensors"), nb::arg("build"))
      .def("forget", &Dispatcher::forget)
      .def("items", &Dispatcher::items)
      .def("stats", &Dispatcher::stats)
      .def("clear", &Dispatcher::clear)
      .def("set_return_slot", &Dispatcher::set_return_slot)
      .def("set_value_rules", &Dispatcher::set_value_rules, nb::arg("rules"), nb::arg("names"))
      .def(
          "check_values",
          [](Dispatcher& d, nb::args args) {
            if (args.size() != d.slots()) throw nb::type_error("check_values: one argument per input slot");
            d.check_values(&PyTuple_GET_ITEM(args.ptr(), 0));
          },
          "Checks the value rules on one call's inputs (raises ValueError); the miss path's check.")
      .def("set_target_label", &Dispatcher::set_target_label);
}

}  // namespace tileops::bindings
