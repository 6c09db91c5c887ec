"""Mixture of experts: FusedTopKOp (the router) and FusedMoeFwdOp (routing, the experts
and their weighted sum in one call).

Notation (moe.yaml): T tokens, E experts, K = top_k, H hidden size, F one expert's FFN
size; w_gate_up [E, 2F, H] (gate rows, then up rows), w_down [E, H, F], every product NT
as F.linear.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def route_tokens(
    gating_output: torch.Tensor,
    correction_bias: torch.Tensor | None,
    *,
    top_k: int,
    scoring_func: str,
    renormalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: (weights float32 [T, K], expert ids int64 [T, K]), largest first.

    Scores are softmax over the E logits (float32) or their sigmoid. The K experts with the
    largest selection value are taken, a tie going to the lower expert id; the selection
    value is the score plus correction_bias, and the weights are the unbiased scores,
    divided by their sum over the K with ``renormalize``.
    """
    logits = gating_output.float()
    scores = logits.softmax(dim=-1) if scoring_func == "softmax" else logits.sigmoid()
    # Scores rise with the logits, so without a bias the logits select the same experts,
    # without the ties that rounding the scores could add.
    select = logits if correction_bias is None else scores + correction_bias.float()
    # a stable sort keeps equal values in expert order: a tie goes to the lower id
    ids = torch.sort(select, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


class CpuFusedTopK:
    """gating_output [T, E] (+ correction_bias [E]) -> (topk_weights float32 [T, K],
    topk_ids int32 [T, K])."""

    def __init__(self, top_k: int, scoring_func: str, renormalize: bool, dtype: torch.dtype):
        self.top_k = int(top_k)
        self.scoring_func = scoring_func
        self.renormalize = bool(renormalize)
        self.dtype = dtype

    @torch.no_grad()
    def __call__(
        self, gating_output: torch.Tensor, correction_bias: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        weights, ids = route_tokens(
            gating_output,
            correction_bias,
            top_k=self.top_k,
            scoring_func=self.scoring_func,
            renormalize=self.renormalize,
        )
        return weights, ids.to(torch.int32)

    def __repr__(self) -> str:
        return (
            f"CpuFusedTopK(top_k={self.top_k}, scoring_func={self.scoring_func!r}, "
            f"renormalize={self.renormalize}, dtype={self.dtype})"
        )


class CpuFusedMoe:
    """hidden_states [T, H], gating_output float32 [T, E] -> [T, H]: each token routed as
    ``route_tokens`` says, through its K experts down(act(x gate^T) * (x up^T)), their
    outputs summed by the routing weights, times routed_scaling_factor; in float32,
    rounded once."""

    ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "silu_and_mul": F.silu,
        "gelu_and_mul": F.gelu,  # exact (erf)
    }

    def __init__(
        self,
        *,
        top_k: int,
        ffn_size: int,
        scoring_func: str,
        renormalize: bool,
        routed_scaling_factor: float,
        activation: str,
        dtype: torch.dtype,
    ) -> None:
        if activation not in self.ACTIVATIONS:
            raise ValueError(f"CpuFusedMoe activation must be one of {sorted(self.ACTIVATIONS)}, got {activation!r}")
        self.top_k = int(top_k)
        self.ffn_size = int(ffn_size)
        self.scoring_func = scoring_func
        self.renormalize = bool(renormalize)
        self.routed_scaling_factor = float(routed_scaling_factor)
        self.activation = activation
        self.dtype = dtype
        self._act = self.ACTIVATIONS[activation]

    @torch.no_grad()
    def __call__(
        self,
        hidden_states: torch.Tensor,
        gating_output: torch.Tensor,
        w_gate_up: torch.Tensor,
        w_down: torch.Tensor,
        correction_bias: torch.Tensor | None,
    ) -> torch.Tensor:
        weights, ids = route_tokens(
            gating_output,
            correction_bias,
            top_k=self.top_k,
            scoring_func=self.scoring_func,
            renormalize=self.renormalize,
        )
        x = hidden_states.float()
        out = torch.zeros_like(x)
        # Only the experts some token chose run, each on the tokens that chose it.
        for expert in ids.unique().tolist():
            token, slot = (ids == expert).nonzero(as_tuple=True)
            gate_up = x[token] @ w_gate_up[expert].float().T  # [n, 2F]
            gate, up = gate_up[:, : self.ffn_size], gate_up[:, self.ffn_size :]
            y = (self._act(gate) * up) @ w_down[expert].float().T  # [n, H]
            out.index_add_(0, token, y * weights[token, slot, None])
        return (out * self.routed_scaling_factor).to(self.dtype)

    def __repr__(self) -> str:
        return (
            f"CpuFusedMoe(top_k={self.top_k}, ffn_size={self.ffn_size}, "
            f"scoring_func={self.scoring_func!r}, renormalize={self.renormalize}, "
            f"routed_scaling_factor={self.routed_scaling_factor}, "
            f"activation={self.activation!r}, dtype={self.dtype})"
        )
