"""Finding installed backends: the entry-point group ``tileops.backends``.

Runs once per process, on the first op construction or registry read, never at import
of tileops. Each backend's import is one registry transaction: a backend that raises
midway leaves nothing behind. Warnings are issued only after every backend was tried,
so ``-W error`` cannot leave later backends unloaded.
"""

from __future__ import annotations

import importlib.metadata
import sys
import threading
import warnings

from .. import _C

GROUP = "tileops.backends"

_discovered = False
_running_in = None  # the thread running discovery: its re-entrant reads return at once
_lock = threading.RLock()
_imported_modules: list[str] = []


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
        try:
            for ep in _entry_points():
                _registry.begin_transaction()
                try:
                    ep.load()
                except (KeyboardInterrupt, SystemExit):
                    _registry.rollback_transaction()
                    raise  # reaches the caller; discovery stays undone and can be retried
                except BaseException as error:  # noqa: BLE001 - one broken plugin must not break tileops
                    _registry.rollback_transaction()
                    failures.append(f"{ep.name} ({ep.value}): {type(error).__name__}: {error}")
                else:
                    _registry.commit_transaction()
                top = ep.value.split(":")[0].split(".")[0]
                _imported_modules.extend(
                    name for name in sys.modules if name == top or name.startswith(top + ".")
                )
            # Recorded once the pass completes: an interrupted pass is retried whole, and
            # its failures must not be listed twice.
            for line in failures:
                _registry.add_load_failure(line)
            _discovered = True
        finally:
            _running_in = None
    for line in failures:
        warnings.warn(
            f"tileops backend failed to load and was skipped: {line}. "
            "See tileops.backend.load_failures().",
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
        _discovered = False
