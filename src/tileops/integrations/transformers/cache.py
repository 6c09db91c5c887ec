"""The KV cache tileops attention reads: a transformers ``Cache`` over one
``tileops.serving.PagedKVCache`` with a K and a V pool per decoder layer, in the paged
layout the attention ops take.

Every layer holds the same positions of the same sequences, so the page table (which
pages a sequence holds, how many tokens) is one for the whole model, and so are the
tensors the attention op reads beside the pools: a forward's first attention layer
reserves the pages of the new tokens and makes the lengths, offsets and block table
(``Step``); every other layer reuses them. The attention op
(``GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp``) writes each layer's new keys and
values into that layer's pools itself and reads the cache in place: a decode step copies
nothing and does its bookkeeping once, not once per layer.

Padding is never cached: sequence b holds its real tokens only (a left-padded prompt's
pads are dropped at prefill). ``get_seq_length`` still counts every position the model
has seen, pads included, because that is what transformers' masks and ``generate`` count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from tileops.serving import PagedKVCache

__all__ = ["TileopsCache", "TileopsCacheLayer", "Step", "new_token_counts"]

PAGE_SIZE = 16
MIN_DECODE_ROOM = 256  # tokens per sequence the first pool holds past its prompt
MIN_TABLE_WIDTH = 16  # block table columns (pages per sequence), doubled as sequences grow
I32 = torch.int32


@dataclass(frozen=True)
class Step:
    """What one forward adds, for every layer: ``counts[b]`` new real tokens of sequence b
    after its ``cached[b]``; the int32 tensors the paged attention op reads."""

    q_len: int  # positions of this forward per sequence, pads included
    counts: tuple[int, ...]
    cached: tuple[int, ...]
    cu_seqlens_q: torch.Tensor  # [B + 1] over the packed real tokens
    cache_seqlens: torch.Tensor  # [B]: cached before this forward
    block_table: torch.Tensor  # [B, width]

    @property
    def width(self) -> int:
        return int(self.block_table.shape[1])


class TileopsCacheLayer(CacheLayerMixin):
    """One decoder layer's view of a ``TileopsCache``: the positions it has seen. Its
    tokens live in the shared ``PagedKVCache`` (``cache.paged.layer(index)``)."""

    is_compileable = False
    is_sliding = False

    def __init__(self, cache: TileopsCache, index: int) -> None:
        super().__init__()
        self.cache, self.index = cache, index
        self.seen = 0  # positions seen, pads included (transformers' sequence length)

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
        self.cache.reset()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("TileopsCache does not reorder sequences (beam search is not served)")

    # ---- what tileops attention uses ----------------------------------------------------

    def pools(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's (k_pages, v_pages)."""
        return self.cache.paged.layer(self.index)


class TileopsCache(Cache):
    """A transformers cache in tileops' paged layout, one ``TileopsCacheLayer`` per decoder
    layer over one page table. Pass it as ``past_key_values`` (transformers < 5.40 also
    takes ``cache=``), or let an enabled model make it: ``generate`` and
    ``forward(use_cache=True)`` do.

    The pool is made at the first forward, sized for the prompt plus MIN_DECODE_ROOM tokens
    per sequence, and doubled (one copy of every layer's pools) when it runs out."""

    def __init__(self, config=None, num_layers: int | None = None, page_size: int = PAGE_SIZE) -> None:
        if num_layers is None:
            if config is None:
                raise TypeError("TileopsCache needs config= (the model's) or num_layers=")
            text = config.get_text_config() if hasattr(config, "get_text_config") else config
            num_layers = text.num_hidden_layers
        super().__init__(layers=[TileopsCacheLayer(self, i) for i in range(num_layers)])
        self.page_size = page_size
        self.paged: PagedKVCache | None = None
        self.seqs: list[int] = []
        self.seen = 0  # positions the page table holds, pads included
        self.step: Step | None = None  # the forward in progress (or the last one)
        self.reserved_ahead = False  # pages reserved since the last step: its block table is stale

    def reset(self) -> None:
        self.paged, self.seqs, self.seen, self.step, self.reserved_ahead = None, [], 0, None, False
        for layer in self.layers:
            layer.seen = 0
            layer.is_initialized = False

    def lengths(self, batch: int) -> list[int]:
        """Real tokens cached per sequence (0s for a batch not seen yet)."""
        if self.paged is None:
            return [0] * batch
        if batch != len(self.seqs):
            raise ValueError(f"TileopsCache holds {len(self.seqs)} sequences, got a batch of {batch}")
        return [self.paged.seqlen(s) for s in self.seqs]

    def step_for(
        self, layer: TileopsCacheLayer, q_len: int, attention_mask: torch.Tensor | None, k: torch.Tensor
    ) -> Step:
        """The step of ``layer``'s forward: begun by the first layer to arrive (pages
        reserved, lengths advanced, tensors made), reused by the others."""
        batch = k.shape[0]
        if layer.seen == self.seen:  # the first layer of a new forward
            self._start(batch, q_len, attention_mask, k)
        elif (
            self.step is None
            or layer.seen + q_len != self.seen
            or self.step.q_len != q_len
            or len(self.step.counts) != batch
        ):
            raise RuntimeError(
                f"TileopsCache: layer {layer.index} has seen {layer.seen} positions and got {q_len} more, "
                f"but the cache's forward covers positions up to {self.seen}: every layer must run every "
                "forward, in order (a fresh cache per generation)"
            )
        layer.seen += q_len
        layer.is_initialized = True
        return self.step

    def begin_forward(self, batch: int, q_len: int, attention_mask: torch.Tensor | None) -> Step:
        """The step of a forward on a cache that holds a forward already, begun before its
        layers run (a replayed decode step, ``decode/replay.py``); then ``layers_ran``."""
        if self.paged is None:
            raise RuntimeError("TileopsCache.begin_forward: the cache's first forward makes its pools (step_for)")
        return self._start(batch, q_len, attention_mask, None)

    def layers_ran(self, q_len: int) -> None:
        """Every layer has run the forward ``begin_forward`` began."""
        for layer in self.layers:
            layer.seen += q_len
            layer.is_initialized = True

    def reserve_ahead(self, tokens: int) -> None:
        """Reserves the pages of each sequence's next ``tokens`` tokens now (growing the pool
        if it must), so that the next step's block table holds them all: decode steps
        replayed from C++ (``decode/generate.py``) read the table their graph captured."""
        if self.paged is None:
            raise RuntimeError("TileopsCache.reserve_ahead: the cache's first forward makes its pools (step_for)")
        counts = [tokens] * len(self.seqs)
        self._room(counts)
        self.reserved_ahead = self.paged.reserve(self.seqs, counts) or self.reserved_ahead

    def replayed(self, steps: int) -> None:
        """``steps`` more decode steps ran after the last one without ``begin_forward``:
        ``tileops.capture.decode_greedy`` moved the step's lengths tensor on by one each, in
        the pages ``reserve_ahead`` reserved."""
        if steps <= 0:
            return
        step = self.step
        self.paged.advance(self.seqs, [steps] * len(self.seqs))
        self.step = Step(
            step.q_len,
            step.counts,
            tuple(c + steps for c in step.cached),
            step.cu_seqlens_q,
            step.cache_seqlens,
            step.block_table,
        )
        self.seen += steps
        for layer in self.layers:
            layer.seen += steps

    def _start(self, batch: int, q_len: int, attention_mask: torch.Tensor | None, k: torch.Tensor | None) -> Step:
        cached = self.lengths(batch)
        counts = new_token_counts(attention_mask, batch, q_len, cached)
        self.step = self._begin(q_len, counts, cached, k)
        self.seen += q_len
        return self.step

    def _begin(self, q_len: int, counts: list[int], cached: list[int], k: torch.Tensor | None) -> Step:
        if self.paged is None:
            self._make(len(counts), k, max(counts))
        device = self.paged.device
        self._room(counts)
        changed = self.paged.reserve(self.seqs, counts) or self.reserved_ahead
        self.reserved_ahead = False
        self.paged.advance(self.seqs, counts)
        # A step of the batch before reuses its tensors, updated in place where they change:
        # a replayed decode step reads the ones its graph captured.
        last = self.step if self.step is not None and len(self.step.counts) == len(self.seqs) else None
        same_chunks = last is not None and last.counts == tuple(counts)
        cu = last.cu_seqlens_q if same_chunks else PagedKVCache.cu_seqlens(counts, device)
        if same_chunks and not changed:
            table = last.block_table  # the same pages
        else:
            widest = max(len(self.paged.pages(s)) for s in self.seqs)
            width = MIN_TABLE_WIDTH
            while width < widest:
                width *= 2
            table = self.paged.block_table(self.seqs, max_pages=width)
            if last is not None and last.block_table.shape == table.shape:
                table = last.block_table.copy_(table)
        lengths = torch.tensor(cached, dtype=I32, device=device)
        if last is not None:
            lengths = last.cache_seqlens.copy_(lengths)
        return Step(q_len, tuple(counts), tuple(cached), cu, lengths, table)

    def _room(self, counts: list[int]) -> None:
        """Grows the pool (doubling it at least) where the sequences' next ``counts`` tokens
        need more pages than are free."""
        need = self.paged.pages_needed(self.seqs, counts)
        if need > self.paged.num_free_pages:
            held = self.paged.num_pages - self.paged.num_free_pages
            self.paged.grow(max(2 * self.paged.num_pages, held + need))

    def _make(self, batch: int, k: torch.Tensor, longest: int) -> None:
        # Room for the prompt and MIN_DECODE_ROOM more tokens per sequence before a growth.
        pages = batch * -(-(max(longest, 1) + MIN_DECODE_ROOM) // self.page_size)
        self.paged = PagedKVCache(
            pages,
            self.page_size,
            k.shape[2],
            k.shape[3],
            dtype=k.dtype,
            device=k.device,
            max_pages_per_seq=1 << 20,
            num_layers=len(self.layers),
        )
        self.seqs = [self.paged.add_sequence() for _ in range(batch)]


def new_token_counts(attention_mask: torch.Tensor | None, batch: int, q_len: int, cached: list[int]) -> list[int]:
    """Real new tokens per request from the 2-D padding mask: they must be the last ones
    of the chunk (left padding), and a request that has cached tokens gets no pads."""
    if attention_mask is None:
        return [q_len] * batch
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.ndim != 2:
        raise ValueError(
            "tileops attention takes the 2-D padding mask [batch, kv_len] that its mask function "
            "(AttentionMaskInterface 'tileops') makes, got "
            f"{getattr(attention_mask, 'shape', type(attention_mask).__name__)}: a custom 4-D mask is not served"
        )
    new = attention_mask[:, -q_len:].to(torch.bool)
    counts = new.sum(dim=1)
    left_padded = torch.arange(q_len, device=new.device)[None, :] >= (q_len - counts)[:, None]
    counts = counts.tolist()
    if not bool(torch.equal(new, left_padded)) or any(c and n != q_len for c, n in zip(cached, counts)):
        raise ValueError(
            "tileops attention serves left padding only: each row of attention_mask must be 0s then 1s "
            "(pass padding_side='left' to the tokenizer)"
        )
    return counts
