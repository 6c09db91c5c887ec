"""enable's last pass: the weights the served ops stream, moved to host memory on huge
pages (``tileops.serving.host_memory``). A decode step reads every weight once per token;
from 4 KiB pages a CPU's GEMV loses up to a third of the machine's read bandwidth to page
boundaries and TLB misses, from 2 MiB pages it does not.

Only CPU weights move, only where the machine offers transparent huge pages, and only
those of served modules: the Linear modules' weights (a stacked projection's weight is
made on huge pages by ``_fusion.StackedLinear`` itself) and the MoE experts' parameters.
A parameter keeps its identity and values; its ``.data`` is the moved copy. ``undo``
gives each its own ordinary storage back.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tileops.serving.host_memory import huge_pages_available, on_huge_pages

from .fusion import stacked_members

__all__ = ["place_weights", "undo_placement"]


def place_weights(model: nn.Module, patches: list[tuple[nn.Module, str, Any, Any]]) -> list[torch.Tensor]:
    """Moves the served weights; returns the parameters moved (for ``undo_placement``)."""
    if not huge_pages_available():
        return []
    stacked = stacked_members(model)
    params: list[nn.Parameter] = []
    for module, kind, _state, _forward in patches:
        if kind == "linear" and id(module) not in stacked:
            params.extend(getattr(module, a) for a in module._tileops.weight_attrs)
        elif kind == "moe experts":
            params.extend(p for p in module.parameters(recurse=False) if p.ndim >= 2)
    moved: list[nn.Parameter] = []
    seen: set[int] = set()
    with torch.no_grad():
        for p in params:
            if id(p) in seen or p.device.type != "cpu":  # a tied weight moves once
                continue
            seen.add(id(p))
            p.data = on_huge_pages(p.data)
            moved.append(p)
    return moved


def undo_placement(params: list[nn.Parameter]) -> None:
    with torch.no_grad():
        for p in params:
            p.data = p.data.clone()
