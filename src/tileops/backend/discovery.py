"""Finding installed backends: the entry-point group ``tileops.backends``.

Runs once per process, on the first op construction or registry read, never at import
of tileops. Each backend's import is one registry transaction: a backend that raises
midway leaves nothing behind. Warnings are issued only after every backend was tried,
so ``-W error`` cannot leave later backends unloaded.

The protocol version handshake: a backend module may declare the protocol version it
was written for as a top-level ``TILEOPS_PROTOCOL_VERSION = (major, minor)``. A major
other than ``PROTOCOL_VERSION[0]`` makes the import a load failure (its registrations
are rolled back) naming both versions and the fix; a module that declares nothing is
accepted as it is (backends written before the handshake keep working).
"""

from __future__ import annotations

import importlib.metadata
import sys
import threading
import warnings
from dataclasses import dataclass

from .. import _C
from .errors import BackendError

GROUP = "tileops.backends"

#: The backend protocol this tileops speaks, (major, minor). A new major breaks
#: backends written for an older one; a new minor only adds.
PROTOCOL_VERSION = (1, 0)

#: The module attribute a backend declares its protocol version with.
DECLARATION = "TILEOPS_PROTOCOL_VERSION"


@dataclass(frozen=True)
class BackendInfo:
    """What discovery learnt about one entry point (for ``tileops doctor``)."""

    name: str  # entry point name
    value: str  # entry point value (the module)
    distribution: str | None
    version: str | None
    module: str
    declared_protocol: tuple[int, int] | None  # None: the module declares nothing
    targets: tuple[str, ...] = ()  # targets this import added to the registry
    failure: str | None = None  # the load_failures() line, when it failed


_discovered = False
_running_in = None  # the thread running discovery: its re-entrant reads return at once
_lock = threading.RLock()
_imported_modules: list[str] = []
_backends: list[BackendInfo] = []


def backends() -> list[BackendInfo]:
    """One entry per discovered entry point, in load order (runs discovery first)."""
    ensure_discovered()
    return list(_backends)


def _declared_version(ep: importlib.metadata.EntryPoint) -> tuple[int, int] | None:
    """The module's ``TILEOPS_PROTOCOL_VERSION``, checked; ``None`` when it declares none.
    Raises ``BackendError`` for a malformed declaration or another major version."""
    module = sys.modules.get(ep.module)
    declared = getattr(module, DECLARATION, None)
    if declared is None:
        return None
    if (
        not isinstance(declared, tuple)
        or len(declared) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in declared)
    ):
        raise BackendError(
            f"{ep.module}.{DECLARATION} must be a (major, minor) pair of non-negative ints "
            f"such as {PROTOCOL_VERSION!r}, got {declared!r}"
        )
    major, minor = declared
    if major != PROTOCOL_VERSION[0]:
        ours = f"{PROTOCOL_VERSION[0]}.{PROTOCOL_VERSION[1]}"
        raise BackendError(
            f"{ep.module} was written for tileops backend protocol {major}.{minor}, but this "
            f"tileops speaks protocol {ours}; install a release of {ep.module} written for "
            f"protocol {PROTOCOL_VERSION[0]}.x, or a tileops whose protocol is {major}.x "
            f"(tileops.backend.PROTOCOL_VERSION)"
        )
    return (major, minor)


def _distribution(ep: importlib.metadata.EntryPoint) -> tuple[str | None, str | None]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None, None
    try:
        return dist.metadata["Name"], dist.version
    except Exception:  # noqa: BLE001 - broken metadata must not break discovery
        return None, None


def ensure_discovered() -> None:
    # The fast path, after the first time: one flag read.
    if _discovered:
        return
    _discover()


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    found = importlib.metadata.entry_points(group=GROUP)
    unique = {(ep.name, ep.value): ep for ep in found}  # one dist seen twice on sys.path
    return [unique[key] for key in sorted(unique)]


def _discover() -> None:
    global _discovered, _running_in
    _registry = _C.process_registry

    with _lock:
        # A backend reading the registry while it is being imported (same thread) gets
        # what is registered so far instead of a deadlock or a recursion.
        if _discovered or _running_in is threading.current_thread():
            return
        _running_in = threading.current_thread()
        failures: list[str] = []
        found: list[BackendInfo] = []
        try:
            for ep in _entry_points():
                before = set(_registry.targets())
                declared, failure = None, None
                _registry.begin_transaction()
                try:
                    ep.load()
                    declared = _declared_version(ep)
                except (KeyboardInterrupt, SystemExit):
                    _registry.rollback_transaction()
                    raise  # reaches the caller; discovery stays undone and can be retried
                except BaseException as error:  # noqa: BLE001 - one broken plugin must not break tileops
                    _registry.rollback_transaction()
                    failure = f"{ep.name} ({ep.value}): {type(error).__name__}: {error}"
                    failures.append(failure)
                else:
                    _registry.commit_transaction()
                added = tuple(sorted(set(_registry.targets()) - before))
                dist, version = _distribution(ep)
                found.append(BackendInfo(ep.name, ep.value, dist, version, ep.module, declared, added, failure))
                top = ep.value.split(":")[0].split(".")[0]
                _imported_modules.extend(name for name in sys.modules if name == top or name.startswith(top + "."))
            # Recorded once the pass completes: an interrupted pass is retried whole, and
            # its failures must not be listed twice.
            for line in failures:
                _registry.add_load_failure(line)
            _backends[:] = found
            _discovered = True
        finally:
            _running_in = None
    for line in failures:
        warnings.warn(
            f"tileops backend failed to load and was skipped: {line}. See tileops.backend.load_failures().",
            RuntimeWarning,
            stacklevel=3,
        )


def _reset_for_tests() -> None:
    """Forget every registration and allow discovery to run again (tests only)."""
    global _discovered
    _registry = _C.process_registry

    with _lock:
        _registry.clear()
        for name in _imported_modules:
            sys.modules.pop(name, None)
        _imported_modules.clear()
        _backends.clear()
        _discovered = False
