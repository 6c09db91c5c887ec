"""What ``enable`` tells its caller: the report of what runs where, and the error that
refuses what cannot be served exactly."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["EnableReport", "UnsupportedModelError"]


class UnsupportedModelError(ValueError):
    """A model, module or config value tileops cannot serve exactly."""


@dataclass
class EnableReport:
    """What ``enable`` replaced (module names per kind) and what stays on torch
    (``(module, feature, why)``)."""

    model: str
    target: str | None
    replaced: dict[str, list[str]] = field(default_factory=dict)
    on_torch: list[tuple[str, str, str]] = field(default_factory=list)
    huge_page_bytes: int = 0  # served weights moved to huge pages (fused/placement.py)

    def count(self, kind: str) -> int:
        return len(self.replaced.get(kind, ()))

    def __str__(self) -> str:
        lines = [f"tileops on {self.model} (target={self.target or 'default'}):"]
        lines += [f"  {kind}: {len(names)} modules" for kind, names in self.replaced.items()]
        lines += [f"  on torch: {m}: {feat} ({why})" for m, feat, why in self.on_torch]
        if self.huge_page_bytes:
            lines.append(f"  weights on huge pages: {self.huge_page_bytes / 2**20:.1f} MiB")
        return "\n".join(lines)
