"""tileops-native-cpu: compiled C++ SIMD kernels for every tileops op on the CPU.

Target ``native_cpu`` claims every ``cpu`` device. Importing this module only registers
the detector and one builder per op; nothing is compiled or loaded until the op layer
calls a builder (the extension itself is loaded at the first build).
"""

from tileops.backend import register_detector, register_kernel_builder

from .builders import BUILDERS, TARGET, detect

#: The tileops backend protocol these builders are written for (tileops.backend.PROTOCOL_VERSION).
TILEOPS_PROTOCOL_VERSION = (1, 0)

register_detector(target=TARGET, detect=detect)
for _op, _build in BUILDERS.items():
    register_kernel_builder(op=_op, target=TARGET, build_kernel=_build)
del _op, _build


def kernel_tape():
    """A new tape of native_cpu kernel calls: ``with tape:`` records the calls made on this
    thread, ``tape.replay()`` runs them again on the same argument tensors and into the
    same outputs (csrc/bind/tape.h says when that is safe)."""
    from ._runtime import native  # noqa: PLC0415 - loads the extension

    return native().Tape()
