"""Hugging Face transformers models on tileops ops (docs/transformers.md).

    import torch
    from tileops.integrations.transformers import AutoModelForCausalLM, enable, disable

    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16)  # load + enable
    print(model.tileops_report)
    model.generate(**inputs)
    disable(model)                                # exactly the model transformers loaded

``enable(model, target=None, strict=True)`` patches one model instance: every
``nn.Linear`` runs ``GemmFwdOp``, RMSNorms ``RMSNormFwdOp`` (Gemma's ``1 + w`` folded), the
gated MLP ``SiluAndMulFwdOp`` / ``GeluTanhAndMulFwdOp``, RoPE the position-id RoPE ops,
attention the packed prefill and paged decode ops over a ``TileopsCache``, registered
with transformers' ``AttentionInterface`` and ``AttentionMaskInterface`` as ``"tileops"``,
and MoE blocks (Qwen3-MoE) the router ``FusedTopKOp`` and the experts ``FusedMoeFwdOp``,
registered with ``ExpertsInterface`` as ``"tileops"``.
What cannot be served exactly raises ``UnsupportedModelError`` (or, with
``strict=False``, stays on torch and is listed in the report).

Importing this module imports transformers; ``import tileops`` never does.

Layout: ``planning/`` decides what is served and applies it (``enable``, ``disable``, the
typed state each served module keeps); ``fused/`` holds the served forwards and the fused
paths (stacked projections, fused layers, the base model as one loop); ``decode/`` replays
decode steps from a captured graph and runs greedy search in C++; ``attention.py``,
``moe.py`` and ``cache.py`` are what transformers' interfaces call (attention, experts,
the KV cache); ``compat.py`` what differs between transformers releases. Only the names
in ``__all__`` are public.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from .attention import NAME as ATTENTION_NAME
from .cache import TileopsCache, TileopsCacheLayer
from .gguf import GgufEmbedding, GgufLinear, load_gguf
from .int4 import W4A16Linear, load_int4
from .planning.enable import disable, enable
from .planning.model import SUPPORTED_ARCHITECTURES
from .planning.report import EnableReport, UnsupportedModelError

__all__ = [
    "ATTENTION_NAME",
    "AutoModelForCausalLM",
    "EnableReport",
    "GgufEmbedding",
    "GgufLinear",
    "SUPPORTED_ARCHITECTURES",
    "TileopsCache",
    "TileopsCacheLayer",
    "UnsupportedModelError",
    "W4A16Linear",
    "disable",
    "enable",
    "load_gguf",
    "load_int4",
]


class AutoModelForCausalLM:
    """``transformers.AutoModelForCausalLM`` that enables tileops on what it loads.

    ``from_pretrained(path, *, target=None, strict=True, **kwargs)`` loads with
    transformers (``kwargs`` go to it; pass ``torch_dtype=torch.bfloat16``), puts the model
    in eval mode, enables it (``enable``'s ``target``, ``strict``, ``weights``) and keeps
    the report as ``model.tileops_report``.

    With ``gguf_file=``, the GGUF checkpoint's quantized matrices stay in their GGML blocks
    (``load_gguf``: ``GgufLinear`` and ``GgufEmbedding``, served by ``GemmGgufFwdOp`` and
    ``EmbeddingGgufFwdOp``) and the rest is in ``dtype`` (default bfloat16: the activations'
    dtype); ``dequantize=True`` loads it as transformers does, every tensor dequantized.

    A folder whose config.json has a GPTQ or AWQ ``quantization_config`` loads with
    ``load_int4`` (each quantized Linear a ``W4A16Linear``, served by ``GemmW4A16FwdOp``; the
    rest in ``dtype``, default bfloat16), without the gptqmodel or autoawq packages that
    transformers would ask for."""

    def __init__(self) -> None:
        raise TypeError("use AutoModelForCausalLM.from_pretrained(path, ...) or .from_config(config, ...)")

    @classmethod
    def from_pretrained(
        cls,
        path: Any,
        *args: Any,
        target: str | None = None,
        strict: bool = True,
        weights: str | None = None,
        dequantize: bool = False,
        **kwargs: Any,
    ):
        import transformers  # noqa: PLC0415

        gguf_file = kwargs.get("gguf_file")
        if not dequantize and (gguf_file is not None or _int4_checkpoint(path)):
            if args:
                raise TypeError(
                    "from_pretrained(path, ...) of a GGUF file or a GPTQ/AWQ checkpoint takes keyword arguments only, "
                    f"got {args!r}"
                )
            dtype = kwargs.pop("dtype", None) or kwargs.pop("torch_dtype", None)
            dtype = torch.bfloat16 if dtype in (None, "auto") else dtype
            if gguf_file is not None:
                kwargs.pop("gguf_file")
                return _enabled(load_gguf(path, gguf_file, dtype=dtype, **kwargs), target, strict, weights)
            return _enabled(load_int4(path, dtype=dtype, **kwargs), target, strict, weights)
        model = transformers.AutoModelForCausalLM.from_pretrained(path, *args, **kwargs)
        return _enabled(model, target, strict, weights)

    @classmethod
    def from_config(
        cls, config: Any, *, target: str | None = None, strict: bool = True, weights: str | None = None, **kwargs: Any
    ):
        import transformers  # noqa: PLC0415

        return _enabled(transformers.AutoModelForCausalLM.from_config(config, **kwargs), target, strict, weights)


def _int4_checkpoint(path: Any) -> bool:
    """Whether ``path`` is a local folder whose config.json names GPTQ or AWQ."""
    config = os.path.join(path, "config.json") if isinstance(path, (str, os.PathLike)) else ""
    if not os.path.isfile(config):
        return False
    with open(config) as f:
        quantization = json.load(f).get("quantization_config")
    return isinstance(quantization, dict) and str(quantization.get("quant_method", "")).lower() in ("gptq", "awq")


def _enabled(model: Any, target: str | None, strict: bool, weights: str | None) -> Any:
    model.eval()
    model.tileops_report = enable(model, target=target, strict=strict, weights=weights)
    return model
