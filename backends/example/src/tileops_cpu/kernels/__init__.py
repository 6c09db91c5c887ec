"""The kernels of target ``torch_cpu``, in plain PyTorch, one module per op family.

A kernel is an object built once per device and input signature and then called many
times. Its constructor takes compile-time values only: the things a real backend would
bake into generated code (dtype, a hidden size, a layout, head counts, RoPE frequencies).
Everything that changes from call to call — the row count of an RMSNorm, M of a GEMM, the
tokens of a decode step, offsets and page tables — is read from the tensors in
``__call__``. ``CpuRMSNorm`` therefore never sees a row count: on a decode path the batch
grows step by step, and a constructor that took it would rebuild at every step.

Kernels compute values, not autograd graphs: the op layer has no backward, so every
``__call__`` runs under ``torch.no_grad()`` (a compiled kernel records nothing either).
Half-precision inputs are computed in float32 and rounded once, as the references are.

On real hardware this is the package to replace: compile in ``__init__``, launch on the
current stream in ``__call__``.
"""

from __future__ import annotations

from .attention import CpuPagedPrefillAttention, CpuVarlenAttention
from .elementwise import CpuAdd, CpuGatedActivation
from .gemm import CpuGemm, CpuGemv
from .moe import CpuFusedMoe, CpuFusedTopK, route_tokens
from .norm import CpuFusedAddRMSNorm, CpuRMSNorm
from .rope import (
    CpuRopePositionIds,
    llama31_frequencies,
    longrope_factor,
    longrope_frequencies,
    plain_frequencies,
)

__all__ = [
    "CpuAdd",
    "CpuFusedAddRMSNorm",
    "CpuFusedMoe",
    "CpuFusedTopK",
    "CpuGatedActivation",
    "CpuGemm",
    "CpuGemv",
    "CpuPagedPrefillAttention",
    "CpuRMSNorm",
    "CpuRopePositionIds",
    "CpuVarlenAttention",
    "llama31_frequencies",
    "longrope_factor",
    "longrope_frequencies",
    "plain_frequencies",
    "route_tokens",
]
