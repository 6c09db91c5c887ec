"""enable / disable: a plan (``plan.py``) applied to one model instance, and undone.

Per-instance patching: each served module gets a per-instance ``forward`` and a
``_tileops`` attribute holding its state (``state.py``); the class and its other
instances are untouched. MoE experts keep their forward, which dispatches through
transformers' ExpertsInterface to ``"tileops"`` (``..moe``). The fused paths come on top:
projections stacked, decoder layers fused, the base model's forward as one loop, and for a
plain causal LM its decode step served whole and a greedy ``generate`` whose steps run in
C++. ``disable`` removes all of it and restores the config's attention and experts
implementations, so the model is exactly what it was.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from tileops.quant import ggml_blocks
from tileops.serving.host_memory import huge_pages_available

from .. import attention, moe
from ..compat import cache_field, cache_kwarg
from ..decode import generate
from ..decode.causal_lm import PLAIN_CAUSAL_LMS, causal_lm_forward_like
from ..fused import fusion, placement
from ..fused.model import base_model_forward, output_class, plan_fused_model
from ..gguf import GgufLinear
from .fusions import plan_fusions
from .model import plan_model
from .plan import Plan
from .report import EnableReport
from .state import BaseModelState, CausalLMState

__all__ = ["disable", "enable"]


# enable's weights=: the GGML block type each served Linear's weight is quantized to
WEIGHT_FORMATS = {"int8": "Q8_0"}  # 32 int8 and one float16 scale per block: symmetric, per 32 weights


def enable(
    model: nn.Module, *, target: str | None = None, strict: bool = True, weights: str | None = None
) -> EnableReport:
    """Runs ``model``'s forward path on tileops ops; returns what was replaced.

    ``target=`` picks the backend for every op (the protocol's normal choice otherwise).
    Raises ``UnsupportedModelError`` for anything that cannot be served exactly, naming
    the module, the feature and the config value; ``strict=False`` keeps those on torch
    and lists them in the report instead. ``weights="int8"`` quantizes each served
    Linear's weight once to Q8_0 blocks (a ``GgufLinear`` in its place, served by
    ``GemmGgufFwdOp``); the original modules are kept for ``disable``. Revert with
    ``disable(model)``."""
    if weights is not None and weights not in WEIGHT_FORMATS:
        raise ValueError(f"enable: weights must be None or one of {sorted(WEIGHT_FORMATS)}, got {weights!r}")
    plan = plan_model(model, strict, target)
    swapped: list[tuple[str, nn.Module]] = []
    if weights is not None:
        swapped = _quantize_linears(model, plan, WEIGHT_FORMATS[weights])
        plan = plan_model(model, strict, target)
        plan.report.replaced[f"{weights} weights ({WEIGHT_FORMATS[weights]} blocks)"] = [n for n, _ in swapped]
    plan_fusions(model, plan, target)
    attention.register()
    moe.register()
    for patch in plan.patches:
        patch.module._tileops = patch.state
        if patch.forward is not None:  # the experts keep their forward: it dispatches through ExpertsInterface
            patch.module.forward = types.MethodType(patch.forward, patch.module)
    fusion.apply_fusions(model)
    saved: dict[str, Any] = {
        "attn": model.config._attn_implementation,
        "experts": [],
        "placed": placement.place_weights(model, plan.patches),
        "swapped": swapped,
    }
    if huge_pages_available():
        weights = [p.data for p in saved["placed"]] + [
            w for s in fusion.stacks(model) for w in s.weights if w.device.type == "cpu"
        ]
        plan.report.huge_page_bytes = sum(w.numel() * w.element_size() for w in weights)
    experts_configs = {id(p.module.config): p.module.config for p in plan.served("moe experts")}
    for config in experts_configs.values():  # the experts dispatch on their config's experts implementation
        saved["experts"].append((config, config._experts_implementation))
        config._experts_implementation = moe.NAME
    if plan.report.count("attention"):
        _serve_the_model_forward(model, plan, target, saved)
    model._tileops_enabled = saved
    return plan.report


def _quantize_linears(model: nn.Module, plan: Plan, ggml_type: str) -> list[tuple[str, nn.Module]]:
    """Each Linear ``plan`` serves, swapped for a GgufLinear of its weight in ``ggml_type``
    blocks (where its rows are whole blocks); returns (name, the original) per swap."""
    block = ggml_blocks.ggml_type(ggml_type).block_size
    swapped = []
    for patch in plan.served("linear"):
        module, name = patch.module, patch.state.name
        if type(module) is nn.Linear and module.in_features % block == 0:
            model.set_submodule(name, GgufLinear.quantized(module, ggml_type))
            swapped.append((name, module))
    return swapped


def _serve_the_model_forward(model: nn.Module, plan: Plan, target: str | None, saved: dict[str, Any]) -> None:
    """The base model's forward (one fused loop where every layer is fused), and for a
    plain causal LM whose decode step replays, its decode step and greedy search."""
    model.config._attn_implementation = attention.NAME
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    fused_layers = {id(p.module) for p in plan.served("decoder layer")}
    fused = plan_fused_model(base, plan.ops, target, fused_layers)
    if fused is not None:
        plan.report.replaced["model forward"] = [type(base).__name__]
        plan.report.on_torch = [
            (
                m,
                f,
                "torch adds the residual after the MLP only where a call runs transformers' "
                "forward (hooks, output_hidden_states, ...)"
                if f == "residual adds"
                else why,
            )
            for m, f, why in plan.report.on_torch
        ]
    base._tileops = BaseModelState(
        "base model", forward=base.forward, cache_kw=cache_kwarg(base.forward), fused=fused, positions=plan.positions
    )
    base.forward = types.MethodType(base_model_forward, base)
    saved["base"] = base
    head = getattr(model, "lm_head", None)
    if (
        fused is None
        or fused.replay is None
        or type(model).__name__ not in PLAIN_CAUSAL_LMS
        or base is not getattr(model, "model", None)
        or head is None
        or "_tileops" not in head.__dict__
    ):
        return
    plan.report.replaced["causal LM decode step"] = [type(model).__name__]
    output = output_class(model, CausalLMOutputWithPast)
    model._tileops = CausalLMState(
        "causal LM", forward=model.forward, fused=fused, head=head, output=output, cache_field=cache_field(output)
    )
    model.forward = types.MethodType(causal_lm_forward_like(type(model).forward), model)
    if "custom_generate" in inspect.signature(type(model).generate).parameters:  # the hook decode/generate.py takes
        plan.report.replaced["greedy search loop"] = [type(model).__name__]
        model.generate = types.MethodType(generate.generate_like(type(model).generate), model)


def disable(model: nn.Module) -> None:
    """Undoes ``enable`` exactly: per-instance forwards and states removed, the attention
    implementation restored."""
    saved = getattr(model, "_tileops_enabled", None)
    if not saved:
        raise ValueError(f"{type(model).__name__} is not enabled (tileops.integrations.transformers.enable(model))")
    fusion.undo_fusions(model)
    placement.undo_placement(saved["placed"])
    for module in model.modules():
        if "_tileops" in module.__dict__:  # patched by enable: forward and state go
            del module._tileops
            module.__dict__.pop("forward", None)
            module.__dict__.pop("generate", None)
    for name, original in reversed(saved["swapped"]):
        model.set_submodule(name, original)
    model.config._attn_implementation = saved["attn"]
    for config, experts_implementation in reversed(saved["experts"]):
        config._experts_implementation = experts_implementation
    del model._tileops_enabled
