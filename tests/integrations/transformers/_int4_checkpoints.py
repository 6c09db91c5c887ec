"""A writer of GPTQ and AWQ 4-bit checkpoints, from the formats' own description
(../shared/spec/quantized-formats.md, "GPTQ and AWQ int4 checkpoints"), written here apart
from tileops.quant.int4 so that the loader's conversion is checked against an
independent packing.

- GPTQ: ``qweight`` int32 ``[K / 8, N]`` packed along K (value i of each 8 at bits 4i),
  ``qzeros`` int32 ``[K / group, N / 8]`` packed along N, ``scales`` float16
  ``[K / group, N]``, ``g_idx`` int32 ``[K]``; the v1 format stores zero - 1.
- AWQ GEMM: ``qweight`` int32 ``[K, N / 8]`` and ``qzeros`` int32 ``[K / group, N / 8]``,
  both packed along N with value ``[0, 2, 4, 6, 1, 3, 5, 7][i]`` of each 8 at bits 4i;
  true zeros.

A weight is ``(q - zero) * scale``. The quantizer is the formats' round-to-nearest over
each group's range (asymmetric: the range widened to hold 0, spread over 0..15;
symmetric: zero 8 and a scale of ``2 * max|w| / 15``), with the scale rounded to float16
first, as stored, so the weights it returns are exactly the checkpoint's.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
LAYOUTS = {  # name -> (method, symmetric, desc_act: the flag alone, g_idx in K order)
    "gptq-asym": ("gptq", False, False),
    "gptq-sym": ("gptq", True, True),
    "awq": ("awq", False, False),
}


def quantized_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The Linears a GPTQ or AWQ checkpoint quantizes: the decoder layers' (not the head)."""
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and ".layers." in n}


def _round_to_nearest(w: torch.Tensor, group: int, symmetric: bool) -> tuple[torch.Tensor, ...]:
    """``w [N, K]`` -> q ``[N, K]``, scale (float16 values, as float32) and zero ``[N, K / group]``."""
    n, k = w.shape
    x = w.float().reshape(n, k // group, group)
    if symmetric:
        scale = (2 * x.abs().amax(-1) / 15).half().float()
        zero = torch.full_like(scale, 8)
    else:
        lo, hi = x.amin(-1).clamp(max=0), x.amax(-1).clamp(min=0)
        scale = ((hi - lo) / 15).half().float()
        zero = torch.round(-lo / scale).clamp(0, 15)
    q = (torch.round(x / scale[..., None]) + zero[..., None]).clamp(0, 15)
    return q.reshape(n, k).long(), scale, zero.long()


def _pack(values: torch.Tensor, dim: int, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """4-bit ``values``, 8 to an int32 along ``dim``: bits 4i..4i+3 of a word hold value
    ``order[i]`` of its 8."""
    v = values.movedim(dim, -1)
    v = v.reshape(*v.shape[:-1], -1, 8)
    words = torch.zeros(v.shape[:-1], dtype=torch.int64)
    for slot, which in enumerate(order):
        words |= v[..., which] << (4 * slot)
    words = torch.where(words >= 2**31, words - 2**32, words)  # the 32 bits as a signed int32
    return words.to(torch.int32).movedim(-1, dim).contiguous()


def _linear_tensors(w: torch.Tensor, method: str, symmetric: bool, group: int) -> tuple[dict, torch.Tensor]:
    """One Linear's checkpoint tensors and the weights they hold (float32 ``[N, K]``)."""
    q, scale, zero = _round_to_nearest(w, group, symmetric)
    n, k = w.shape
    weights = ((q.reshape(n, k // group, group) - zero[..., None]) * scale[..., None]).reshape(n, k)
    scales = scale.t().contiguous().half()  # [K / group, N]
    if method == "awq":
        return {
            "qweight": _pack(q.t(), 1, AWQ_ORDER),
            "qzeros": _pack(zero.t(), 1, AWQ_ORDER),
            "scales": scales,
        }, weights
    assert int(zero.min()) >= 1, "GPTQ v1 stores zero - 1: a zero point of 0 has no code"
    return {
        "qweight": _pack(q.t(), 0),
        "qzeros": _pack(zero.t() - 1, 1),
        "scales": scales,
        "g_idx": (torch.arange(k) // group).to(torch.int32),
    }, weights


def write_checkpoint(model: nn.Module, folder: Path, layout: str, group_size: int) -> dict[str, torch.Tensor]:
    """Writes ``model`` as a ``layout`` checkpoint (LAYOUTS; group_size -1: one group per
    row) in ``folder``: config.json with its quantization_config, model.safetensors.
    Returns each quantized Linear's weights as the checkpoint holds them, by module name."""
    method, symmetric, desc_act = LAYOUTS[layout]
    folder.mkdir(parents=True, exist_ok=True)
    linears = quantized_linears(model)
    tensors, weights = {}, {}
    for name, linear in linears.items():
        group = linear.in_features if group_size == -1 else group_size
        parts, weights[name] = _linear_tensors(linear.weight.detach(), method, symmetric, group)
        tensors.update({f"{name}.{p}": t for p, t in parts.items()})
    tied = model.config.tie_word_embeddings
    for name, t in model.state_dict().items():
        owner = name.rpartition(".")[0]
        if owner not in linears and not (tied and name == "lm_head.weight"):
            tensors[name] = t.detach().contiguous().clone()
    save_file(tensors, folder / "model.safetensors")
    model.config.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    if method == "gptq":
        quantization = {"desc_act": desc_act, "sym": symmetric, "checkpoint_format": "gptq"}
    else:
        quantization = {"zero_point": True, "version": "gemm"}
    config["quantization_config"] = {"quant_method": method, "bits": 4, "group_size": group_size, **quantization}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return weights


def edit_checkpoint(folder: Path, into: Path, quantization: dict | None = None, tensors: dict | None = None) -> Path:
    """A copy of the checkpoint in ``folder`` at ``into``, with ``quantization`` merged into
    its quantization_config and ``tensors`` replacing its tensors of those names."""
    from safetensors.torch import load_file  # noqa: PLC0415

    into.mkdir(parents=True, exist_ok=True)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"].update(quantization or {})
    (into / "config.json").write_text(json.dumps(config))
    save_file({**load_file(folder / "model.safetensors"), **(tensors or {})}, into / "model.safetensors")
    return into
