"""GPTQ and AWQ 4-bit checkpoints, served by ``GemmW4A16FwdOp``.

transformers loads these through the gptqmodel or autoawq packages, whose kernels are
GPU ones. ``load_int4`` builds the same model (transformers' config and architecture, on
the meta device) and converts each quantized Linear's tensors once to upstream TileOPs'
4-bit layout (``tileops.quant.int4``): a ``W4A16Linear`` holding ``packed_weight``,
``weight_scale`` and ``weight_zero`` as ``GemmW4A16FwdOp`` takes them. Every other tensor
loads in ``dtype``. ``enable`` serves the module with that op; without it its forward
dequantizes in torch (slowly, with the same weights).

What is served: ``bits`` 4; GPTQ's ``gptq`` (v1, zero - 1 stored) and ``gptq_v2`` formats,
with groups in K order (``desc_act`` only where ``g_idx`` is ``k // group_size``); AWQ's
GEMM format with zero points. Anything else is refused by name, as is a group size that
does not divide a Linear's ``in_features``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from tileops.quant import int4

from .gguf import _materialise_the_rest, _place_dense

__all__ = ["W4A16Linear", "load_int4"]


class W4A16Linear(nn.Module):
    """A Linear whose weight is 4-bit in groups of ``group_size`` along K, in
    ``GemmW4A16FwdOp``'s layout: ``packed_weight`` uint8 ``[N, K / 2]`` (K index 2i in the
    low nibble), ``weight_scale`` ``[N, K / group_size]`` (float16 or float32),
    ``weight_zero`` uint8 ``[N, K / group_size]``; a weight is ``(q - zero) * scale``."""

    WEIGHTS = ("packed_weight", "weight_scale", "weight_zero")  # named as the op's inputs, in its order

    def __init__(
        self,
        packed_weight: torch.Tensor,
        weight_scale: torch.Tensor,
        weight_zero: torch.Tensor,
        group_size: int,
        bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        n, k = packed_weight.shape[0], 2 * packed_weight.shape[-1]
        groups = (n, k // group_size) if group_size > 0 and k % group_size == 0 else None
        ok = (
            packed_weight.dtype == torch.uint8
            and packed_weight.ndim == 2
            and groups is not None
            and tuple(weight_scale.shape) == groups == tuple(weight_zero.shape)
            and weight_scale.dtype in (torch.float16, torch.float32)
            and weight_zero.dtype == torch.uint8
            and (bias is None or tuple(bias.shape) == (n,))
        )
        if not ok:
            raise ValueError(
                f"W4A16Linear: expected packed_weight uint8 [N, K / 2], weight_scale float16/float32 and weight_zero "
                f"uint8 [N, K / group_size] with group_size={group_size} dividing K, bias [N] or None; got "
                f"packed_weight {packed_weight.dtype} {tuple(packed_weight.shape)}, weight_scale {weight_scale.dtype} "
                f"{tuple(weight_scale.shape)}, weight_zero {weight_zero.dtype} {tuple(weight_zero.shape)}, bias "
                f"{None if bias is None else tuple(bias.shape)}"
            )
        self.in_features, self.out_features, self.group_size = k, n, group_size
        self.register_buffer("packed_weight", packed_weight)
        self.register_buffer("weight_scale", weight_scale)
        self.register_buffer("weight_zero", weight_zero)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @classmethod
    def from_gptq(
        cls,
        qweight: torch.Tensor,
        qzeros: torch.Tensor,
        scales: torch.Tensor,
        group_size: int,
        *,
        g_idx: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        v1: bool = True,
    ) -> W4A16Linear:
        """A GPTQ linear's tensors as the checkpoint stores them (``int4.from_gptq``)."""
        return cls(*int4.from_gptq(qweight, qzeros, scales, group_size, g_idx=g_idx, v1=v1), group_size, bias)

    @classmethod
    def from_awq(
        cls,
        qweight: torch.Tensor,
        qzeros: torch.Tensor,
        scales: torch.Tensor,
        group_size: int,
        *,
        bias: torch.Tensor | None = None,
    ) -> W4A16Linear:
        """An AWQ GEMM linear's tensors as the checkpoint stores them (``int4.from_awq``)."""
        return cls(*int4.from_awq(qweight, qzeros, scales, group_size), group_size, bias)

    def dequantized(self) -> torch.Tensor:
        """The weights, float32 ``[out_features, in_features]``, exactly."""
        return int4.dequantize(self.packed_weight, self.weight_scale, self.weight_zero, self.group_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantized().to(x.dtype), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}"


class _Scheme(NamedTuple):
    """What a checkpoint's ``quantization_config`` says about its tensors."""

    method: str  # "gptq" or "awq"
    group_size: int  # -1: one group per row (the whole of K)
    v1: bool  # GPTQ's v1 format stores zero - 1


def _scheme(config: Any, where: str) -> _Scheme:
    """The scheme of a ``quantization_config`` (a dict, or transformers' config object),
    or a ValueError naming the key and value tileops does not serve."""
    qc = config.to_dict() if hasattr(config, "to_dict") else dict(config or {})
    method = str(qc.get("quant_method", "")).lower()

    def refuse(what: str) -> ValueError:
        return ValueError(
            f"{where}: {what}; tileops serves 4-bit GPTQ (gptq, gptq_v2) and AWQ GEMM checkpoints: load this one "
            "with transformers (the gptqmodel or autoawq packages)"
        )

    if method not in ("gptq", "awq"):
        raise refuse(f"quantization_config has quant_method={qc.get('quant_method')!r}")
    if qc.get("bits") != 4:
        raise refuse(f"{method} checkpoint with bits={qc.get('bits')!r} (GemmW4A16FwdOp reads 4-bit weights)")
    group_size = qc.get("group_size")
    if not isinstance(group_size, int) or isinstance(group_size, bool) or not (group_size > 0 or group_size == -1):
        raise refuse(f"{method} checkpoint with group_size={group_size!r} (a positive int, or -1 for whole rows)")
    if method == "gptq":
        # transformers' precedence: the legacy checkpoint_format over format
        fmt = str(qc.get("checkpoint_format") or qc.get("format") or "gptq").lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise refuse(f"GPTQ checkpoint in format {fmt!r} (its tensors are not GPTQ's packing)")
        return _Scheme(method, group_size, fmt == "gptq")
    fmt = str(qc.get("version") or qc.get("format") or "gemm").lower()
    if fmt != "gemm":
        raise refuse(f"AWQ checkpoint of version {fmt!r} (only GEMM's packing, [K, N / 8] along N, is read)")
    if qc.get("zero_point") is False:
        raise refuse("AWQ checkpoint with zero_point=False (a layout without zero points, not read here)")
    return _Scheme(method, group_size, False)


def load_int4(folder: str | os.PathLike, *, dtype: torch.dtype = torch.bfloat16, **config_kwargs: Any) -> nn.Module:
    """The causal LM of a GPTQ or AWQ checkpoint in ``folder`` (config.json,
    model.safetensors or its index) with each quantized Linear a ``W4A16Linear``,
    everything else in ``dtype``; eval mode."""
    import transformers  # noqa: PLC0415

    config = transformers.AutoConfig.from_pretrained(folder, **config_kwargs)
    scheme = _scheme(getattr(config, "quantization_config", None), str(folder))
    del config.quantization_config  # transformers would hand the model to gptqmodel / autoawq
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    tensors = dict(_safetensors(folder))
    modules = dict(model.named_modules())
    for prefix in sorted(k.removesuffix(".qweight") for k in tensors if k.endswith(".qweight")):
        owner = modules.get(prefix)
        if not isinstance(owner, nn.Linear):
            raise ValueError(
                f"{folder}: {prefix}.qweight: quantized tensors of a {type(owner).__name__}, not of an nn.Linear"
            )
        model.set_submodule(prefix, _converted(folder, prefix, owner, tensors, scheme, dtype))
    unexpected = [k for k in tensors if not _is_parameter_or_buffer(model, k)]
    if unexpected:
        raise ValueError(f"{folder}: tensors the model has no place for: {unexpected[:5]}")
    _place_dense(model, tensors, dtype)
    _tie_the_head(model)
    _materialise_the_rest(model, f"{folder}'s safetensors")
    return model.eval()


def _converted(
    folder: Any, prefix: str, owner: nn.Linear, tensors: dict, scheme: _Scheme, dtype: torch.dtype
) -> W4A16Linear:
    """``prefix``'s quantized tensors (taken out of ``tensors``) as a W4A16Linear."""
    parts = {p: tensors.pop(f"{prefix}.{p}", None) for p in ("qweight", "qzeros", "scales", "g_idx", "bias")}
    k = owner.in_features
    group = k if scheme.group_size == -1 else scheme.group_size
    if k % group:
        raise ValueError(
            f"{folder}: {prefix}: group_size={group} does not divide its in_features {k} "
            "(GemmW4A16FwdOp reads whole groups along K)"
        )
    missing = [p for p in ("qweight", "qzeros", "scales") if parts[p] is None]
    if missing:
        raise ValueError(f"{folder}: {prefix}: a {scheme.method} linear without {missing}")
    bias = None if parts["bias"] is None else parts["bias"].to(dtype)
    if parts["scales"].dtype not in (torch.float16, torch.float32):  # the op reads these two; bf16 widens exactly
        parts["scales"] = parts["scales"].float()
    try:
        if scheme.method == "gptq":
            g_idx = parts["g_idx"]
            linear = W4A16Linear.from_gptq(
                parts["qweight"], parts["qzeros"], parts["scales"], group, g_idx=g_idx, bias=bias, v1=scheme.v1
            )
        else:
            linear = W4A16Linear.from_awq(parts["qweight"], parts["qzeros"], parts["scales"], group, bias=bias)
    except ValueError as error:
        raise ValueError(f"{folder}: {prefix}: {error}") from error
    if (linear.in_features, linear.out_features) != (k, owner.out_features):
        raise ValueError(
            f"{folder}: {prefix}: the tensors hold a [{linear.out_features}, {linear.in_features}] weight, the "
            f"config's Linear is [{owner.out_features}, {k}]"
        )
    return linear


def _safetensors(folder: str | os.PathLike) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open  # noqa: PLC0415 - installed with transformers

    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for name in files:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{folder}: expected the checkpoint's tensors in {name}, found no such file")
        with safe_open(path, framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield key, f.get_tensor(key)


def _is_parameter_or_buffer(model: nn.Module, name: str) -> bool:
    owner_name, _, attr = name.rpartition(".")
    try:
        owner = model.get_submodule(owner_name)
    except AttributeError:
        return False
    return attr in owner._parameters or attr in owner._buffers


def _tie_the_head(model: nn.Module) -> None:
    """A head tied to the embedding (no tensor of its own in the file) reads its weight."""
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if getattr(config, "tie_word_embeddings", False) and isinstance(head, nn.Linear) and head.weight.is_meta:
        head.weight = embed.weight
