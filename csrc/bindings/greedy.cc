// Greedy decoding on a captured decode step (tileops.capture.decode_greedy): a causal LM's
// step, captured with its LM head, replayed for many tokens from one call. After each
// replay, each sequence's next token is the first largest of its logits (torch.argmax's
// pick: engine/greedy_pick.h); its embedding row is copied into the step's input rows (or,
// for a step that embeds its tokens itself, the token goes to the step's input ids) and
// the step's positions and cache lengths move on by one, so no Python runs between the
// steps. With end-of-sequence ids, as transformers' greedy search does: a sequence that
// has finished gets `pad` instead, a token among `eos` finishes its sequence, and the loop
// ends early once all have.
//
// The tensors are read once per call (host tensors, contiguous), not once per step.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "bindings/capture.h"
#include "engine/greedy_pick.h"

namespace tileops::bindings {
namespace {

enum class Dtype { kFloat32, kBfloat16, kFloat16, kInt64, kInt32, kOther };

struct HostView {
  void* data = nullptr;
  Dtype dtype = Dtype::kOther;
  std::string dtype_name;
  std::vector<int64_t> shape;
  int64_t itemsize = 0;
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// str(value): its text, whatever its type (nb::str of a non-str object would not convert it)
std::string text_of(nb::handle value) {
  nb::object text = nb::steal(PyObject_Str(value.ptr()));
  if (!text.is_valid()) throw nb::python_error();
  return nb::cast<std::string>(text);
}

[[noreturn]] void refuse(const std::string& why) { throw nb::value_error(("decode_greedy: " + why).c_str()); }

HostView host_view(nb::handle tensor, const char* name) {
  if (!nb::hasattr(tensor, "data_ptr") || !nb::hasattr(tensor, "shape")) {
    refuse(std::string(name) + " must be a tensor, got " + text_of(nb::type_name(tensor.type())));
  }
  const auto device = text_of(tensor.attr("device").attr("type"));
  if (device != "cpu")
    refuse(std::string(name) + " must be a CPU tensor (the loop reads it between replays), got one on " + device);
  if (!nb::cast<bool>(tensor.attr("is_contiguous")())) refuse(std::string(name) + " must be contiguous");
  HostView v;
  v.dtype_name = text_of(tensor.attr("dtype"));
  static const std::pair<const char*, Dtype> kNames[] = {{"torch.float32", Dtype::kFloat32},
                                                         {"torch.bfloat16", Dtype::kBfloat16},
                                                         {"torch.float16", Dtype::kFloat16},
                                                         {"torch.int64", Dtype::kInt64},
                                                         {"torch.int32", Dtype::kInt32}};
  for (const auto& [text, dtype] : kNames) {
    if (v.dtype_name == text) v.dtype = dtype;
  }
  v.itemsize = nb::cast<int64_t>(tensor.attr("element_size")());
  v.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(tensor.attr("data_ptr")()));
  for (nb::handle d : tensor.attr("shape")) v.shape.push_back(nb::cast<int64_t>(d));
  return v;
}

// Refuses `v` unless it is `dtype` with `shape` (-1: any length), naming it.
void expect(const HostView& v, const char* name, Dtype dtype, const char* dtype_name,
            std::initializer_list<int64_t> shape) {
  bool ok = v.dtype == dtype && v.shape.size() == shape.size();
  size_t i = 0;
  for (int64_t d : shape) {
    ok = ok && (d < 0 || v.shape[i] == d);
    ++i;
  }
  if (ok) return;
  std::string want = std::string(dtype_name) + " [";
  i = 0;
  for (int64_t d : shape) want += (i++ ? ", " : "") + (d < 0 ? std::string("*") : std::to_string(d));
  refuse(std::string(name) + " must be " + want + "], got " + v.dtype_name + " " + shape_text(v.shape));
}

engine::LogitType logit_type(const HostView& logits) {
  switch (logits.dtype) {
    case Dtype::kFloat32: return engine::LogitType::kFloat32;
    case Dtype::kBfloat16: return engine::LogitType::kBfloat16;
    case Dtype::kFloat16: return engine::LogitType::kFloat16;
    default: refuse("logits must be float32, bfloat16 or float16 [B, V], got " + logits.dtype_name);
  }
}

float logit_as_float(const HostView& v, int64_t i) {
  switch (v.dtype) {
    case Dtype::kFloat32: return static_cast<const float*>(v.data)[i];
    case Dtype::kBfloat16: return engine::bfloat16_to_float(static_cast<const uint16_t*>(v.data)[i]);
    default: return engine::float16_to_float(static_cast<const uint16_t*>(v.data)[i]);
  }
}

int64_t decode_greedy(nb::handle graph, int64_t steps, nb::handle logits_t, nb::handle table_t, nb::handle rows_t,
                      nb::handle ids_t, nb::handle positions_t, nb::handle lengths_t, nb::handle last_t,
                      nb::handle tokens_t, nb::handle unfinished_t, std::vector<int64_t> eos, int64_t pad,
                      nb::handle kept_t) {
  if (steps < 0) refuse("steps must be >= 0, got " + std::to_string(steps));
  const HostView logits = host_view(logits_t, "logits");
  const engine::LogitType type = logit_type(logits);
  if (logits.shape.size() != 2 || logits.shape[1] < 1) refuse("logits must be [B, V], got " + shape_text(logits.shape));
  const int64_t batch = logits.shape[0], vocab = logits.shape[1];
  const HostView table = host_view(table_t, "table");
  if (table.shape.size() != 2) refuse("table must be the embedding [vocab, hidden], got " + shape_text(table.shape));
  if (rows_t.is_none() == ids_t.is_none()) refuse("give the step's input rows or its input ids, one of the two");
  HostView rows, ids;  // the step reads the tokens' embedding rows, or their ids (it embeds them itself)
  if (ids_t.is_none()) {
    rows = host_view(rows_t, "rows");
    expect(rows, "rows", table.dtype, table.dtype_name.c_str(), {batch, table.shape[1]});
  } else {
    ids = host_view(ids_t, "ids");
    expect(ids, "ids", Dtype::kInt64, "int64", {batch});
  }
  const HostView positions = host_view(positions_t, "positions"), lengths = host_view(lengths_t, "lengths");
  const HostView last_v = host_view(last_t, "last"), tokens_v = host_view(tokens_t, "tokens");
  const HostView unfinished_v = host_view(unfinished_t, "unfinished");
  expect(positions, "positions", Dtype::kInt64, "int64", {batch});
  expect(lengths, "lengths", Dtype::kInt32, "int32", {batch});
  expect(last_v, "last", Dtype::kInt64, "int64", {batch});
  expect(tokens_v, "tokens", Dtype::kInt64, "int64", {batch, -1});
  expect(unfinished_v, "unfinished", Dtype::kInt64, "int64", {batch});
  if (vocab > table.shape[0]) {
    refuse(std::to_string(vocab) + " logits per row but the embedding table has " + std::to_string(table.shape[0]) +
           " rows");
  }
  if (!eos.empty() && (pad < 0 || pad >= table.shape[0])) {
    refuse("pad id " + std::to_string(pad) + " is not a row of the embedding table (" + std::to_string(table.shape[0]) +
           " rows)");
  }
  steps = std::min(steps, tokens_v.shape[1]);
  float* kept = nullptr;
  if (!kept_t.is_none()) {
    const HostView k = host_view(kept_t, "kept_logits");
    expect(k, "kept_logits", Dtype::kFloat32, "float32", {-1, batch, vocab});
    steps = std::min(steps, k.shape[0]);
    kept = static_cast<float*>(k.data);
  }
  const int64_t row_bytes = table.shape[1] * table.itemsize;
  auto* pos = static_cast<int64_t*>(positions.data);
  auto* lens = static_cast<int32_t*>(lengths.data);
  auto* last = static_cast<int64_t*>(last_v.data);
  auto* tokens = static_cast<int64_t*>(tokens_v.data);
  auto* unfinished = static_cast<int64_t*>(unfinished_v.data);
  const auto* embedding = static_cast<const char*>(table.data);
  auto* input_rows = static_cast<char*>(rows.data);
  auto* input_ids = static_cast<int64_t*>(ids.data);
  const auto* scores = static_cast<const char*>(logits.data);
  for (int64_t s = 0; s < steps; ++s) {
    for (int64_t b = 0; b < batch; ++b) {
      if (last[b] < 0 || last[b] >= table.shape[0]) {
        refuse("token " + std::to_string(last[b]) + " of sequence " + std::to_string(b) +
               " is not a row of the embedding table");
      }
      if (input_ids != nullptr) {
        input_ids[b] = last[b];
      } else {
        std::memcpy(input_rows + b * row_bytes, embedding + last[b] * row_bytes, static_cast<size_t>(row_bytes));
      }
      pos[b] += 1;
      lens[b] += 1;
    }
    replay_graph(graph);
    if (kept != nullptr) {
      for (int64_t i = 0; i < batch * vocab; ++i) kept[s * batch * vocab + i] = logit_as_float(logits, i);
    }
    bool any = eos.empty();
    for (int64_t b = 0; b < batch; ++b) {
      int64_t t = engine::first_largest(scores + b * vocab * logits.itemsize, vocab, type);
      if (!eos.empty()) {
        if (unfinished[b] == 0) t = pad;
        if (std::find(eos.begin(), eos.end(), t) != eos.end()) unfinished[b] = 0;
        any = any || unfinished[b] != 0;
      }
      tokens[b * tokens_v.shape[1] + s] = last[b] = t;
    }
    if (!any) return s + 1;
  }
  return steps;
}

}  // namespace

void bind_greedy(nb::module_& m) {
  m.def("decode_greedy", &decode_greedy, nb::arg("graph"), nb::arg("steps"), nb::arg("logits"), nb::arg("table"),
        nb::arg("rows").none(), nb::arg("ids").none(), nb::arg("positions"), nb::arg("lengths"), nb::arg("last"),
        nb::arg("tokens"), nb::arg("unfinished"), nb::arg("eos"), nb::arg("pad"), nb::arg("kept_logits").none(),
        "Greedy decoding on a captured step (tileops.capture.decode_greedy); returns the steps run.");
}

}  // namespace tileops::bindings
