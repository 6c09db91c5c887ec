"""vLLM's unquantized linear layers and LM head on ``GemmFwdOp``.

A linear layer's math is its ``quant_method``; an unquantized layer makes vLLM's
``UnquantizedLinearMethod`` by the name its module holds, and the LM head (through the
logits processor) calls ``UnquantizedEmbeddingMethod.apply``. ``register`` rebinds both
names to subclasses whose ``apply`` runs ``GemmFwdOp`` (x @ Wᵀ, then the bias) on the
weight as loaded: vLLM's CPU path would repack it for oneDNN after loading, which is
skipped for a served layer. Quantized methods are vLLM's own and untouched.
"""

from __future__ import annotations

import torch
import vllm.model_executor.layers.linear as vllm_linear
import vllm.model_executor.layers.vocab_parallel_embedding as vllm_embedding

from ... import ops
from . import report

__all__ = ["register"]

_DTYPES = (torch.float16, torch.bfloat16)


def _refusal(weight: torch.Tensor) -> str | None:
    if weight.is_meta:
        return "weight not materialised"
    if weight.ndim != 2:
        return f"{weight.ndim}-D weight"
    if weight.dtype not in _DTYPES:
        return f"{weight.dtype} (GemmFwdOp takes float16 | bfloat16)"
    return None


def _linear(gemm, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = gemm(x.reshape(-1, x.shape[-1]), weight)
    if bias is not None:
        y = y + bias
    return y.view(*x.shape[:-1], weight.shape[0])


class _Served:
    """The shared half: decide after loading, then run GemmFwdOp or the original."""

    _vllm_name: str
    _gemm = None

    def _serves(self, layer: torch.nn.Module) -> bool:
        return True

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if not self._serves(layer):
            super().process_weights_after_loading(layer)
            return
        why = _refusal(layer.weight)
        if why:
            report.kept(self._vllm_name, why)
            super().process_weights_after_loading(layer)
            return
        self._gemm = ops.GemmFwdOp(False, True)
        report.served(self._vllm_name)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self._gemm is None:
            return super().apply(layer, x, bias)
        # .data: vLLM's weights are Parameter subclasses, which the op would route through
        # its custom op (the tracer's path, for tensor subclasses); the values are the same
        return _linear(self._gemm, x, layer.weight.data, bias)


class TileopsLinearMethod(_Served, vllm_linear.UnquantizedLinearMethod):
    _vllm_name = "UnquantizedLinearMethod"


class TileopsEmbeddingMethod(_Served, vllm_embedding.UnquantizedEmbeddingMethod):
    """The LM head's product (``apply``); the embedding lookup stays vLLM's."""

    _vllm_name = "LM head"

    def _serves(self, layer: torch.nn.Module) -> bool:
        return isinstance(layer, vllm_embedding.ParallelLMHead)


def register() -> None:
    vllm_linear.UnquantizedLinearMethod = TileopsLinearMethod
    vllm_embedding.UnquantizedEmbeddingMethod = TileopsEmbeddingMethod
