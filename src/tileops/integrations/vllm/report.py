"""Which target serves this process, what runs on it, what stayed on vLLM's kernels, and
the one log line that says so (written once the engine has built its model: when vLLM
makes the first attention metadata builder, after every layer exists)."""

from __future__ import annotations

import threading
from collections import Counter

import torch

from ...backend import dispatch, registered_targets, set_default_target

__all__ = ["choose_target", "served", "served_custom_op", "kept", "target_name", "log_once", "summary"]

_lock = threading.Lock()
_served: Counter[str] = Counter()  # vLLM layer -> instances on tileops
_kept: dict[str, Counter[str]] = {}  # vLLM layer -> {why: instances}
_served_custom_ops: set[str] = set()  # vLLM CustomOp registry names tileops replaces
_logged = False


def choose_target(name: str | None) -> None:
    """``TILEOPS_TARGET``: the process default for every op the plugin makes."""
    if name is None:
        return
    known = registered_targets()
    if name not in known:
        raise ValueError(f"TILEOPS_TARGET={name!r} is not a registered tileops target (registered: {known})")
    set_default_target(name)


def target_name() -> str:
    """The target that serves CPU tensors here (raises the protocol's own error where
    detection finds none or several)."""
    target = dispatch.settle(dispatch.request(None), torch.device("cpu"))
    return target if isinstance(target, str) else "tileops' in-tree kernels"


def served(layer: str) -> None:
    """One more instance of vLLM's ``layer`` on tileops (``layer`` is also the name its
    class is registered under, as vLLM's custom-op tables then list it)."""
    with _lock:
        _served[layer] += 1
        _served_custom_ops.add(layer)


def served_custom_op(name: str) -> None:
    """A vLLM custom op a served layer makes but never calls (not listed as kept)."""
    with _lock:
        _served_custom_ops.add(name)


def kept(layer: str, why: str) -> None:
    with _lock:
        _kept.setdefault(layer, Counter())[why] += 1


def summary(instantiated_custom_ops: set[str] = frozenset()) -> str:
    """The log line: target, served layers with their counts, and what vLLM kept."""
    with _lock:
        on = ", ".join(f"{name} x{n}" for name, n in sorted(_served.items())) or "nothing"
        off = [f"{name} x{sum(c.values())} ({'; '.join(sorted(c))})" for name, c in sorted(_kept.items())]
        others = sorted(instantiated_custom_ops - _served_custom_ops)
    if others:
        off.append("vLLM custom ops " + ", ".join(others) + " (no tileops counterpart)")
    off.append("embedding lookup, logits processing and sampling (not tileops ops)")
    threads = torch.get_num_threads()  # what native_cpu sizes its kernels to
    return f"tileops: target {target_name()} ({threads} threads) serves {on}; on vLLM's own kernels: {'; '.join(off)}"


def log_once(logger, instantiated_custom_ops: set[str]) -> None:
    global _logged
    with _lock:
        if _logged:
            return
        _logged = True
    logger.info(summary(instantiated_custom_ops))
