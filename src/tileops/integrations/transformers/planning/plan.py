"""The plan ``enable`` fills and applies: each served module with its kind, state and
forward, and the report of what was replaced and what stays on torch."""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import nn

from .positions import PositionCheck
from .report import EnableReport, UnsupportedModelError
from .state import ModuleState

__all__ = ["Patch", "Plan"]


class Patch(NamedTuple):
    module: nn.Module
    kind: str
    state: ModuleState
    forward: Any  # None: the module keeps its own


class Plan:
    """What ``enable`` will do to a model: each served module with its kind, state and
    forward (``patches``), and the report of what was replaced and what stays on torch."""

    def __init__(self, model: nn.Module, strict: bool, target: str | None) -> None:
        self.model, self.strict, self.target = model, strict, target
        self.report = EnableReport(type(model).__name__, target)
        self.patches: list[Patch] = []
        self.positions: PositionCheck | None = None  # the attention layers' position check
        from tileops import ops  # noqa: PLC0415 - the op catalog loads on first enable

        self.ops = ops

    def refuse(self, module: str, feature: str, why: str) -> None:
        if self.strict:
            raise UnsupportedModelError(
                f"tileops cannot serve {module}: {feature} ({why}); enable(model, strict=False) keeps it on torch"
            )
        self.report.on_torch.append((module, feature, why))

    def add(self, kind: str, module: nn.Module, forward: Any, state: ModuleState) -> None:
        """Serves ``module`` (a ``kind`` of the report) with ``forward`` over ``state``; a
        forward of None keeps the module's own (MoE experts dispatch through
        transformers' ExpertsInterface)."""
        self.patches.append(Patch(module, kind, state, forward))
        self.report.replaced.setdefault(kind, []).append(state.name)

    def served(self, kind: str) -> list[Patch]:
        return [p for p in self.patches if p.kind == kind]
