"""Mixture-of-experts blocks on tileops ops: the router on ``FusedTopKOp``, the experts on
``FusedMoeFwdOp``, registered with transformers' ``ExpertsInterface`` as ``"tileops"``.

transformers 5 splits a sparse block (``Qwen3MoeSparseMoeBlock``) into a router module
that returns ``(logits, weights, ids)`` and an experts module (``@use_experts_implementation``)
whose forward is looked up in ``ExpertsInterface`` by ``config._experts_implementation``
and called with the routing: ``(hidden_states [T, H], top_k_index [T, K], top_k_weights [T, K])``.

- Router (per-instance forward, Qwen3-MoE's ``Qwen3MoeTopKRouter``): logits through
  ``GemmFwdOp`` in the activations' dtype, as ``F.linear``; softmax in float32, top-k and,
  with ``norm_topk_prob``, renormalisation over the k through ``FusedTopKOp``; the weights
  cast to the logits' dtype, as transformers does. ``FusedTopKOp`` breaks a tie at the k-th
  place towards the lower expert id, where ``torch.topk`` (transformers' choice) is
  unspecified: a token whose k-th logit ties with an expert left out is re-ranked by
  ``torch.topk`` on transformers' own formula, so the selection is transformers' exactly.
- Experts (``"tileops"`` in ``ExpertsInterface``): ``FusedMoeFwdOp`` takes router logits and
  routes itself, so the routing it is handed reaches it as logits that select exactly the
  chosen experts with the given weights (``tileops.integrations.routing``).
"""

from __future__ import annotations

import torch
from torch import nn

try:  # transformers 5's experts registry; without it no MoE block is served
    from transformers.integrations.moe import ExpertsInterface
except ImportError:  # pragma: no cover - depends on the installed transformers
    ExpertsInterface = None
try:
    from transformers.integrations.moe import _default_apply_gate
except ImportError:  # pragma: no cover
    _default_apply_gate = None

from ..routing import routing_as_logits

NAME = "tileops"


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


# ---- the router --------------------------------------------------------------------------


def router_forward(self: nn.Module, hidden_states: torch.Tensor):
    """A served router's forward on tileops (``_ROUTERS``): (logits, weights, int64 ids)."""
    st = self._tileops
    x = hidden_states.reshape(-1, self.hidden_dim).contiguous()
    logits = st.gemm(x, self.weight)  # [T, E], x's dtype (F.linear's)
    weights, ids = st.topk(logits)  # float32 [T, K], int32 [T, K]
    ids = ids.long()
    if logits.shape[0]:
        weights, ids = _ties_as_transformers(logits, weights, ids, st.renormalize)
    return logits, weights.to(logits.dtype) if st.weights_in_logits_dtype else weights, ids


def _ties_as_transformers(logits: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, renormalize: bool):
    """Tokens whose k-th chosen logit equals an expert left out: their selection (ties to the
    lower id) may not be torch.topk's, so they are routed by transformers' formula."""
    k = ids.shape[1]
    kth = logits.gather(1, ids[:, -1:])
    tied = (logits >= kth).sum(dim=1) > k
    if not bool(tied.any()):
        return weights, ids
    rows = tied.nonzero().squeeze(1)
    probs = torch.softmax(logits[rows], dim=-1, dtype=torch.float32)
    top, top_ids = torch.topk(probs, k, dim=-1)
    if renormalize:
        top /= top.sum(dim=-1, keepdim=True)
    weights, ids = weights.clone(), ids.clone()
    weights[rows], ids[rows] = top, top_ids
    return weights, ids


# ---- the experts -------------------------------------------------------------------------


def tileops_experts(
    self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """transformers' experts signature: hidden_states [T, H], top_k_index / top_k_weights [T, K] -> [T, H]."""
    st = self.__dict__.get("_tileops")
    if st is None:
        raise RuntimeError(
            f"experts implementation '{NAME}' runs on modules that tileops.integrations.transformers.enable(model) "
            f"patched; {type(self).__name__} was not (call enable(model) instead of setting the experts "
            "implementation by hand)"
        )
    tokens = hidden_states.shape[0]
    gating = routing_as_logits(top_k_index, top_k_weights, st.num_experts)
    op = st.moe(_pow2(max(tokens, 1)))
    return op(hidden_states.contiguous(), gating, self.gate_up_proj, self.down_proj, None)


def register() -> None:
    """Registers ``"tileops"`` with transformers' ExpertsInterface (idempotent)."""
    if ExpertsInterface is not None:
        ExpertsInterface.register(NAME, tileops_experts)
