// The memo key of one call: the device of its tensors, then (dtype, shape) per input
// slot in manifest order, or "absent" for an optional input not passed. Encoded as a
// flat run of int64 so that the hot path builds it on the stack and hashes it in one pass.
//
//   [device_type, device_index, role?, slot...]   slot = kAbsent | (dtype, ndim, dims...)
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

namespace tileops::engine {

inline constexpr int64_t kAbsentSlot = -1;

// A small inline buffer: keys of up to 64 words never touch the heap.
class KeyBuffer {
 public:
  void clear() {
    size_ = 0;
    if (!heap_.empty()) heap_.clear();
  }
  void push(int64_t word) {
    if (size_ < inline_.size()) {
      inline_[size_++] = word;
      return;
    }
    if (heap_.empty()) heap_.assign(inline_.begin(), inline_.end());
    heap_.push_back(word);
    ++size_;
  }
  void set_device(int64_t type, int64_t index) {
    clear();
    push(type);
    push(index);
  }
  // The device is known only once the first present tensor is read.
  void rewrite_device(int64_t type, int64_t index) {
    int64_t* words = heap_.empty() ? inline_.data() : heap_.data();
    words[0] = type;
    words[1] = index;
  }
  void add_absent() { push(kAbsentSlot); }
  void add_tensor(int64_t dtype, std::span<const int64_t> shape) {
    push(dtype);
    push(static_cast<int64_t>(shape.size()));
    for (int64_t dim : shape) push(dim);
  }
  std::span<const int64_t> view() const {
    return heap_.empty() ? std::span<const int64_t>(inline_.data(), size_)
                         : std::span<const int64_t>(heap_.data(), size_);
  }

 private:
  std::array<int64_t, 64> inline_;  // left uninitialised: only [0, size_) is read
  std::vector<int64_t> heap_;
  size_t size_ = 0;
};

// One decoded slot, for introspection (built_kernels) and tests.
struct SlotSignature {
  int64_t dtype;
  std::vector<int64_t> shape;
  bool operator==(const SlotSignature&) const = default;
};

struct DecodedKey {
  int64_t device_type;
  int64_t device_index;
  std::vector<std::optional<SlotSignature>> slots;
};

// Inverse of KeyBuffer for a key made of `set_device` and `add_*` calls. Returns nullopt
// for a malformed key.
inline std::optional<DecodedKey> decode_key(std::span<const int64_t> key) {
  if (key.size() < 2) return std::nullopt;
  DecodedKey out{key[0], key[1], {}};
  size_t at = 2;
  while (at < key.size()) {
    if (key[at] == kAbsentSlot) {
      out.slots.emplace_back(std::nullopt);
      ++at;
      continue;
    }
    if (at + 1 >= key.size()) return std::nullopt;
    const int64_t dtype = key[at];
    const int64_t ndim = key[at + 1];
    if (ndim < 0 || at + 2 + static_cast<size_t>(ndim) > key.size()) return std::nullopt;
    SlotSignature slot{dtype,
                       {key.begin() + static_cast<std::ptrdiff_t>(at + 2),
                        key.begin() + static_cast<std::ptrdiff_t>(at + 2 + static_cast<size_t>(ndim))}};
    out.slots.emplace_back(std::move(slot));
    at += 2 + static_cast<size_t>(ndim);
  }
  return out;
}

struct KeyHash {
  using is_transparent = void;
  size_t operator()(std::span<const int64_t> key) const noexcept {
    // 64-bit FNV-1a over words, then a final avalanche: keys are short.
    uint64_t h = 1469598103934665603ull;
    for (int64_t word : key) {
      h ^= static_cast<uint64_t>(word);
      h *= 1099511628211ull;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return static_cast<size_t>(h);
  }
  size_t operator()(const std::vector<int64_t>& key) const noexcept { return (*this)(std::span<const int64_t>(key)); }
};

struct KeyEqual {
  using is_transparent = void;
  static bool same(std::span<const int64_t> a, std::span<const int64_t> b) noexcept {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(int64_t)) == 0);
  }
  bool operator()(std::span<const int64_t> a, std::span<const int64_t> b) const noexcept { return same(a, b); }
  bool operator()(const std::vector<int64_t>& a, std::span<const int64_t> b) const noexcept { return same(a, b); }
  bool operator()(std::span<const int64_t> a, const std::vector<int64_t>& b) const noexcept { return same(a, b); }
  bool operator()(const std::vector<int64_t>& a, const std::vector<int64_t>& b) const noexcept { return same(a, b); }
};

}  // namespace tileops::engine
