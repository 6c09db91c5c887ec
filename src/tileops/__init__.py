"""tileops: an operator library for PyTorch with a C++ engine and pluggable backends.

Importing tileops is cheap: it loads the engine and the protocol, imports no backend,
runs no discovery, compiles nothing and asks no GPU anything. Ops live in
``tileops.ops``; the backend protocol in ``tileops.backend``.
"""

from . import _C
from .backend import (
    BUILTIN,
    AmbiguousTargetError,
    BackendError,
    OpNotAvailableError,
    UnknownTargetError,
    default_target,
    load_failures,
    registered_targets,
    set_default_target,
)

__version__ = "0.1.0"

#: How many kernels one op instance keeps memoized before evicting the least recently
#: used; set process-wide with set_kernel_cache_capacity.
DEFAULT_KERNEL_CACHE_CAPACITY: int = _C.DEFAULT_KERNEL_CACHE_CAPACITY


def kernel_cache_capacity() -> int:
    """The per-instance bound on memoized kernels (default ``DEFAULT_KERNEL_CACHE_CAPACITY``)."""
    return _C.kernel_cache_capacity()


def set_kernel_cache_capacity(entries: int) -> None:
    """Bound every op instance's kernel memo to ``entries`` kernels (at least 1).

    Takes effect at each instance's next build; evicted kernels are released.
    """
    if isinstance(entries, bool) or not isinstance(entries, int):
        raise TypeError(f"kernel cache capacity must be an int, got {entries!r}")
    _C.set_kernel_cache_capacity(entries)


__all__ = [
    "BUILTIN",
    "AmbiguousTargetError",
    "BackendError",
    "OpNotAvailableError",
    "UnknownTargetError",
    "default_target",
    "kernel_cache_capacity",
    "load_failures",
    "registered_targets",
    "set_default_target",
    "set_kernel_cache_capacity",
]
