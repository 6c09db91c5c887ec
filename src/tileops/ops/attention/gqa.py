"""Grouped-query attention: prefill (BSHD) and decode against a dense KV cache.

The shape dims are fixed at construction, as in the reference API; a call is checked
against them by the manifest (its ``upstream:`` dims), on a memo miss. ``sm_scale`` and
``softcap`` are constructor arguments, not manifest params, so a builder never sees
them: an external target is only asked to serve the defaults (scale dim**-0.5, no
softcap), and a call with other values on an external target raises instead of
computing something else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ...backend.errors import OpNotAvailableError
from ...backend.types import Target, _Builtin
from .. import _catalog
from ..op import Op

# The ops of this module that are generated from their entries, made on first use.
__getattr__, __dir__ = _catalog.lazy_members(__name__)

_SHAPE_ARGS = {"batch": "int", "heads": "int", "heads_kv": "int"}
_SCORE_ARGS = {"sm_scale": "float?", "softcap": "float?"}


def _constructor_extras(op: str, dims: dict[str, int], sm_scale: float | None, softcap: float | None) -> dict[str, Any]:
    """Validates the constructor-only arguments and returns them as the op's extras."""
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{op}: {name} must be a positive int, got {value!r}")
    if dims["heads"] % dims["heads_kv"]:
        raise ValueError(
            f"{op}: heads must be a multiple of heads_kv, got heads={dims['heads']}, heads_kv={dims['heads_kv']}"
        )
    if sm_scale is not None and not (isinstance(sm_scale, (int, float)) and sm_scale > 0):
        raise ValueError(f"{op}: sm_scale must be a positive float or None, got {sm_scale!r}")
    if softcap is not None and not (isinstance(softcap, (int, float)) and softcap >= 0):
        raise ValueError(f"{op}: softcap must be a non-negative float or None, got {softcap!r}")
    return {
        **dims,
        "sm_scale": None if sm_scale is None else float(sm_scale),
        "softcap": None if softcap is None else float(softcap),
    }


class _Attention(Op):
    _abstract = True

    def _check_extras(self, tensors: Sequence[torch.Tensor | None], target: Target) -> None:
        if isinstance(target, _Builtin):
            return
        head_dim = self.extras["dim"]
        default_scale = self.extras["sm_scale"] in (None, head_dim**-0.5)
        if not default_scale or self.extras["softcap"] not in (None, 0.0):
            raise OpNotAvailableError(
                f"{type(self).__name__}: target {target!r} is only handed the manifest params, "
                f"which do not carry sm_scale={self.extras['sm_scale']!r} or "
                f"softcap={self.extras['softcap']!r}; external targets compute with "
                f"sm_scale=dim**-0.5 and no softcap. Use those values, or target=BUILTIN."
            )


class GroupedQueryAttentionFwdOp(_Attention):
    """Prefill attention, q [B, S, H, D], k/v [B, S, H_kv, D] -> o [B, S, H, D].

    ``GroupedQueryAttentionFwdOp(batch, heads, heads_kv, seq_len, dim, is_causal=True,
    sm_scale=None, softcap=None)``, then ``op(q, k, v)``.
    """

    _extra_args = {**_SHAPE_ARGS, "seq_len": "int", "dim": "int", **_SCORE_ARGS}

    def __init__(
        self,
        batch: int,
        heads: int,
        heads_kv: int,
        seq_len: int,
        dim: int,
        is_causal: bool = True,
        sm_scale: float | None = None,
        softcap: float | None = None,
        *,
        target: Target | None = None,
        kernel_map: Mapping[str, Callable[..., Any]] | None = None,
        tune: bool = False,
    ) -> None:
        dims = {
            "batch": batch,
            "heads": heads,
            "heads_kv": heads_kv,
            "seq_len": seq_len,
            "dim": dim,
        }
        extras = _constructor_extras(type(self).__name__, dims, sm_scale, softcap)
        self._setup({"is_causal": is_causal}, target=target, kernel_map=kernel_map, tune=tune, extras=extras)

    def _fetch(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        # The square kernel also needs the GPU's arch, which is asked only once the in-tree
        # CUDA kernels exist; until then causal D=128 calls take the causal role.
        causal_128 = self.params["is_causal"] and q.shape[-1] == 128
        role = "gqa_prefill_causal_fwd_kernel" if causal_128 else "gqa_prefill_fwd_kernel"
        return self.get_or_build_kernel(
            role,
            (q, k, v),
            key=(role, q.dtype),
            build=self._in_tree(role, (q, k, v), **self.extras),
        )


class GroupedQueryAttentionDecodeWithKVCacheFwdOp(_Attention):
    """One query token per sequence against a dense KV cache: q [B, H, D],
    k/v [B, N_kv, H_kv, D] with N_kv <= seqlen_kv -> o [B, H, D].

    ``GroupedQueryAttentionDecodeWithKVCacheFwdOp(batch, heads, heads_kv, seqlen_kv, dim,
    sm_scale=None, softcap=None)``, then ``op(q, k, v)``.
    """

    _extra_args = {**_SHAPE_ARGS, "seqlen_kv": "int", "dim": "int", **_SCORE_ARGS}

    def __init__(
        self,
        batch: int,
        heads: int,
        heads_kv: int,
        seqlen_kv: int,
        dim: int,
        sm_scale: float | None = None,
        softcap: float | None = None,
        *,
        target: Target | None = None,
        kernel_map: Mapping[str, Callable[..., Any]] | None = None,
        tune: bool = False,
    ) -> None:
        dims = {
            "batch": batch,
            "heads": heads,
            "heads_kv": heads_kv,
            "seqlen_kv": seqlen_kv,
            "dim": dim,
        }
        extras = _constructor_extras(type(self).__name__, dims, sm_scale, softcap)
        self._setup({}, target=target, kernel_map=kernel_map, tune=tune, extras=extras)

    def _fetch(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        e = self.extras
        group = e["heads"] // e["heads_kv"]
        bs1 = e["batch"] == 1 and q.dtype == torch.float16 and e["dim"] == 128 and not e["softcap"] and 1 <= group <= 64
        role = "gqa_decode_bs1_kernel" if bs1 else "gqa_decode_kernel"
        return self.get_or_build_kernel(role, (q, k, v), key=(role, q.dtype), build=self._in_tree(role, (q, k, v), **e))
