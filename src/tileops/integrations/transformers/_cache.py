"""The KV cache tileops attention reads: a transformers ``Cache`` whose layers hold a
``tileops.serving.PagedKVCache`` each, in the paged layout the attention ops take.

Padding is never cached: sequence b of a batch holds its real tokens only (a left-padded
prompt's pads are dropped at prefill). ``get_seq_length`` still counts every position the
model has seen, pads included, because that is what transformers' masks and ``generate``
count. A decode step appends one row per sequence and the decode op reads the pages in
place: no per-step copy of the cache.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from tileops.serving import PagedKVCache

__all__ = ["TileopsCache", "TileopsCacheLayer"]

PAGE_SIZE = 16
MIN_DECODE_ROOM = 256  # tokens per sequence the first pool holds past its prompt


class TileopsCacheLayer(CacheLayerMixin):
    """One layer's paged K/V. The pool is made at the first append, sized for the prompt
    plus MIN_DECODE_ROOM tokens per sequence, and doubled (one copy) when it runs out."""

    is_compileable = False
    is_sliding = False

    def __init__(self, page_size: int = PAGE_SIZE) -> None:
        super().__init__()
        self.page_size = page_size
        self.paged: PagedKVCache | None = None
        self.seqs: list[int] = []
        self.seen = 0  # positions seen, pads included (transformers' sequence length)
        self._table: torch.Tensor | None = None  # block table, remade when pages change

    # ---- transformers' layer API ------------------------------------------------------

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        raise NotImplementedError(
            "TileopsCache is read by tileops attention only (tileops.integrations.transformers."
            "enable(model)); a model on another attention implementation needs its own cache "
            "(e.g. transformers.DynamicCache)"
        )

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.paged, self.seqs, self.seen, self._table = None, [], 0, None
        self.is_initialized = False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("TileopsCache does not reorder sequences (beam search is not served)")

    # ---- what tileops attention uses ----------------------------------------------------

    def lengths(self, batch: int) -> list[int]:
        """Real tokens cached per sequence (0 for a batch not seen yet)."""
        if self.paged is None:
            return [0] * batch
        if batch != len(self.seqs):
            raise ValueError(f"TileopsCache holds {len(self.seqs)} sequences, got a batch of {batch}")
        return [self.paged.seqlen(s) for s in self.seqs]

    def append(self, k: torch.Tensor, v: torch.Tensor, counts: list[int]) -> None:
        """k, v [sum(counts), H_kv, D]: counts[b] new real tokens of sequence b."""
        if self.paged is None:
            self._make(len(counts), k, max(counts))
        need = sum(max(0, -(-(self.paged.seqlen(s) + n) // self.page_size) - len(self.paged.pages(s)))
                   for s, n in zip(self.seqs, counts))
        if need > self.paged.num_free_pages:
            self._grow(need)
        pages_before = self.paged.num_free_pages
        self.paged.append(self.seqs, k, v, counts=counts)
        if self.paged.num_free_pages != pages_before:
            self._table = None

    def block_table(self) -> torch.Tensor:
        if self._table is None:
            width = max(1, max(len(self.paged.pages(s)) for s in self.seqs))
            self._table = self.paged.block_table(self.seqs, max_pages=width)
        return self._table

    def _make(self, batch: int, k: torch.Tensor, longest: int) -> None:
        # Room for the prompt and MIN_DECODE_ROOM more tokens per sequence before a growth.
        pages = batch * -(-(max(longest, 1) + MIN_DECODE_ROOM) // self.page_size)
        self.paged = PagedKVCache(pages, self.page_size, k.shape[1], k.shape[2], dtype=k.dtype, device=k.device,
                                  max_pages_per_seq=1 << 20)
        self.seqs = [self.paged.add_sequence() for _ in range(batch)]
        self.is_initialized = True

    def _grow(self, need: int) -> None:
        """At least `need` more free pages, doubling the pool (one copy of the pages)."""
        held = self.paged.num_pages - self.paged.num_free_pages
        self.paged.grow(max(2 * self.paged.num_pages, held + need))
        self._table = None


class TileopsCache(Cache):
    """A transformers cache in tileops' paged layout, one ``TileopsCacheLayer`` per decoder
    layer. Pass it as ``past_key_values`` (transformers < 5.40 also takes ``cache=``), or
    let an enabled model make it: ``generate`` and ``forward(use_cache=True)`` do."""

    def __init__(self, config=None, num_layers: int | None = None, page_size: int = PAGE_SIZE) -> None:
        if num_layers is None:
            if config is None:
                raise TypeError("TileopsCache needs config= (the model's) or num_layers=")
            text = config.get_text_config() if hasattr(config, "get_text_config") else config
            num_layers = text.num_hidden_layers
        super().__init__(layers=[TileopsCacheLayer(page_size) for _ in range(num_layers)])
