// Value rules: checks on the contents of an op's index inputs (offsets, lengths, page
// tables), run on every call before the kernel. A manifest declares them
// (`signature.value_rules`, docs/manifest-format.md); the op layer compiles each into a
// ValueRule once per op instance, and the dispatcher checks them on each call, because
// unlike shapes, values change without changing the memo key.
//
// Plain C++: no Python, no torch. The caller hands each slot's data as a SlotValues.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tileops::engine {

enum class ValueKind : int {
  kOffsets = 0,        // offsets(t, total): t[0] == 0, non-decreasing, t[-1] == total
  kOffsetsWithin = 1,  // offsets_within(t, total): the same, with t[-1] <= total
  kSpansAtMost = 2,    // spans_at_most(t, limit): t[i+1] - t[i] <= limit
  kAtLeast = 3,        // at_least(t, low): every entry >= low
  kPages = 4,          // pages(table, page_size, num_pages, len, [len2]): see value_rules.cc
  kWithin = 5,         // within(t, low, high): every entry in [low, high)
  kWritesApart = 6,    // writes_apart(table, page_size, num_pages, cached, offsets): see value_rules.cc
};

// A scalar argument, in postfix: the words are opcode, operands.
enum class Op : int64_t { kConst = 0, kDim = 1, kAdd = 2, kSub = 3, kMul = 4, kFloorDiv = 5, kNeg = 6 };

struct ValueRule {
  ValueKind kind;
  std::string text;                          // as written in the manifest, for messages
  std::vector<int> tensors;                  // input slots whose values are read
  std::vector<std::vector<int64_t>> scalars;  // one postfix program each
};

// One input slot as the checks see it. `data` is host memory of int32 or int64 elements;
// strides are in elements. A slot with present == false is an absent optional input.
struct SlotValues {
  bool present = false;
  const void* data = nullptr;
  int bits = 0;  // 32 or 64 for an integer tensor; anything else is refused
  bool is_int = false;
  std::span<const int64_t> shape;
  std::span<const int64_t> strides;  // empty: contiguous
};

// The first rule that does not hold, as "value rule `<text>` does not hold: <why>"; an
// empty string when every rule holds. Rules naming an absent slot are skipped.
// `names` are the input names, by slot.
std::string check_value_rules(std::span<const ValueRule> rules, std::span<const SlotValues> slots,
                              std::span<const std::string> names);

}  // namespace tileops::engine
