"""When two greedy decodes must agree: while the reference is sure.

A kernel that differs from the reference by rounding may flip the argmax where the
reference's top two logits are within the tolerance of each other; after such a step the
two sequences may go apart for good. So tokens are compared, per row, only up to the first
step whose reference top-2 margin is at most ``tol`` (that step included: a margin above
``tol`` at every earlier step says nothing about this one, so it is not compared).
"""

from __future__ import annotations

import torch

__all__ = ["confident_steps", "check_greedy_agreement"]


def confident_steps(ref_logits: torch.Tensor, tol: float) -> list[int]:
    """For ``ref_logits [steps, batch, vocab]``: per row, how many leading steps have a
    top-2 margin above ``tol`` (the steps whose tokens must agree)."""
    if ref_logits.ndim != 3 or ref_logits.shape[-1] < 2:
        raise ValueError(f"ref_logits must be [steps, batch, vocab >= 2], got {tuple(ref_logits.shape)}")
    top2 = ref_logits.float().topk(2, dim=-1).values
    sure = (top2[..., 0] - top2[..., 1]) > tol  # [steps, batch]
    # leading run of True per row: cumprod stays 1 until the first False
    return sure.int().cumprod(dim=0).sum(dim=0).tolist()


def check_greedy_agreement(
    ref_logits: torch.Tensor, ref_tokens: torch.Tensor, tokens: torch.Tensor, tol: float
) -> list[int]:
    """Raises AssertionError at the first confident step where ``tokens [batch, steps]``
    differ from ``ref_tokens``; returns the confident step count per row."""
    if ref_tokens.shape != tokens.shape or ref_tokens.shape != ref_logits.shape[1::-1]:
        raise ValueError(
            f"tokens {tuple(tokens.shape)} and ref_tokens {tuple(ref_tokens.shape)} must both be [batch, steps] "
            f"for ref_logits [steps, batch, vocab] {tuple(ref_logits.shape)}"
        )
    counts = confident_steps(ref_logits, tol)
    for row, n in enumerate(counts):
        bad = (tokens[row, :n] != ref_tokens[row, :n]).nonzero()
        if len(bad):
            step = int(bad[0])
            raise AssertionError(
                f"row {row}: token {int(tokens[row, step])} != reference {int(ref_tokens[row, step])} at step {step}, "
                f"where the reference's top-2 margin exceeds tol={tol} (confident for {n} steps)"
            )
    return counts
