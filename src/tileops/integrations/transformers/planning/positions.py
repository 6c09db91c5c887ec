"""The check of a forward's positions against max_position_embeddings, once per forward."""

from __future__ import annotations

import torch

__all__ = ["PositionCheck"]


class PositionCheck:
    """Refuses positions past max_position_embeddings (the RoPE ops' tables end there),
    once per forward: every layer of a forward gets the same position tensor, and the
    base model's forward (``fused.model.base_model_forward``) calls ``new_forward`` before its layers
    run. Identity, not the tensor's version counter, says "already checked": inference
    tensors have no version counter. (The RoPE ops check their positions too; this check
    names the config value.)"""

    def __init__(self, max_position: int) -> None:
        self.max_position = max_position
        self.seen: torch.Tensor | None = None  # a strong reference: its id stays its own

    def new_forward(self) -> None:
        self.seen = None

    def check(self, position_ids: torch.Tensor, flat: torch.Tensor, module: str, note: str = "") -> None:
        if self.seen is position_ids:
            return
        if flat.numel() and int(flat.max()) >= self.max_position:
            raise ValueError(
                f"{module}: position {int(flat.max())} is past max_position_embeddings={self.max_position}" + note
            )
        self.seen = position_ids
