"""The backend protocol: how a package outside tileops supplies an op's kernels.

A backend is a pip package with one entry point and a module that registers at import::

    # pyproject.toml
    [project.entry-points."tileops.backends"]
    acme = "tileops_acme"

    # tileops_acme/__init__.py
    from tileops.backend import TensorSpec, register_detector, register_kernel_builder

    register_detector(target="acme", detect=lambda device: device.type == "acme")

    def build_rms_norm(x: TensorSpec, weight: TensorSpec, *, normalized_shape, eps):
        return AcmeRMSNorm(normalized_shape, eps, x.dtype)   # compile here, launch in __call__

    register_kernel_builder(op="RMSNormFwdOp", target="acme", build_kernel=build_rms_norm)

The contract in one screen:

* ``detect(device) -> bool`` answers whether a ``torch.device`` belongs to the target's
  kernels; it looks at the device only, returns ``False`` for foreign devices, never raises.
* ``build_kernel(*specs, **params)`` is called once per device and input signature with
  one ``TensorSpec`` (device, dtype, shape) per manifest input (``None`` for an optional
  input not passed) and every manifest param as a concrete value. It returns a callable
  ``kernel(*tensors)`` returning the outputs the manifest declares. Inputs reaching a
  kernel are validated, contiguous and on one device.
* Target choice per op instance: ``target=`` in the constructor, else the process default
  (``set_default_target``), else device detection (exactly one claimant; none means the
  in-tree kernels; two raise ``AmbiguousTargetError``). ``BUILTIN`` forces in-tree kernels.
* A chosen target without a builder for an op raises ``OpNotAvailableError``: there is no
  fall back, ever.
* Backends are discovered once, on the first op construction or registry read. A backend
  whose import fails is skipped with a ``RuntimeWarning`` and recorded in
  ``load_failures()``; whatever it registered before failing is rolled back.
* A kernel that reads a weight in a layout of its own (rows interleaved, nibbles
  reordered) registers it with ``register_weight_layout(op, target, input, prepare)``:
  ``prepare(tensor, **params)`` runs once where the weight is loaded
  (``op.prepare_weight(input, tensor)``), and the kernel receives the prepared tensor.
* ``PROTOCOL_VERSION`` is the (major, minor) protocol this tileops speaks. A backend
  module may declare the one it was written for, ``TILEOPS_PROTOCOL_VERSION = (1, 0)``
  at top level; another major is a load failure naming both. Declaring nothing is fine.
"""

from .discovery import PROTOCOL_VERSION
from .errors import AmbiguousTargetError, BackendError, OpNotAvailableError, UnknownTargetError
from .registry import (
    default_target,
    load_failures,
    register_detector,
    register_kernel_builder,
    register_weight_layout,
    registered_targets,
    set_default_target,
)
from .types import BUILTIN, BuildKernel, KernelResult, Target, TensorSpec

__all__ = [
    "BUILTIN",
    "AmbiguousTargetError",
    "BackendError",
    "BuildKernel",
    "KernelResult",
    "OpNotAvailableError",
    "PROTOCOL_VERSION",
    "Target",
    "TensorSpec",
    "UnknownTargetError",
    "default_target",
    "load_failures",
    "register_detector",
    "register_kernel_builder",
    "register_weight_layout",
    "registered_targets",
    "set_default_target",
]
