"""Attention over vLLM's paged KV cache with ``GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp``.

vLLM's CPU platform always picks the backend registered as ``CPU_ATTN``; ``register``
overrides that entry with subclasses of vLLM's CPU backend, so its KV-cache shape, block
sizes and metadata stay vLLM's and a layer tileops cannot serve runs the original.

The cache. vLLM gives each layer a contiguous tensor of ``num_blocks`` blocks, each
``[heads_kv, block_size, 2 * head_size]`` elements, and only the backend reads what is
inside a block. tileops' paged ops take separate K and V pages ``[pages * page_size,
heads_kv, head_size]``. A served layer stores block ``b`` as two such pages, K then V: as
one run of ``2 * num_blocks`` pages, K of block ``b`` is page ``2b`` and V page ``2b + 1``.
So the K pages are that run less its last page, the V pages the same run one page
later: both contiguous views of vLLM's tensor, in which block ``b`` is page ``2b``. The
op appends each request's new keys and values after its cached ones and attends over
both, so one call serves a step of mixed prefill chunks and decodes.
"""

from __future__ import annotations

import torch
from vllm.config import get_current_vllm_config
from vllm.logger import init_logger
from vllm.model_executor.custom_op import get_cached_compilation_config
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.cpu_attn import (
    CPUAttentionBackend,
    CPUAttentionBackendImpl,
    CPUAttentionMetadataBuilder,
)
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

from ... import ops
from . import report

__all__ = ["TileopsAttentionBackend", "register"]

# Under "vllm.": vLLM configures the handlers of its own logger tree only.
logger = init_logger("vllm.tileops")

_DTYPES = (torch.float16, torch.bfloat16)


def _bucket(n: int, cap: int) -> int:
    """max_seqlen_q as the op is built for: the next power of two (few op instances), at
    most what a request's pages hold."""
    return min(1 << max(n - 1, 0).bit_length(), cap)


class TileopsAttentionMetadataBuilder(CPUAttentionMetadataBuilder):
    """vLLM's CPU metadata (a layer tileops does not serve reads it), plus what the op
    takes: int32 query offsets, tokens cached before this step, the block table in pages."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        config = get_cached_compilation_config()
        report.log_once(logger, set(config.enabled_custom_ops) | set(config.disabled_custom_ops))

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False):
        meta = super().build(common_prefix_len, common_attn_metadata, fast_build)
        reqs = common_attn_metadata.num_reqs
        # copies, not views: vLLM reuses its metadata buffers from step to step
        starts = meta.query_start_loc[: reqs + 1].to(torch.int32, copy=True)
        meta.tileops_cu_seqlens_q = starts
        meta.tileops_cache_seqlens = (meta.seq_lens[:reqs] - (starts[1:] - starts[:-1])).to(torch.int32)
        meta.tileops_block_table = (meta.block_table[:reqs] * 2).to(torch.int32)
        return meta


class TileopsAttentionImpl(CPUAttentionBackendImpl):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        config = get_current_vllm_config()
        self._block_size = config.cache_config.block_size
        self._ops: dict[tuple[int, int], object] = {}
        why = self._refusal(config.model_config.dtype)
        self._served = why is None
        if why:
            report.kept("Attention", why)
        else:
            report.served("Attention")

    def _refusal(self, dtype: torch.dtype) -> str | None:
        if self.attn_type != AttentionType.DECODER:
            return f"{self.attn_type} attention"
        if dtype not in _DTYPES:
            return f"{dtype} (the paged ops take float16 | bfloat16)"
        if self.kv_cache_dtype != "auto":
            return f"kv_cache_dtype={self.kv_cache_dtype}"
        if self.alibi_slopes is not None:
            return "ALiBi"
        if self.sinks is not None:
            return "attention sinks"
        size = self._block_size
        if size & (size - 1):
            return f"block_size={size} (tileops' pages are a power of two)"
        return None

    def _op(self, max_seqlen_q: int, width: int):
        op = self._ops.get((max_seqlen_q, width))
        if op is None:
            window = -1 if self.sliding_window in (None, -1) else self.sliding_window - 1
            op = ops.GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp(
                width, self._block_size, max_seqlen_q, True, self.scale, self.logits_soft_cap or None, window
            )
            self._ops[(max_seqlen_q, width)] = op
        return op

    def forward(
        self,
        layer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if not self._served:
            # vLLM does not call do_kv_cache_update for this backend (the op writes the
            # cache itself), so the original's update runs here first.
            if attn_metadata is not None and key is not None:
                super().do_kv_cache_update(layer, key, value, kv_cache, attn_metadata.slot_mapping)
            return super().forward(
                layer, query, key, value, kv_cache, attn_metadata, output, output_scale, output_block_scale
            )
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("tileops attention: fused output quantization is not served")
        if attn_metadata is None:  # vLLM's profiling run
            return output
        if not kv_cache.is_contiguous():
            raise ValueError(f"tileops attention: expected a contiguous KV cache, got strides {kv_cache.stride()}")
        tokens = attn_metadata.num_actual_tokens
        blocks, heads_kv, block_size, _ = kv_cache.shape
        dim = self.head_size
        page = block_size * heads_kv * dim
        rows = (2 * blocks - 1) * block_size
        flat = kv_cache.view(-1)
        k_pages = flat[: rows * heads_kv * dim].view(rows, heads_kv, dim)
        v_pages = flat[page : page + rows * heads_kv * dim].view(rows, heads_kv, dim)
        table = attn_metadata.tileops_block_table
        op = self._op(_bucket(attn_metadata.max_query_len, table.shape[1] * block_size), table.shape[1])
        out = op(
            query[:tokens],
            key[:tokens],
            value[:tokens],
            k_pages,
            v_pages,
            None,
            None,
            attn_metadata.tileops_cu_seqlens_q,
            attn_metadata.tileops_cache_seqlens,
            table,
        )
        output[:tokens].view(out.shape).copy_(out)
        return output


class TileopsAttentionBackend(CPUAttentionBackend):
    # The op writes the new keys and values into the cache itself.
    forward_includes_kv_cache_update: bool = True

    @staticmethod
    def get_impl_cls():
        return TileopsAttentionImpl

    @staticmethod
    def get_builder_cls():
        return TileopsAttentionMetadataBuilder


def register() -> None:
    register_backend(AttentionBackendEnum.CPU_ATTN, f"{__name__}.TileopsAttentionBackend")
