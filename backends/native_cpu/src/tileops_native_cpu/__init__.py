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
