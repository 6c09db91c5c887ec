#include "engine/value_rules.h"

#include <algorithm>
#include <optional>
#include <sstream>

namespace tileops::engine {
namespace {

// Thrown inside the checks; becomes the "does not hold" text.
struct Broken {
  std::string why;
};

[[noreturn]] void broken(const std::string& why) { throw Broken{why}; }

std::string shape_text(std::span<const int64_t> shape) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << (shape.size() == 1 ? ",)" : ")");
  return out.str();
}

// A slot's values, read through its strides.
class Values {
 public:
  Values(const SlotValues& slot, const std::string& name) : slot_(slot), name_(name) {
    if (!slot.is_int || (slot.bits != 32 && slot.bits != 64)) {
      broken("'" + name + "' must be an int32 or int64 tensor");
    }
  }
  const std::string& name() const { return name_; }
  int64_t ndim() const { return static_cast<int64_t>(slot_.shape.size()); }
  int64_t size(int64_t axis) const { return slot_.shape[static_cast<size_t>(axis)]; }
  std::string shape() const { return shape_text(slot_.shape); }

  int64_t at(int64_t i) const { return load(offset(0, i)); }
  int64_t at(int64_t r, int64_t c) const { return load(offset(0, r) + offset(1, c)); }

 private:
  int64_t offset(size_t axis, int64_t i) const {
    if (slot_.strides.empty()) {
      int64_t stride = 1;
      for (size_t d = axis + 1; d < slot_.shape.size(); ++d) stride *= slot_.shape[d];
      return i * stride;
    }
    return i * slot_.strides[axis];
  }
  int64_t load(int64_t index) const {
    if (slot_.bits == 32) return static_cast<const int32_t*>(slot_.data)[index];
    return static_cast<const int64_t*>(slot_.data)[index];
  }

  const SlotValues& slot_;
  const std::string& name_;
};

int64_t floor_div(int64_t a, int64_t b) {
  if (b == 0) broken("a scalar divides by zero");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t evaluate(std::span<const int64_t> program, std::span<const SlotValues> slots,
                 std::span<const std::string> names) {
  std::vector<int64_t> stack;
  for (size_t pc = 0; pc < program.size();) {
    const auto op = static_cast<Op>(program[pc++]);
    if (op == Op::kConst) {
      stack.push_back(program[pc++]);
      continue;
    }
    if (op == Op::kDim) {
      const auto slot = static_cast<size_t>(program[pc++]);
      int64_t axis = program[pc++];
      const SlotValues& s = slots[slot];
      const auto ndim = static_cast<int64_t>(s.shape.size());
      if (!s.present) broken("'" + names[slot] + "' is absent");
      if (axis < 0) axis += ndim;
      if (axis < 0 || axis >= ndim) {
        broken("'" + names[slot] + "' of shape " + shape_text(s.shape) + " has no axis " +
               std::to_string(program[pc - 1]));
      }
      stack.push_back(s.shape[static_cast<size_t>(axis)]);
      continue;
    }
    if (op == Op::kNeg) {
      stack.back() = -stack.back();
      continue;
    }
    const int64_t b = stack.back();
    stack.pop_back();
    int64_t& a = stack.back();
    switch (op) {
      case Op::kAdd: a += b; break;
      case Op::kSub: a -= b; break;
      case Op::kMul: a *= b; break;
      case Op::kFloorDiv: a = floor_div(a, b); break;
      default: broken("a malformed scalar program");
    }
  }
  if (stack.size() != 1) broken("a malformed scalar program");
  return stack.back();
}

void expect_1d(const Values& t) {
  if (t.ndim() != 1) broken("'" + t.name() + "' must be 1-D, got shape " + t.shape());
}

std::string item(const Values& t, int64_t i) { return t.name() + "[" + std::to_string(i) + "]"; }

void offsets(const Values& t, int64_t total, bool exact) {
  expect_1d(t);
  const int64_t n = t.size(0);
  if (n == 0) broken("'" + t.name() + "' is empty; offsets start with 0");
  if (t.at(0) != 0) broken(item(t, 0) + " = " + std::to_string(t.at(0)) + ", expected 0");
  for (int64_t i = 1; i < n; ++i) {
    if (t.at(i) < t.at(i - 1)) {
      broken(item(t, i) + " = " + std::to_string(t.at(i)) + " is less than " + item(t, i - 1) + " = " +
             std::to_string(t.at(i - 1)) + ": offsets must not decrease");
    }
  }
  const int64_t last = t.at(n - 1);
  if (exact && last != total) {
    broken(item(t, n - 1) + " = " + std::to_string(last) + ", expected " + std::to_string(total));
  }
  if (!exact && last > total) {
    broken(item(t, n - 1) + " = " + std::to_string(last) + " exceeds " + std::to_string(total));
  }
}

void spans_at_most(const Values& t, int64_t limit) {
  expect_1d(t);
  for (int64_t i = 1; i < t.size(0); ++i) {
    const int64_t span = t.at(i) - t.at(i - 1);
    if (span > limit) {
      broken(item(t, i) + " - " + item(t, i - 1) + " = " + std::to_string(span) + " exceeds " + std::to_string(limit));
    }
  }
}

void at_least(const Values& t, int64_t low) {
  expect_1d(t);
  for (int64_t i = 0; i < t.size(0); ++i) {
    if (t.at(i) < low) {
      broken(item(t, i) + " = " + std::to_string(t.at(i)) + " is below " + std::to_string(low));
    }
  }
}

// within(t, low, high): every entry indexes a table of high - low rows (positions into a
// RoPE table, say): outside it a kernel would read past the table.
void within(const Values& t, int64_t low, int64_t high) {
  expect_1d(t);
  for (int64_t i = 0; i < t.size(0); ++i) {
    if (t.at(i) < low || t.at(i) >= high) {
      broken(item(t, i) + " = " + std::to_string(t.at(i)) + " is outside [" + std::to_string(low) + ", " +
             std::to_string(high) + ")");
    }
  }
}

// pages(table, page_size, num_pages, len, [len2]): sequence b holds L_b tokens, the sum of
// len[b] (a [B] tensor) or len[b+1] - len[b] (a [B+1] offsets tensor) over the lengths
// given. L_b must fit in the table's row (columns x page_size), and the pages it uses,
// table[b, 0 .. ceil(L_b / page_size) - 1], must lie in [0, num_pages). Entries past the
// used pages are never read and may hold anything.
void pages(const Values& table, int64_t page_size, int64_t num_pages, const std::vector<Values>& lengths) {
  if (table.ndim() != 2) broken("'" + table.name() + "' must be 2-D, got shape " + table.shape());
  if (page_size <= 0) broken("page_size is " + std::to_string(page_size) + ", expected > 0");
  const int64_t batch = table.size(0), width = table.size(1);
  for (const Values& len : lengths) {
    expect_1d(len);
    if (len.size(0) != batch && len.size(0) != batch + 1) {
      broken("'" + len.name() + "' has " + std::to_string(len.size(0)) + " entries; '" + table.name() + "' has " +
             std::to_string(batch) + " rows, so expected " + std::to_string(batch) + " lengths or " +
             std::to_string(batch + 1) + " offsets");
    }
  }
  for (int64_t b = 0; b < batch; ++b) {
    int64_t tokens = 0;
    std::string terms;
    for (const Values& len : lengths) {
      const bool spans = len.size(0) == batch + 1;
      tokens += spans ? len.at(b + 1) - len.at(b) : len.at(b);
      terms += (terms.empty() ? "" : " + ") + (spans ? item(len, b + 1) + " - " + item(len, b) : item(len, b));
    }
    if (tokens < 0)
      broken("sequence " + std::to_string(b) + " has " + std::to_string(tokens) + " tokens (" + terms + ")");
    if (tokens > width * page_size) {
      broken("sequence " + std::to_string(b) + " needs " + std::to_string(tokens) + " tokens (" + terms +
             "), more than its " + std::to_string(width) + " pages of " + std::to_string(page_size) + " hold (" +
             std::to_string(width * page_size) + ")");
    }
    const int64_t used = (tokens + page_size - 1) / page_size;
    for (int64_t p = 0; p < used; ++p) {
      const int64_t page = table.at(b, p);
      if (page < 0 || page >= num_pages) {
        broken(table.name() + "[" + std::to_string(b) + ", " + std::to_string(p) + "] = " + std::to_string(page) +
               " points outside the cache's " + std::to_string(num_pages) + " pages (valid: 0 to " +
               std::to_string(num_pages - 1) + ")");
      }
    }
  }
}

// writes_apart(table, page_size, num_pages, cached, offsets): request b writes the
// offsets[b+1] - offsets[b] tokens of its chunk at positions cached[b], cached[b] + 1, ...
// (row table[b, p / page_size] * page_size + p % page_size of the cache), then reads every
// position below its end. No row may be written twice, and no request may read a row
// another token of the call writes, at a cached position: in either case the result
// would depend on the order of the writes. Positions whose page pages() refuses are left
// to it (a manifest lists pages() first).
void writes_apart(const Values& table, int64_t page_size, int64_t num_pages, const Values& cached,
                  const Values& offsets) {
  if (table.ndim() != 2) broken("'" + table.name() + "' must be 2-D, got shape " + table.shape());
  expect_1d(cached);
  expect_1d(offsets);
  const int64_t batch = table.size(0), width = table.size(1);
  if (cached.size(0) != batch || offsets.size(0) != batch + 1) {
    broken("expected " + std::to_string(batch) + " entries in '" + cached.name() + "' and " +
           std::to_string(batch + 1) + " in '" + offsets.name() + "' ('" + table.name() + "' has " +
           std::to_string(batch) + " rows), got " + std::to_string(cached.size(0)) + " and " +
           std::to_string(offsets.size(0)));
  }
  if (page_size <= 0 || num_pages <= 0) return;
  auto row_of = [&](int64_t b, int64_t position) -> int64_t {  // -1: for pages() to report
    const int64_t column = position / page_size;
    if (position < 0 || column >= width) return -1;
    const int64_t page = table.at(b, column);
    return page < 0 || page >= num_pages ? -1 : page * page_size + position % page_size;
  };
  // Positions past the table's row are pages()'s to refuse: the loops stop there.
  const int64_t room = width * page_size;
  auto first = [&](int64_t b) { return std::clamp<int64_t>(cached.at(b), 0, room); };
  auto end = [&](int64_t b) {
    return first(b) + std::clamp<int64_t>(offsets.at(b + 1) - offsets.at(b), 0, room - first(b));
  };
  auto token = [&](int64_t b, int64_t position) {
    return "request " + std::to_string(b) + "'s position " + std::to_string(position) + " (" + table.name() + "[" +
           std::to_string(b) + ", " + std::to_string(position / page_size) +
           "] = " + std::to_string(table.at(b, position / page_size)) + ")";
  };
  auto writer_of = [&](int64_t row) -> std::string {  // the first token written to `row`
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t position = first(b); position < end(b); ++position) {
        if (row_of(b, position) == row) return token(b, position);
      }
    }
    return "?";
  };
  std::vector<uint64_t> written(static_cast<size_t>((num_pages * page_size + 63) / 64), 0);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t position = first(b); position < end(b); ++position) {
      const int64_t row = row_of(b, position);
      if (row < 0) continue;
      uint64_t& word = written[static_cast<size_t>(row / 64)];
      const uint64_t bit = uint64_t{1} << (row % 64);
      if (word & bit) {
        broken(token(b, position) + " writes cache row " + std::to_string(row) + ", which " + writer_of(row) +
               " writes too");
      }
      word |= bit;
    }
  }
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t position = 0; position < first(b); ++position) {
      const int64_t row = row_of(b, position);
      if (row >= 0 && ((written[static_cast<size_t>(row / 64)] >> (row % 64)) & 1)) {
        broken(token(b, position) + " reads cached row " + std::to_string(row) + ", which " + writer_of(row) +
               " overwrites in this call");
      }
    }
  }
}

std::optional<std::string> check_one(const ValueRule& rule, std::span<const SlotValues> slots,
                                     std::span<const std::string> names) {
  for (int slot : rule.tensors) {
    if (!slots[static_cast<size_t>(slot)].present) return std::nullopt;  // an absent optional input
  }
  try {
    std::vector<int64_t> scalars;
    for (const auto& program : rule.scalars) scalars.push_back(evaluate(program, slots, names));
    std::vector<Values> tensors;
    tensors.reserve(rule.tensors.size());
    for (int slot : rule.tensors) {
      const auto s = static_cast<size_t>(slot);
      tensors.emplace_back(slots[s], names[s]);
    }
    switch (rule.kind) {
      case ValueKind::kOffsets: offsets(tensors.at(0), scalars.at(0), true); break;
      case ValueKind::kOffsetsWithin: offsets(tensors.at(0), scalars.at(0), false); break;
      case ValueKind::kSpansAtMost: spans_at_most(tensors.at(0), scalars.at(0)); break;
      case ValueKind::kAtLeast: at_least(tensors.at(0), scalars.at(0)); break;
      case ValueKind::kWithin: within(tensors.at(0), scalars.at(0), scalars.at(1)); break;
      case ValueKind::kPages: {
        std::vector<Values> lengths(tensors.begin() + 1, tensors.end());
        pages(tensors.at(0), scalars.at(0), scalars.at(1), lengths);
        break;
      }
      case ValueKind::kWritesApart:
        writes_apart(tensors.at(0), scalars.at(0), scalars.at(1), tensors.at(1), tensors.at(2));
        break;
    }
  } catch (const Broken& b) {
    return "value rule `" + rule.text + "` does not hold: " + b.why;
  }
  return std::nullopt;
}

}  // namespace

std::string check_value_rules(std::span<const ValueRule> rules, std::span<const SlotValues> slots,
                              std::span<const std::string> names) {
  for (const ValueRule& rule : rules) {
    if (auto why = check_one(rule, slots, names)) return *why;
  }
  return {};
}

}  // namespace tileops::engine
