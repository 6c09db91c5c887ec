// The boundary between the per-ISA kernel builds and the marshalling. Each ISA translation
// unit (isa_*.cc) compiles every kernel family with its own flags and registers the
// family's entry points here under (name, storage dtype, variant); the marshalling
// (bind/<family>.cc) looks an entry up once, when it builds a kernel object, and keeps the
// function pointer for its calls. Nothing here names a family: a new kernel is registered
// by its family file and found by its family's marshalling.
#pragma once

#include <string_view>
#include <vector>

#include "dtypes.h"

namespace tnc {

// A kernel entry point: runs on its family's args (kernels/<family>_args.h) with up to
// `threads` threads.
template <class Args>
using KernelFn = void (*)(const Args& args, int threads);

class KernelTable {
 public:
  explicit KernelTable(const char* isa) : isa_(isa) {}

  // The instruction set the kernels were compiled for ("baseline", "avx2", "avx512").
  const char* isa() const { return isa_; }

  // A family's kernel `name` for storage dtype `dtype`; `variant` tells kernels of one name
  // apart (e.g. the Activation of "unary"). Adding a key twice is a bug (std::logic_error).
  template <class Args>
  void add(const char* name, DType dtype, KernelFn<Args> fn, int variant = 0) {
    put({name, dtype, variant, &kArgsTag<Args>, reinterpret_cast<Erased>(fn)}, false);
  }
  // Replaces a generic kernel with an ISA extension's (kernels/*_avx512_bf16.h).
  template <class Args>
  void replace(const char* name, DType dtype, KernelFn<Args> fn, int variant = 0) {
    put({name, dtype, variant, &kArgsTag<Args>, reinterpret_cast<Erased>(fn)}, true);
  }
  // The kernel under that key taking Args, or null.
  template <class Args>
  KernelFn<Args> find(std::string_view name, DType dtype, int variant = 0) const {
    return reinterpret_cast<KernelFn<Args>>(get(name, dtype, variant, &kArgsTag<Args>));
  }

  // Names the members of an enumeration whose values a family defines (the Activations of
  // kernels/elementwise.h): the n-th name added is value n. Bound to Python by the family's
  // marshalling, so a new member needs no edit outside the family's kernel file.
  void add_member(const char* enumeration, const char* name);
  std::vector<const char*> members(std::string_view enumeration) const;

 private:
  using Erased = void (*)();
  // One address per Args type, the same in every translation unit: it keeps a lookup from
  // handing out a kernel of another family's signature.
  template <class Args>
  static constexpr char kArgsTag = 0;

  struct Entry {
    const char* name;
    DType dtype;
    int variant;
    const char* args;
    Erased fn;
  };
  struct Member {
    const char* enumeration;
    const char* name;
  };

  void put(const Entry& entry, bool replace);
  Erased get(std::string_view name, DType dtype, int variant, const char* args) const;

  const char* isa_;
  std::vector<Entry> entries_;
  std::vector<Member> members_;
};

// Each ISA translation unit registers every family's kernels, compiled for its ISA.
void register_kernels_baseline(KernelTable& table);
void register_kernels_avx2(KernelTable& table);
void register_kernels_avx512(KernelTable& table);

}  // namespace tnc
