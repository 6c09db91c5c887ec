"""What every builder shares: the extension (loaded at the first build, with its torch
bridge), the LRU of specialisations, and the checks every manifest makes of its inputs.
Nothing here imports tileops or the extension at import time."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

TARGET = "native_cpu"

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
HALVES = (torch.float16, torch.bfloat16)
INTEGRAL = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
ALL_DTYPES = FLOATS + INTEGRAL
MAX_DIMS = 16  # what the kernels' tensor views hold (kMaxDims in csrc/dtypes.h)

_native_module: Any = None
_native_dtypes: dict[torch.dtype, Any] = {}
native_lock = threading.Lock()  # the extension's loading, and RoPE tables


def native() -> Any:
    """The compiled extension, with its torch bridge set up (first build only)."""
    global _native_module
    if _native_module is None:
        with native_lock:
            if _native_module is None:
                from . import _C

                # _C.DType's members are named as torch names its dtypes
                _native_dtypes.update({getattr(torch, member.name): member for member in _C.DType})
                capsule = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
                _C.init_bridge(capsule, torch.empty, {m: t for t, m in _native_dtypes.items()})
                if os.environ.get("TILEOPS_NATIVE_CPU_FALLBACK") == "1":
                    _C.force_fallback(True)
                _native_module = _C
    return _native_module


def native_dtype(dtype: torch.dtype) -> Any:
    """The ``_C.DType`` member of a torch dtype."""
    native()
    return _native_dtypes[dtype]


class _Specialisations:
    """Bounded LRU of kernels keyed by compile-time values only."""

    def __init__(self, capacity: int = 512) -> None:
        self._items: OrderedDict[tuple, Any] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()
        self.builds = 0

    def get(self, key: tuple, make: Callable[[], Any]) -> Any:
        with self._lock:
            kernel = self._items.get(key)
            if kernel is not None:
                self._items.move_to_end(key)
                return kernel
            kernel = make()
            self.builds += 1
            self._items[key] = kernel
            if len(self._items) > self._capacity:
                self._items.popitem(last=False)
            return kernel

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


specialisations = _Specialisations()


# ---------------------------------------------------------------------------------------
# checks shared by every builder: each message names the unmet item and the value received


def fail(op: str, what: str, got: str) -> ValueError:
    return ValueError(f"{TARGET} {op}: {what}; got {got}")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def shape_of(spec: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in spec.shape)


def check_inputs(op: str, dtypes: Sequence[torch.dtype], **specs: Any) -> torch.dtype:
    """Checks the inputs as every manifest does: on the CPU, at most MAX_DIMS dims (what the
    kernels hold), the first one's dtype among ``dtypes``, the others (``same_as`` it) of
    that dtype. Absent optional inputs are None. Returns the dtype."""
    for name, spec in specs.items():
        if spec is None:
            continue
        if torch.device(spec.device).type != "cpu":
            raise fail(op, "runs on CPU tensors only", f"{name} on {spec.device}")
        if len(spec.shape) > MAX_DIMS:
            raise fail(op, f"at most {MAX_DIMS} dims are supported", f"{name} of shape {shape_of(spec)}")
    (first_name, first), *others = specs.items()
    if first.dtype not in dtypes:
        names = ", ".join(dtype_name(d) for d in dtypes)
        raise TypeError(
            f"{TARGET} {op}: {first_name} must be one of the dtypes its manifest lists ({names}); "
            f"got {first_name} of {dtype_name(first.dtype)}"
        )
    for name, spec in others:
        if spec is not None and spec.dtype != first.dtype:
            raise TypeError(
                f"{TARGET} {op}: every input must have {first_name}'s dtype {dtype_name(first.dtype)}; "
                f"got {name} of {dtype_name(spec.dtype)}"
            )
    return first.dtype


def torch_threads() -> int:
    return max(1, torch.get_num_threads())


def specialisation(op: str, key: tuple, describe: str, make: Callable[[Any, int, str], Any]) -> Any:
    """The specialisation of ``op`` for ``key``; ``make(_C, threads, description)`` builds it."""
    threads = torch_threads()
    description = f"{TARGET} {op}({describe})"
    return specialisations.get((op,) + key + (threads,), lambda: make(native(), threads, description))


def check_broadcast(op: str, what: str, *specs: Any) -> None:
    shapes = [shape_of(s) for s in specs if s is not None]
    try:
        torch.broadcast_shapes(*shapes)
    except RuntimeError:
        raise fail(op, f"{what} must broadcast", " and ".join(map(str, shapes))) from None
