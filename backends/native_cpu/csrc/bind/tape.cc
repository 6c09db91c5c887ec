#include "bind/tape.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <utility>
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

// ---- greedy decoding on a tape ------------------------------------------------------
// A causal LM's decode step recorded with its LM head replayed for many tokens from one
// call: after each replay, each sequence's next token is the first largest of its logits
// (torch.argmax's pick: NaN counts as largest); its embedding row is copied into the
// step's input rows and the step's positions and cache lengths move on by one, so no
// Python runs between the steps. With end-of-sequence ids, as transformers' greedy search
// does: a sequence that has finished gets `pad` instead, a token among `eos` finishes its
// sequence, and the loop ends early once all have.

struct GreedyArgs {
  TensorView logits, table, rows, positions, seqlens, last, tokens, unfinished;
  std::vector<int64_t> eos;
  int64_t pad;
  bool keep = false;
  TensorView kept;  // with keep: each step's logits as float32 [>= steps, B, V]
};

float logit_at(const TensorView& v, int64_t i) {
  switch (v.dtype) {
    case DType::f32: return static_cast<const float*>(v.data)[i];
    case DType::bf16: return to_float(static_cast<const bf16_t*>(v.data)[i]);
    default: return to_float(static_cast<const half_t*>(v.data)[i]);
  }
}

// Row `row` of the logits as float32 into `out` (as transformers keeps each step's logits)
void copy_logits_row(const TensorView& v, int64_t row, float* out) {
  const int64_t n = v.shape[1];
  for (int64_t i = 0; i < n; ++i) out[i] = logit_at(v, row * n + i);
}

// The first largest of n floats given by their bits U (uint16_t: bfloat16 or float16,
// uint32_t: float32; `inf` is +infinity's bits): torch.argmax's pick, NaN counting as
// largest. Compared as integers that keep the floats' order (the magnitude, negated where
// the sign bit is set: -0 and +0 are one key, as they compare equal), a block of keys at a
// time so that the compiler vectorises the maxima (int16 maxima for 16-bit floats: the
// scalar loop over float conversions took 50 us of a decode step at 32000 logits, this
// 7); then the first block holding the maximum is searched for its first index.
template <class U>
int64_t first_largest_bits(const U* x, int64_t n, U inf) {
  using Key = std::conditional_t<sizeof(U) == 2, int16_t, int32_t>;
  constexpr U kMag = std::numeric_limits<U>::max() >> 1;  // all but the sign bit
  constexpr int kSign = 8 * sizeof(U) - 1;
  auto key = [](U b) { const Key mag = static_cast<Key>(b & kMag); return static_cast<Key>(b >> kSign ? -mag : mag); };
  constexpr int64_t kBlock = 256;
  Key top = std::numeric_limits<Key>::min();
  int64_t top_block = 0;  // the first block holding the maximum: where it last grew
  U nan = 0;
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t hi = std::min(n, b0 + kBlock);
    Key m = std::numeric_limits<Key>::min();
    U bad = 0;
    for (int64_t i = b0; i < hi; ++i) {
      m = std::max(m, key(x[i]));
      bad |= static_cast<U>((x[i] & kMag) > inf);
    }
    if (b0 == 0 || m > top) top = m, top_block = b0;
    nan |= bad;
  }
  if (nan)
    for (int64_t i = 0; i < n; ++i)
      if ((x[i] & kMag) > inf) return i;
  int64_t i = top_block;
  while (key(x[i]) != top) ++i;
  return i;
}

int64_t first_largest(const TensorView& logits, int64_t row) {
  const int64_t n = logits.shape[1];
  switch (logits.dtype) {
    case DType::f32: return first_largest_bits(static_cast<const uint32_t*>(logits.data) + row * n, n, uint32_t{0x7F800000});
    case DType::bf16: return first_largest_bits(static_cast<const uint16_t*>(logits.data) + row * n, n, uint16_t{0x7F80});
    default: return first_largest_bits(static_cast<const uint16_t*>(logits.data) + row * n, n, uint16_t{0x7C00});
  }
}

void expect_shape(const TensorView& v, const char* what, DType dtype, std::initializer_list<int64_t> shape) {
  bool ok = v.dtype == dtype && v.ndim == static_cast<int>(shape.size());
  int i = 0;
  for (int64_t d : shape) {  // d < 0: any length
    ok = ok && (d < 0 || v.shape[i] == d);
    ++i;
  }
  if (ok) return;
  std::string want = std::string(dtype_name(dtype)) + " [";
  i = 0;
  for (int64_t d : shape) want += (i++ ? ", " : "") + (d < 0 ? std::string("*") : std::to_string(d));
  throw nb::value_error(("replay_greedy: " + std::string(what) + " must be " + want + "], got " + dtype_name(v.dtype) +
                         " " + shape_text(v.shape, static_cast<size_t>(v.ndim))).c_str());
}

GreedyArgs greedy_args(nb::handle logits, nb::handle table, nb::handle rows, nb::handle positions, nb::handle seqlens,
                       nb::handle last, nb::handle tokens, nb::handle unfinished, std::vector<int64_t> eos, int64_t pad,
                       nb::handle kept) {
  GreedyArgs a{{}, {}, {}, {}, {}, {}, {}, {}, std::move(eos), pad, !kept.is_none(), {}};
  const std::pair<nb::handle, TensorView*> all[] = {{logits, &a.logits}, {table, &a.table}, {rows, &a.rows},
      {positions, &a.positions}, {seqlens, &a.seqlens}, {last, &a.last}, {tokens, &a.tokens}, {unfinished, &a.unfinished}};
  const char* names[] = {"logits", "table", "rows", "positions", "seqlens", "last", "tokens", "unfinished"};
  for (int i = 0; i < 8; ++i)
    if (!read_tensor(all[i].first.ptr(), *all[i].second, names[i])) throw nb::python_error();
  const DType f = a.logits.dtype;
  if (a.logits.ndim != 2 || (f != DType::f32 && f != DType::bf16 && f != DType::f16) || a.logits.shape[1] < 1)
    throw nb::value_error(("replay_greedy: logits must be float32, bfloat16 or float16 [B, V], got " +
                           std::string(dtype_name(f)) + " " + shape_text(a.logits.shape, static_cast<size_t>(a.logits.ndim))).c_str());
  const int64_t b = a.logits.shape[0], vocab = a.logits.shape[1];
  if (a.table.ndim != 2) expect_shape(a.table, "table", a.table.dtype, {-1, -1});
  expect_shape(a.rows, "rows", a.table.dtype, {b, a.table.shape[1]});
  expect_shape(a.positions, "positions", DType::i64, {b});
  expect_shape(a.seqlens, "seqlens", DType::i32, {b});
  expect_shape(a.last, "last", DType::i64, {b});
  expect_shape(a.tokens, "tokens", DType::i64, {b, -1});
  expect_shape(a.unfinished, "unfinished", DType::i64, {b});
  if (vocab > a.table.shape[0])
    throw nb::value_error(("replay_greedy: " + std::to_string(vocab) + " logits per row but the embedding table has " +
                           std::to_string(a.table.shape[0]) + " rows").c_str());
  if (a.keep) {
    if (!read_tensor(kept.ptr(), a.kept, "kept_logits")) throw nb::python_error();
    expect_shape(a.kept, "kept_logits", DType::f32, {-1, b, vocab});
  }
  if (!a.eos.empty() && (pad < 0 || pad >= a.table.shape[0]))
    throw nb::value_error(("replay_greedy: pad id " + std::to_string(pad) + " is not a row of the embedding table (" +
                           std::to_string(a.table.shape[0]) + " rows)").c_str());
  return a;
}

// Replays `steps` steps at most (tokens' columns at most); returns how many ran.
int64_t replay_greedy(Tape& tape, int64_t steps, const GreedyArgs& a) {
  const int64_t batch = a.logits.shape[0], width = a.table.shape[1], row_bytes = width * dtype_size(a.table.dtype);
  steps = std::min(steps, a.tokens.shape[1]);
  if (a.keep) steps = std::min(steps, a.kept.shape[0]);
  auto* kept = a.keep ? static_cast<float*>(a.kept.data) : nullptr;
  auto* pos = static_cast<int64_t*>(a.positions.data);
  auto* lens = static_cast<int32_t*>(a.seqlens.data);
  auto* last = static_cast<int64_t*>(a.last.data);
  auto* tokens = static_cast<int64_t*>(a.tokens.data);
  auto* unfinished = static_cast<int64_t*>(a.unfinished.data);
  const auto* table = static_cast<const char*>(a.table.data);
  auto* rows = static_cast<char*>(a.rows.data);
  for (int64_t s = 0; s < steps; ++s) {
    for (int64_t b = 0; b < batch; ++b) {
      if (last[b] < 0 || last[b] >= a.table.shape[0])
        throw nb::value_error(("replay_greedy: token " + std::to_string(last[b]) + " of sequence " + std::to_string(b) +
                               " is not a row of the embedding table").c_str());
      std::memcpy(rows + b * row_bytes, table + last[b] * row_bytes, static_cast<size_t>(row_bytes));
      pos[b] += 1;
      lens[b] += 1;
    }
    tape.replay();
    if (a.keep)
      for (int64_t b = 0; b < batch; ++b) copy_logits_row(a.logits, b, kept + (s * batch + b) * a.logits.shape[1]);
    bool any = a.eos.empty();
    for (int64_t b = 0; b < batch; ++b) {
      int64_t t = first_largest(a.logits, b);
      if (!a.eos.empty()) {
        if (unfinished[b] == 0) t = a.pad;
        if (std::find(a.eos.begin(), a.eos.end(), t) != a.eos.end()) unfinished[b] = 0;
        any = any || unfinished[b] != 0;
      }
      tokens[b * a.tokens.shape[1] + s] = last[b] = t;
    }
    if (!any) return s + 1;
  }
  return steps;
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
      .def(
          "replay_greedy",
          [](Tape& t, int64_t steps, nb::handle logits, nb::handle table, nb::handle rows, nb::handle positions,
             nb::handle seqlens, nb::handle last, nb::handle tokens, nb::handle unfinished, std::vector<int64_t> eos,
             int64_t pad, nb::handle kept_logits) {
            if (steps < 0) throw nb::value_error("replay_greedy: steps must be >= 0");
            return replay_greedy(t, steps, greedy_args(logits, table, rows, positions, seqlens, last, tokens, unfinished,
                                                       std::move(eos), pad, kept_logits));
          },
          nb::arg("steps"), nb::arg("logits"), nb::arg("table"), nb::arg("rows"), nb::arg("positions"), nb::arg("seqlens"),
          nb::arg("last"), nb::arg("tokens"), nb::arg("unfinished"), nb::arg("eos"), nb::arg("pad"), nb::kw_only(),
          nb::arg("kept_logits").none() = nb::none(),
          "Greedy decoding on a tape recorded with its LM head (`logits`, its last output [B, V]): up to `steps` "
          "times, each sequence's token in `last` [B] has its row of the embedding `table` copied into `rows` [B, H] "
          "(the step's input), `positions` [B] (int64) and `seqlens` [B] (int32, the cache's lengths) move on by one, "
          "the tape replays, and the first largest logit of each row becomes its next token (into `last` and column "
          "s of `tokens` [B, >= steps]). With `eos` ids, a finished sequence (`unfinished` [B], int64 0/1) gets `pad` "
          "and a token in `eos` finishes its sequence; the loop ends once none is unfinished. With `kept_logits` (float32 "
          "[>= steps, B, V]), step s's logits are copied into kept_logits[s] as float32. Returns the steps run.")
      .def("__len__", &Tape::size)
      .def("descriptions", &Tape::descriptions, "the recorded calls, in order: each kernel, its arguments' shapes and its outputs' shapes");
}

}  // namespace tnc
