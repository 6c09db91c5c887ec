"""Handing ``FusedMoeFwdOp`` a routing chosen elsewhere (transformers' router, vLLM's).

``FusedMoeFwdOp`` routes from logits itself; an engine that has already picked each token's
experts and weights gives them to it as logits that select exactly those experts and weigh
them by those weights: ``sigmoid`` scoring with ``logit(w)`` at each chosen expert and
``-inf`` elsewhere, no renormalisation. The weights reach the op to within float32 rounding
of the sigmoid (a few 1e-6 relative, against 4e-3 for a bfloat16 weight).
"""

from __future__ import annotations

import torch

__all__ = ["routing_as_logits"]

_F32_MIN = torch.finfo(torch.float32).min


def routing_as_logits(
    top_k_index: torch.Tensor, top_k_weights: torch.Tensor, num_experts: int, *, check: bool = True
) -> torch.Tensor:
    """float32 [T, E] logits whose sigmoid top-k (no renormalisation) selects exactly the
    experts of ``top_k_index`` with the weights ``top_k_weights`` (each in [0, 1]).

    ``check=False`` skips the range check (a host sync): for a caller whose router can only
    give weights in [0, 1] and that runs under torch.compile, where the check would break
    the graph."""
    w = top_k_weights.double()
    if check and bool(((w < 0) | (w > 1) | w.isnan()).any()):
        raise ValueError("tileops experts take routing weights in [0, 1] (a softmax router's), got others")
    logit = (torch.log(w) - torch.log1p(-w)).float()  # sigmoid(logit) = w; w = 1 gives +inf, sigmoid 1
    logit = logit.masked_fill(w == 0, _F32_MIN)  # chosen with weight 0: still above the -inf of the others
    gating = torch.full(
        (top_k_index.shape[0], num_experts), float("-inf"), dtype=torch.float32, device=top_k_index.device
    )
    return gating.scatter_(1, top_k_index.long(), logit)
