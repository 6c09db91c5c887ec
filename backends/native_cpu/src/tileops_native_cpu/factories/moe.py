"""The moe family's factories (csrc/kernels/moe*.h): the router (FusedTopKOp) and the MoE block
(FusedMoeFwdOp)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._runtime import (
    FLOATS,
    check_inputs,
    dtype_name,
    fail,
    native_dtype,
    shape_of,
    specialisation,
)
from .common import Builder, Factory

_MOE_SCORINGS = ("softmax", "sigmoid")
_MOE_ACTIVATIONS = ("silu_and_mul", "gelu_and_mul")


def _moe_routing(op: str, experts: int, top_k: Any, scoring_func: str, bias: Any) -> int:
    """Checks what both MoE ops' routing needs; returns top_k as an int."""
    if top_k is None or isinstance(top_k, bool) or int(top_k) < 1:
        raise fail(op, "top_k must be an int >= 1", f"top_k={top_k!r}")
    if int(top_k) > experts:
        raise fail(op, f"top_k must be at most the number of experts ({experts})", f"top_k={top_k}")
    if scoring_func not in _MOE_SCORINGS:
        raise fail(op, f"scoring_func must be one of {list(_MOE_SCORINGS)}", f"scoring_func={scoring_func!r}")
    if bias is not None:
        check_inputs(op, (torch.float32,), correction_bias=bias)
        if scoring_func != "sigmoid":
            raise fail(op, "a correction_bias needs scoring_func='sigmoid'", f"scoring_func={scoring_func!r}")
        if shape_of(bias) != (experts,):
            raise fail(
                op,
                f"correction_bias must be [{experts}] (one per expert)",
                f"correction_bias of shape {shape_of(bias)}",
            )
    return int(top_k)


def fused_topk(dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    """gating_output [T, E] -> (topk_weights float32 [T, K], topk_ids int32 [T, K]); T is
    read at call time."""

    def factory(op: str) -> Builder:
        def build(
            gating_output: Any,
            correction_bias: Any,
            *,
            num_tokens: int | None = None,
            num_experts: int | None = None,
            top_k: int | None = None,
            scoring_func: str = "softmax",
            renormalize: bool = False,
        ) -> Any:
            check_inputs(op, dtypes, gating_output=gating_output)
            if len(gating_output.shape) != 2:
                raise fail(
                    op, "gating_output must be [tokens, experts]", f"gating_output of shape {shape_of(gating_output)}"
                )
            tokens, experts = shape_of(gating_output)
            if num_experts is not None and num_experts != experts:
                raise fail(
                    op,
                    f"gating_output must have num_experts={num_experts} columns",
                    f"gating_output of shape {(tokens, experts)}",
                )
            if num_tokens is not None and tokens > num_tokens:
                raise fail(
                    op,
                    f"gating_output may have at most num_tokens={num_tokens} rows",
                    f"gating_output of shape {(tokens, experts)}",
                )
            k = _moe_routing(op, experts, top_k, scoring_func, correction_bias)
            dtype, renorm, has_bias = gating_output.dtype, bool(renormalize), correction_bias is not None
            return specialisation(
                op,
                (dtype, k, scoring_func, renorm, has_bias),
                f"{dtype_name(dtype)}, top_k={k}, scoring_func={scoring_func}, renormalize={renorm}, bias={has_bias}",
                lambda C, threads, d: C.fused_topk(
                    native_dtype(dtype), k, C.MoeScoring[scoring_func], renorm, has_bias, threads, d
                ),
            )

        return build

    return factory


def fused_moe(dtypes: Sequence[torch.dtype]) -> Factory:
    """hidden_states [T, H], gating_output [T, E] float32, w_gate_up [E, 2F, H], w_down
    [E, H, F], correction_bias [E] float32 or None -> output [T, H]; T (at most num_tokens)
    is read at call time, the rest is fixed."""

    def factory(op: str) -> Builder:
        def build(
            hidden_states: Any,
            gating_output: Any,
            w_gate_up: Any,
            w_down: Any,
            correction_bias: Any,
            *,
            num_tokens: int,
            num_experts: int,
            top_k: int,
            hidden_size: int,
            ffn_size: int,
            scoring_func: str = "softmax",
            renormalize: bool = False,
            routed_scaling_factor: float = 1.0,
            activation: str = "silu_and_mul",
        ) -> Any:
            dtype = check_inputs(op, dtypes, hidden_states=hidden_states, w_gate_up=w_gate_up, w_down=w_down)
            check_inputs(op, (torch.float32,), gating_output=gating_output)
            e, h, f = int(num_experts), int(hidden_size), int(ffn_size)
            if e < 1 or h < 1 or f < 1:
                raise fail(op, "num_experts, hidden_size and ffn_size must be >= 1", f"{e}, {h}, {f}")
            tokens = int(hidden_states.shape[0]) if len(hidden_states.shape) == 2 else -1
            expected = {
                "hidden_states": (tokens, h),
                "gating_output": (tokens, e),
                "w_gate_up": (e, 2 * f, h),
                "w_down": (e, h, f),
            }
            given = {
                "hidden_states": hidden_states,
                "gating_output": gating_output,
                "w_gate_up": w_gate_up,
                "w_down": w_down,
            }
            for name, want in expected.items():
                if tokens < 0 or shape_of(given[name]) != want:
                    dims = ", ".join(map(str, want)) if tokens >= 0 else "tokens, hidden_size"
                    raise fail(
                        op,
                        f"{name} must be [{dims}] (num_experts={e}, hidden_size={h}, ffn_size={f})",
                        f"{name} of shape {shape_of(given[name])}",
                    )
            if tokens > num_tokens:
                raise fail(op, f"hidden_states may have at most num_tokens={num_tokens} rows", f"{tokens} rows")
            if activation not in _MOE_ACTIVATIONS:
                raise fail(op, f"activation must be one of {list(_MOE_ACTIVATIONS)}", f"activation={activation!r}")
            k = _moe_routing(op, e, top_k, scoring_func, correction_bias)
            renorm, scale, has_bias = bool(renormalize), float(routed_scaling_factor), correction_bias is not None
            return specialisation(
                op,
                (dtype, e, k, h, f, scoring_func, renorm, scale, activation, has_bias),
                f"{dtype_name(dtype)}, experts={e}, top_k={k}, hidden={h}, ffn={f}, scoring_func={scoring_func}, "
                f"renormalize={renorm}, scale={scale}, {activation}, bias={has_bias}",
                lambda C, threads, d: C.fused_moe(
                    native_dtype(dtype),
                    e,
                    k,
                    h,
                    f,
                    C.MoeScoring[scoring_func],
                    renorm,
                    scale,
                    C.MoeActivation[activation],
                    has_bias,
                    threads,
                    d,
                ),
            )

        return build

    return factory
