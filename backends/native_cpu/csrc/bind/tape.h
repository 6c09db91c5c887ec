// A tape: the native kernel calls a stretch of Python makes, recorded once and replayed
// from C++ with the same arguments. A decode step is ~80 kernel calls around one token;
// through the op layer and the model's Python each costs microseconds more than it
// computes, and replaying them from one call leaves only the kernels.
//
// Replay runs each recorded call again: the kernel reads its recorded argument tensors
// (whatever they hold now: the caller updates inputs in place), checks them as any call
// does, and writes into the outputs it made while recording, which the tape keeps alive.
// Only kernel calls are recorded: the caller must make sure nothing else computed in the
// recorded stretch (tileops.integrations.transformers refuses a recording in which any
// torch operator but a view ran).
#pragma once

#include <nanobind/nanobind.h>

#include "bind/kernel.h"

namespace tnc {

// The call slot of every kernel object (module.cc): runs `k` on the tuple `args` and, when
// this thread records a tape, records the call.
PyObject* call_kernel(PyObject* self, Kernel* k, PyObject* args);

void bind_tape(nb::module_& m);

}  // namespace tnc
