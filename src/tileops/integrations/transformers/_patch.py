"""enable / disable: tileops ops patched into a transformers model instance.

Per-instance patching: each served module gets a per-instance ``forward`` (and a
``_tileops`` attribute holding its ops); the class and its other instances are untouched.
MoE experts keep their forward, which dispatches through transformers' ExpertsInterface
to ``"tileops"`` (``_moe.py``). ``disable`` deletes both, and restores the config's
attention and experts implementations and the base model's forward, so the model is
exactly what it was.

What is served is decided up front, from the config and the module types; anything that
cannot be served exactly is refused (``UnsupportedModelError``, naming the module, the
feature and the config value) or, with ``strict=False``, left on torch and listed in the
report. Nothing is guessed.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from tileops.serving.host_memory import huge_pages_available

from . import _attention, _forwards, _fused_model, _fusion, _generate, _moe, _placement
from ._cache import PAGE_SIZE, TileopsCache
from ._compat import cache_field, cache_kwarg, pop_cache

__all__ = ["EnableReport", "UnsupportedModelError", "enable", "disable", "SUPPORTED_ARCHITECTURES"]

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Gemma3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Phi3ForCausalLM",
    "MixtralForCausalLM",
    "Qwen2MoeForCausalLM",
    "GraniteForCausalLM",
    "Olmo2ForCausalLM",
)
# attention classes that take their window from the config (the others keep it as
# module.sliding_window, set on their sliding layers only)
_WINDOW_FROM_CONFIG = {"MistralAttention", "Phi3Attention", "MixtralAttention"}
_GATED_ACTS = {"silu": "SiluAndMulFwdOp", "gelu_pytorch_tanh": "GeluTanhAndMulFwdOp"}
_RMSNORMS = {  # class name -> the weight is used as w (False) or as 1 + w (True)
    "LlamaRMSNorm": False, "MistralRMSNorm": False, "Qwen2RMSNorm": False, "Qwen3RMSNorm": False,
    "Qwen3MoeRMSNorm": False, "Gemma3RMSNorm": True, "Phi3RMSNorm": False, "MixtralRMSNorm": False,
    "Qwen2MoeRMSNorm": False, "GraniteRMSNorm": False, "Olmo2RMSNorm": False,
}
_HALF = (torch.float16, torch.bfloat16)


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
    huge_page_bytes: int = 0  # served weights moved to huge pages (_placement.py)

    def count(self, kind: str) -> int:
        return len(self.replaced.get(kind, ()))

    def __str__(self) -> str:
        lines = [f"tileops on {self.model} (target={self.target or 'default'}):"]
        lines += [f"  {kind}: {len(names)} modules" for kind, names in self.replaced.items()]
        lines += [f"  on torch: {m}: {feat} ({why})" for m, feat, why in self.on_torch]
        if self.huge_page_bytes:
            lines.append(f"  weights on huge pages: {self.huge_page_bytes / 2**20:.1f} MiB")
        return "\n".join(lines)


# ---- the base model's forward ----------------------------------------------------------


def _base_model_forward(self: nn.Module, *args: Any, **kwargs: Any):
    """The base model's forward, making a TileopsCache where transformers would make a
    DynamicCache (and replacing an empty one that ``generate`` made)."""
    st = self._tileops
    st.positions.new_forward()
    cache = pop_cache(kwargs)
    use_cache = kwargs.get("use_cache")
    use_cache = self.config.use_cache if use_cache is None else use_cache
    if cache is None and use_cache or cache is not None and not isinstance(cache, TileopsCache) and _empty(cache):
        cache = TileopsCache(config=self.config)
    if st.fused is not None and len(args) <= 1:  # the whole model as one loop (_fused_model.py)
        if args:
            kwargs["input_ids"] = args[0]
        if st.fused.accepts(kwargs):
            return st.fused.forward(cache, **kwargs)
        args = (kwargs.pop("input_ids"),) if args else ()
    kwargs[st.cache_kw] = cache
    return st.forward(*args, **kwargs)


# Causal LMs whose forward is the base model, logits_to_keep's slice and lm_head, and a loss
# only with labels: a decode step of theirs can be served whole (_causal_lm_forward_like).
# (Gemma 3 caps its logits after the head, Granite scales them; MoE base models do not replay.)
_PLAIN_CAUSAL_LMS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM",
                     "Olmo2ForCausalLM")


def _causal_lm_forward_like(cls_forward: Any) -> Any:
    """The causal LM's forward, with the signature of its class's (``generate`` reads it): a
    decode step it can serve whole goes to ``FusedModel.decode_logits`` (the layers and
    lm_head replayed as one graph, none of transformers' module calls and outputs around
    them); any other call to transformers' forward."""

    @functools.wraps(cls_forward)
    def forward(self: nn.Module, *args: Any, **kwargs: Any):
        st = self._tileops
        step = None
        if len(args) <= 1 and not (args and "input_ids" in kwargs):  # input_ids may come first, by position
            step = st.fused.decode_logits(st.head, {"input_ids": args[0], **kwargs} if args else kwargs)
        if step is None:
            return st.forward(*args, **kwargs)
        logits, cache = step
        return st.output(logits=logits, **{st.cache_field: cache})

    return forward


def _empty(cache: Any) -> bool:
    try:
        return cache.get_seq_length() == 0
    except Exception:  # noqa: BLE001 - a cache we cannot ask is not ours to replace
        return False


# ---- what can be served ----------------------------------------------------------------


class _Plan:
    def __init__(self, model: nn.Module, strict: bool, target: str | None) -> None:
        self.model, self.strict, self.target = model, strict, target
        self.report = EnableReport(type(model).__name__, target)
        self.patches: list[tuple[nn.Module, str, types.SimpleNamespace, Any]] = []
        self.positions: _PositionCheck | None = None  # the attention layers' position check

    def refuse(self, module: str, feature: str, why: str) -> None:
        if self.strict:
            raise UnsupportedModelError(
                f"tileops cannot serve {module}: {feature} ({why}); enable(model, strict=False) keeps it on torch"
            )
        self.report.on_torch.append((module, feature, why))

    def add(self, kind: str, name: str, module: nn.Module, forward: Any, **state: Any) -> None:
        self.patches.append((module, kind, types.SimpleNamespace(name=name, **state), forward))
        self.report.replaced.setdefault(kind, []).append(name)


def _ops():
    from tileops import ops  # noqa: PLC0415 - the op catalog loads on first enable

    return ops


def _rope_params(config: Any, module: nn.Module) -> dict:
    params = config.rope_parameters or {}
    layer_type = getattr(module, "layer_type", None)
    if "rope_type" not in params and layer_type in params:  # per layer type (Gemma 3)
        params = params[layer_type]
    return params


class _LongRope:
    """LongRoPE as transformers applies it: the short factors while a call's positions stay
    within original_max_position_embeddings, the long ones for a call that reaches past it
    (transformers picks per forward call from max(position_ids) + 1, and keeps the keys it
    cached under the other set as they are; so does the cache here)."""

    def __init__(self, short: Any, long: Any, original: int) -> None:
        self.short, self.long, self.original = short, long, original

    def __call__(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        op = self.long if pos.numel() and int(pos.max()) + 1 > self.original else self.short
        return op(x, pos)


def _rope_op(config: Any, module: nn.Module, name: str, plan: _Plan):
    """(the position-id RoPE op for this attention module, the factor on cos and sin it leaves
    to the attention scale), or (None, 1.0): refused."""
    ops = _ops()
    params = _rope_params(config, module)
    rope_type = params.get("rope_type", "default")
    base = float(params.get("rope_theta", 10000.0))
    served = ("default", "dynamic", "linear", "longrope", "llama3", "yarn")
    if rope_type not in served:
        plan.refuse(name, "rotary embedding", f"rope_parameters rope_type={rope_type!r} "
                    f"(served: default, linear, dynamic below max_position_embeddings, longrope, llama3, yarn)")
        return None, 1.0
    # transformers' own frequencies say how many channels of a head rotate: a model whose
    # default RoPE honours partial_rotary_factor (Phi-3) builds a table for fewer than
    # head_dim channels, one that ignores it (Llama) a whole one
    inv_freq, gain = _transformers_rope(config, module, rope_type, plan.model)
    dim = 2 * inv_freq.numel()
    if dim != module.head_dim and not _rotates_part_of_a_head(module):
        plan.refuse(name, "partial rotary embedding",
                    f"rope_parameters partial_rotary_factor={params.get('partial_rotary_factor')} with "
                    f"rope_type={rope_type!r}: transformers' {type(module).__name__} rotates the whole head and fails "
                    "on the partial table")
        return None, 1.0
    common = dict(rotary_dim=dim, target=plan.target)
    max_position = int(config.max_position_embeddings)
    # the ops' own attention factors stay 1 (max_position_embeddings == original): transformers'
    # factor on cos and sin multiplies q and k alike, so it goes into the attention scale squared
    scaled = dict(max_position_embeddings=max_position, original_max_position_embeddings=max_position, **common)
    if rope_type in ("default", "dynamic"):
        # dynamic NTK keeps the default frequencies while positions stay below
        # max_position_embeddings; past it the call raises (the scaled frequencies are not served)
        return ops.RopeNeoxPositionIdsFwdOp(max_position, base, **common), 1.0
    if rope_type == "linear":  # every frequency divided by factor: LongRoPE's per-frequency factors, all equal
        return ops.RopeLongRopePositionIdsFwdOp(max_position, base, rescale_factors=[float(params["factor"])] * (dim // 2),
                                                **scaled), 1.0
    if rope_type == "longrope":
        short, long = (ops.RopeLongRopePositionIdsFwdOp(max_position, base, rescale_factors=[float(f) for f in params[k]],
                                                        **scaled) for k in ("short_factor", "long_factor"))
        return _LongRope(short, long, int(params["original_max_position_embeddings"])), gain
    if rope_type == "llama3":
        return ops.RopeLlama31PositionIdsFwdOp(
            max_position, base, scale_factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]), high_freq_factor=float(params["high_freq_factor"]),
            original_max_position=int(params["original_max_position_embeddings"]), **common), 1.0
    # yarn: transformers' YaRN (correction dims over the whole rotary dim, interpolation f /
    # factor) is not the YaRN op's convention (over half of it, (factor * base)^(-k/half)):
    # its own frequencies, as LongRoPE per-frequency factors
    plain = 1.0 / (base ** (torch.arange(dim // 2, dtype=torch.float32) / (dim // 2)))
    return ops.RopeLongRopePositionIdsFwdOp(max_position, base, rescale_factors=(plain.double() / inv_freq.double()).tolist(),
                                            **scaled), gain


def _transformers_rope(config: Any, module: nn.Module, rope_type: str, model: nn.Module) -> tuple[torch.Tensor, float]:
    """transformers' own (inverse frequencies, factor on cos and sin) for this layer: the
    model's rotary embedding's default, or the scaled type's init function."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: PLC0415

    layer_type = getattr(module, "layer_type", None)
    per_layer = "rope_type" not in (config.rope_parameters or {}) and layer_type is not None
    kw = {"layer_type": layer_type} if per_layer else {}
    if rope_type == "default":
        rotary = next((type(m) for m in model.modules() if hasattr(type(m), "compute_default_rope_parameters")), None)
        if rotary is None:  # no rotary embedding of its own: the whole head, at the plain frequencies
            return 1.0 / (config.rope_parameters.get("rope_theta", 10000.0)
                          ** (torch.arange(0, module.head_dim, 2, dtype=torch.float32) / module.head_dim)), 1.0
        inv_freq, gain = rotary.compute_default_rope_parameters(config, device=None, **kw)
    else:
        inv_freq, gain = ROPE_INIT_FUNCTIONS[rope_type](config, None, **kw)
    return inv_freq.float(), float(gain)


def _rotates_part_of_a_head(attention: nn.Module) -> bool:
    """Whether the attention's modeling module applies a rotary table narrower than a head
    (rotating its leading channels, as Phi-3's apply_rotary_pos_emb does) rather than
    failing on it (Llama's): tried on a head of 4 channels with a table of 2."""
    apply = getattr(sys.modules.get(type(attention).__module__), "apply_rotary_pos_emb", None)
    if apply is None:
        return False
    head, table = torch.zeros(1, 1, 1, 4), torch.ones(1, 1, 2)
    try:
        apply(head, head, table, table)
    except RuntimeError:
        return False
    return True


def _plan_attention(model: nn.Module, config: Any, plan: _Plan) -> None:
    attentions = [(n, m) for n, m in model.named_modules() if n.endswith("self_attn")]
    ops = _ops()
    if getattr(config, "use_bidirectional_attention", False):
        plan.refuse("attention", "bidirectional attention", "config use_bidirectional_attention=True")
        return
    staged = []
    positions = plan.positions = _PositionCheck(int(config.max_position_embeddings))  # one for every layer
    for name, module in attentions:
        rope, gain = _rope_op(config, module, name, plan)
        if rope is None:
            return  # every attention layer stays on torch: the config names one implementation
        window = getattr(module, "sliding_window", None)
        if window is None and type(module).__name__ in _WINDOW_FROM_CONFIG:
            window = getattr(config, "sliding_window", None)
        # None of the served architectures' attention applies a logit softcap in transformers
        # (Gemma 3 keeps attn_logit_softcapping in its config but never passes it), so neither
        # does ours; tileops_attention honours softcap= for a caller that passes one.
        softcap = None
        # q/k norms per head (Qwen3, Gemma 3) or over the whole projection (OLMo 2)
        qk_norm = None if not hasattr(module, "q_norm") else (
            "head" if module.q_norm.weight.numel() == module.head_dim else "projection")
        staged.append((name, module, dict(
            rope=rope, window=window, softcap=softcap, scaling=module.scaling * gain * gain, qk_norm=qk_norm,
            rope_gain=gain, positions=positions,
            rope_type=_rope_params(config, module).get("rope_type", "default"),
            prefill=_memo(lambda mq, mk, s, c, w: ops.GroupedQueryAttentionPrefillFwdOp(
                mq, mk, True, s, c, w, -1, target=plan.target)),
            paged=_memo(lambda width, mq, s, c, w: ops.GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp(
                width, PAGE_SIZE, mq, True, s, c, w, target=plan.target)),
        )))
    for name, module, state in staged:
        plan.add("attention", name, module, _forwards.attention_forward, **state)


class _PositionCheck:
    """Refuses positions past max_position_embeddings (the RoPE ops' tables end there),
    once per forward: every layer of a forward gets the same position tensor, and the
    base model's forward (``_base_model_forward``) calls ``new_forward`` before its layers
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
            raise ValueError(f"{module}: position {int(flat.max())} is past max_position_embeddings={self.max_position}"
                             + note)
        self.seen = position_ids


def _memo(make: Any) -> Any:
    """One op per distinct params (ops memoize their kernels per instance)."""
    made: dict[tuple, Any] = {}

    def get(*key: Any) -> Any:
        if key not in made:
            made[key] = make(*key)
        return made[key]

    get.made = made  # the ops made so far (_replay.py asks where they run)
    return get


def _plan(model: nn.Module, strict: bool, target: str | None) -> _Plan:
    plan = _Plan(model, strict, target)
    arch = type(model).__name__
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"tileops cannot serve {arch}: architecture (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    if model.training:
        raise UnsupportedModelError(f"tileops cannot serve {arch} in training mode: it is inference only (model.eval())")
    dtype = next(model.parameters()).dtype
    if dtype not in _HALF:
        raise UnsupportedModelError(
            f"tileops cannot serve {arch} in {dtype}: tileops' GEMM and attention kernels serve float16 and bfloat16; "
            "load the model with torch_dtype=torch.bfloat16 (dtype= in transformers 5), or call "
            "model.to(torch.bfloat16)")
    if getattr(model, "_tileops_enabled", False):
        raise UnsupportedModelError(f"{arch} is already enabled (tileops.integrations.transformers.disable(model) first)")
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    ops = _ops()

    _plan_attention(model, config, plan)
    _moe.plan(model, config, plan, ops, _memo)

    act_name = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
    for name, module in model.named_modules():
        cls = type(module).__name__
        if type(module) is nn.Linear:
            if module.weight.dtype not in _HALF:
                plan.refuse(name, "Linear", f"weight dtype {module.weight.dtype}")
                continue
            plan.add("linear", name, module, _forwards.linear_forward, gemm=ops.GemmFwdOp(False, True, target=target),
                     add=ops.AddFwdOp(target=target))
        elif cls.endswith("RMSNorm"):
            if cls not in _RMSNORMS:
                plan.refuse(name, f"{cls}", "an RMSNorm class whose weight convention tileops does not know")
                continue
            weight = (1.0 + module.weight.float()).to(module.weight.dtype) if _RMSNORMS[cls] else None
            plan.add("rmsnorm", name, module, _forwards.rmsnorm_forward, weight=weight,
                     norm=ops.RMSNormFwdOp((module.weight.shape[0],), _fusion.norm_eps(module), target=target))
        elif cls.endswith("MLP") and hasattr(module, "down_proj") and (
                all(hasattr(module, p) for p in ("gate_proj", "up_proj")) or hasattr(module, "gate_up_proj")):
            if act_name not in _GATED_ACTS:
                plan.refuse(name, "gated MLP", f"config hidden_act={act_name!r} (served: {', '.join(_GATED_ACTS)})")
                continue
            plan.add("mlp", name, module, _forwards.mlp_forward, act=getattr(ops, _GATED_ACTS[act_name])(target=target))
    for attr, where, what in (("embedding_multiplier", "embed_tokens", "its output times"),
                              ("logits_scaling", "lm_head", "its logits divided by")):  # Granite's
        if float(getattr(config, attr, 1.0) or 1.0) != 1.0:
            plan.report.on_torch.append((where, attr.replace("_", " "), f"{what} {getattr(config, attr)}, in torch"))
    if getattr(config, "final_logit_softcapping", None):
        plan.report.on_torch.append(("lm_head", "final logit softcapping", f"{config.final_logit_softcapping} (torch.tanh)"))
    plan.report.on_torch.append(("embed_tokens", "embedding lookup", "no tileops op"))
    plan.report.on_torch.append(("decoder layers", "residual adds", "torch adds, but for the one after attention "
                                 "in a fused decoder layer (FusedAddRMSNormFwdOp)"))
    return plan


def enable(model: nn.Module, *, target: str | None = None, strict: bool = True) -> EnableReport:
    """Runs ``model``'s forward path on tileops ops; returns what was replaced.

    ``target=`` picks the backend for every op (the protocol's normal choice otherwise).
    Raises ``UnsupportedModelError`` for anything that cannot be served exactly, naming
    the module, the feature and the config value; ``strict=False`` keeps those on torch
    and lists them in the report instead. Revert with ``disable(model)``."""
    plan = _plan(model, strict, target)
    _fusion.plan_fusions(model, plan, _ops(), target)
    _attention.register()
    _moe.register()
    for module, _kind, state, forward in plan.patches:
        module._tileops = state
        if forward is not None:  # the experts keep their forward: it dispatches through ExpertsInterface
            module.forward = types.MethodType(forward, module)
    _fusion.apply_fusions(model)
    saved = {"attn": model.config._attn_implementation, "experts": [],
             "placed": _placement.place_weights(model, plan.patches)}
    if huge_pages_available():
        weights = [p.data for p in saved["placed"]] + [s.weight for s in _fusion.stacks(model) if s.weight.device.type == "cpu"]
        plan.report.huge_page_bytes = sum(w.numel() * w.element_size() for w in weights)
    experts_configs = {id(m.config): m.config for m, kind, _s, _f in plan.patches if kind == "moe experts"}
    for config in experts_configs.values():  # the experts dispatch on their config's experts implementation
        saved["experts"].append((config, config._experts_implementation))
        config._experts_implementation = _moe.NAME
    if plan.report.count("attention"):
        model.config._attn_implementation = _attention.NAME
        base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        cache_kw = cache_kwarg(base.forward)
        fused_layers = {id(m) for m, kind, _s, _f in plan.patches if kind == "decoder layer"}
        fused = _fused_model.plan_fused_model(base, _ops(), target, fused_layers)
        if fused is not None:
            plan.report.replaced["model forward"] = [type(base).__name__]
            plan.report.on_torch = [(m, f, "torch adds the residual after the MLP only where a call runs transformers' "
                                     "forward (hooks, output_hidden_states, ...)" if f == "residual adds" else why)
                                    for m, f, why in plan.report.on_torch]
        base._tileops = types.SimpleNamespace(name="base model", forward=base.forward, cache_kw=cache_kw, fused=fused,
                                              positions=plan.positions)
        base.forward = types.MethodType(_base_model_forward, base)
        saved["base"] = base
        head = getattr(model, "lm_head", None)
        if (fused is not None and fused.replay is not None and type(model).__name__ in _PLAIN_CAUSAL_LMS
                and base is getattr(model, "model", None) and head is not None and "_tileops" in head.__dict__):
            plan.report.replaced["causal LM decode step"] = [type(model).__name__]
            output = _fused_model.output_class(model, CausalLMOutputWithPast)
            model._tileops = types.SimpleNamespace(name="causal LM", forward=model.forward, fused=fused, head=head,
                                                   output=output, cache_field=cache_field(output))
            model.forward = types.MethodType(_causal_lm_forward_like(type(model).forward), model)
            if "custom_generate" in inspect.signature(type(model).generate).parameters:  # the hook _generate.py takes
                plan.report.replaced["greedy search loop"] = [type(model).__name__]
                model.generate = types.MethodType(_generate.generate_like(type(model).generate), model)
    model._tileops_enabled = saved
    return plan.report


def disable(model: nn.Module) -> None:
    """Undoes ``enable`` exactly: per-instance forwards and states removed, the attention
    implementation restored."""
    saved = getattr(model, "_tileops_enabled", None)
    if not saved:
        raise ValueError(f"{type(model).__name__} is not enabled (tileops.integrations.transformers.enable(model))")
    _fusion.undo_fusions(model)
    _placement.undo_placement(saved["placed"])
    for module in model.modules():
        if "_tileops" in module.__dict__:  # patched by enable: forward and state go
            del module._tileops
            module.__dict__.pop("forward", None)
            module.__dict__.pop("generate", None)
    model.config._attn_implementation = saved["attn"]
    for config, experts_implementation in reversed(saved["experts"]):
        config._experts_implementation = experts_implementation
    del model._tileops_enabled
