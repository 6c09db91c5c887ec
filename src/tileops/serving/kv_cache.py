"""A paged KV cache: the page pool, per-sequence block tables and lengths, in the layout
the paged attention ops read (README.md, "Paged KV cache").

K and V are one flat tensor each, ``[num_pages * page_size, heads_kv, head_dim]``; page p
is rows ``p * page_size`` to ``p * page_size + page_size - 1``. A cache for a whole model
(``num_layers > 1``) keeps one such pair per layer, all sharing the one page table: every
layer holds the same positions of the same sequences, so one block table and one length
vector serve every layer's attention. Logical position t of a
sequence whose block table row is ``bt`` lives at row
``bt[t // page_size] * page_size + t % page_size``. Block tables are int32
``[B, max_pages]`` (unused entries 0, so every entry is a valid page) and sequence lengths
int32 ``[B]``.

Bookkeeping (which pages a sequence holds, its length, the free list) lives in Python;
only ``append`` and ``gather`` touch tensor data. Not thread-safe: one scheduler owns it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .host_memory import huge_page_empty, huge_pages_available

__all__ = ["PagedKVCache"]


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"PagedKVCache: {name} must be a positive int, got {value!r}")
    return value


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"PagedKVCache: {name} must be an int >= 0, got {value!r}")
    return value


class PagedKVCache:
    """A pool of ``num_pages`` pages of ``page_size`` tokens for K and V.

    >>> cache = PagedKVCache(num_pages=8, page_size=16, heads_kv=2, head_dim=64)
    >>> a, b = cache.add_sequence(), cache.add_sequence()
    >>> k = torch.randn(5 + 20, 2, 64, dtype=torch.bfloat16)
    >>> cache.append([a, b], k, k.clone(), counts=[5, 20])   # 5 tokens of a, then 20 of b
    >>> cache.block_table([a, b]).shape, cache.seqlens([a, b]).tolist()
    (torch.Size([2, 8]), [5, 20])
    """

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        heads_kv: int,
        head_dim: int,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
        max_pages_per_seq: int | None = None,
        num_layers: int = 1,
        huge_pages: bool = False,
    ) -> None:
        self.num_pages = _positive_int("num_pages", num_pages)
        self.page_size = _positive_int("page_size", page_size)
        self.heads_kv = _positive_int("heads_kv", heads_kv)
        self.head_dim = _positive_int("head_dim", head_dim)
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"PagedKVCache: dtype must be a torch.dtype, got {dtype!r}")
        self.max_pages_per_seq = (
            self.num_pages if max_pages_per_seq is None else _positive_int("max_pages_per_seq", max_pages_per_seq)
        )
        self.num_layers = _positive_int("num_layers", num_layers)
        # pools on huge pages (tileops.serving.host_memory) where asked, on the CPU, and offered
        self.huge_pages = bool(huge_pages) and torch.device(device).type == "cpu" and huge_pages_available()
        shape = (self.num_pages * self.page_size, self.heads_kv, self.head_dim)
        # k_layers[i] / v_layers[i]: layer i's pools (k_pages / v_pages are layer 0's)
        self.k_layers = [self._pool(shape, dtype, device) for _ in range(self.num_layers)]
        self.v_layers = [self._pool(shape, dtype, device) for _ in range(self.num_layers)]
        # Pages are handed out lowest first; a freed page is the next one handed out.
        self._free: list[int] = list(range(self.num_pages - 1, -1, -1))
        self._pages: dict[int, list[int]] = {}
        self._lengths: dict[int, int] = {}
        self._next_id = 0

    # ---- what the cache holds -------------------------------------------------------

    @property
    def k_pages(self) -> torch.Tensor:
        """Layer 0's K pool (the pool, for a one-layer cache)."""
        return self.k_layers[0]

    @property
    def v_pages(self) -> torch.Tensor:
        """Layer 0's V pool."""
        return self.v_layers[0]

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k_pages, v_pages)`` of layer ``index``."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.num_layers:
            raise IndexError(f"PagedKVCache: layer must be an int in [0, {self.num_layers}), got {index!r}")
        return self.k_layers[index], self.v_layers[index]

    @property
    def dtype(self) -> torch.dtype:
        return self.k_pages.dtype

    @property
    def device(self) -> torch.device:
        return self.k_pages.device

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    @property
    def max_seqlen(self) -> int:
        """The most tokens one sequence can hold (max_pages_per_seq * page_size)."""
        return self.max_pages_per_seq * self.page_size

    @property
    def sequences(self) -> tuple[int, ...]:
        """The live sequence ids, oldest first."""
        return tuple(self._pages)

    def seqlen(self, seq_id: int) -> int:
        """How many tokens sequence ``seq_id`` holds."""
        return self._lengths[self._known(seq_id)]

    def pages(self, seq_id: int) -> tuple[int, ...]:
        """The physical pages of ``seq_id``, in logical order (its block table row)."""
        return tuple(self._pages[self._known(seq_id)])

    # ---- sequences and pages --------------------------------------------------------

    def add_sequence(self) -> int:
        """A new, empty sequence; returns its id (ids are never reused)."""
        seq_id = self._next_id
        self._next_id += 1
        self._pages[seq_id] = []
        self._lengths[seq_id] = 0
        return seq_id

    def free(self, seq_id: int) -> None:
        """Forgets ``seq_id``; its pages go back to the free list (their data stays)."""
        self._known(seq_id)
        self._free.extend(reversed(self._pages.pop(seq_id)))
        del self._lengths[seq_id]

    def reserve(self, seq_ids: int | Sequence[int], counts: int | Sequence[int] | torch.Tensor) -> bool:
        """Allocates the pages the next ``counts[i]`` tokens of ``seq_ids[i]`` need (none if
        the last page has room); one sequence and one count may be plain ints. All or
        nothing: raises ValueError past ``max_pages_per_seq`` and RuntimeError when the pool
        has too few free pages. Returns whether any page was allocated (block tables
        change only then)."""
        free_before = len(self._free)
        self._reserve_all(self._wanted("reserve", seq_ids, counts))
        return len(self._free) != free_before

    def pages_needed(self, seq_ids: int | Sequence[int], counts: int | Sequence[int] | torch.Tensor) -> int:
        """How many free pages ``reserve(seq_ids, counts)`` would take (none is taken here);
        raises ValueError past ``max_pages_per_seq`` as reserve does."""
        return sum(self._pages_needed(s, n) for s, n in self._wanted("pages_needed", seq_ids, counts).items())

    def advance(self, seq_ids: int | Sequence[int], counts: Sequence[int] | torch.Tensor) -> None:
        """Records that ``counts[i]`` more tokens of ``seq_ids[i]`` were written into its
        reserved pages by someone else (paged prefill appends its chunk itself): reserve,
        run the op with the old ``seqlens``, then advance."""
        wanted = self._wanted("advance", seq_ids, counts)
        for seq_id, n in wanted.items():
            room = len(self._pages[seq_id]) * self.page_size - self._lengths[seq_id]
            if n > room:
                raise ValueError(
                    f"PagedKVCache.advance: sequence {seq_id} has room for {room} more tokens in its "
                    f"reserved pages, got {n} (reserve them first)"
                )
        for seq_id, n in wanted.items():
            self._lengths[seq_id] += n

    def _wanted(self, method: str, seq_ids: Any, counts: Any) -> dict[int, int]:
        """{sequence: token count} from a method's (seq_ids, counts): one sequence and one
        count may be plain ints; the sequences must be live and distinct."""
        ids = self._ids(seq_ids)
        per_seq = (
            [_count("n_tokens", counts)]
            if isinstance(counts, int)
            else [_count("counts[i]", c) for c in _as_list(counts)]
        )
        if len(per_seq) != len(ids):
            raise ValueError(f"PagedKVCache.{method}: {len(ids)} sequences but {len(per_seq)} counts")
        if len(set(ids)) != len(ids):
            raise ValueError(f"PagedKVCache.{method}: seq_ids must be distinct, got {ids}")
        return dict(zip(ids, per_seq))

    def grow(self, num_pages: int) -> None:
        """Enlarges the pool to ``num_pages`` pages (one copy of every layer's K and V). Page ids, block
        tables and lengths stay valid; the new pages join the free list after the old, their
        contents unspecified (no op reads a position before it is written)."""
        num_pages = _positive_int("num_pages", num_pages)
        if num_pages < self.num_pages:
            raise ValueError(f"PagedKVCache.grow: {num_pages} pages is fewer than the {self.num_pages} held")
        shape = (num_pages * self.page_size, self.heads_kv, self.head_dim)
        for pools in (self.k_layers, self.v_layers):
            for i, old in enumerate(pools):
                new = self._pool(shape, old.dtype, old.device)
                new[: old.shape[0]].copy_(old)
                pools[i] = new
        # Handed out lowest first: the old free pages, then the new ones.
        self._free = list(range(num_pages - 1, self.num_pages - 1, -1)) + self._free
        self.num_pages = num_pages

    def _pool(self, shape: tuple[int, ...], dtype: torch.dtype, device: Any) -> torch.Tensor:
        if self.huge_pages:  # fresh anonymous memory: zeros, as torch.zeros gives
            return huge_page_empty(shape, dtype)
        return torch.zeros(shape, dtype=dtype, device=device)

    def _pages_needed(self, seq_id: int, n_tokens: int) -> int:
        total = -(-(self._lengths[seq_id] + n_tokens) // self.page_size)
        if total > self.max_pages_per_seq:
            raise ValueError(
                f"PagedKVCache: sequence {seq_id} would hold {self._lengths[seq_id] + n_tokens} "
                f"tokens ({self._lengths[seq_id]} + {n_tokens}), more than max_pages_per_seq="
                f"{self.max_pages_per_seq} pages of {self.page_size} ({self.max_seqlen} tokens)"
            )
        return max(0, total - len(self._pages[seq_id]))

    def _reserve_all(self, wanted: dict[int, int]) -> None:
        needed = {s: self._pages_needed(s, n) for s, n in wanted.items()}
        total = sum(needed.values())
        if total > len(self._free):
            raise RuntimeError(
                f"PagedKVCache: the pool is exhausted: {total} more pages needed, "
                f"{len(self._free)} of {self.num_pages} free (free finished sequences, "
                "or make the cache with more pages)"
            )
        for seq_id, n in needed.items():
            self._pages[seq_id].extend(self._free.pop() for _ in range(n))

    # ---- tokens ---------------------------------------------------------------------

    def append(
        self,
        seq_ids: int | Sequence[int],
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        counts: Sequence[int] | torch.Tensor | None = None,
        cu_seqlens: Sequence[int] | torch.Tensor | None = None,
    ) -> None:
        """Writes new tokens at each sequence's next positions and advances its length.

        ``k`` and ``v`` are ``[total_new, heads_kv, head_dim]`` (``[num_layers, total_new,
        heads_kv, head_dim]`` for a cache of several layers: the new tokens of every layer),
        packed in the order of ``seq_ids``: ``counts[i]`` tokens of ``seq_ids[i]`` (or rows
        ``cu_seqlens[i]`` to ``cu_seqlens[i + 1] - 1``). With one sequence and neither
        given, all rows are its. Pages are reserved first, for all sequences at once;
        nothing is written or allocated when any check fails.
        """
        ids = self._ids(seq_ids)
        if len(set(ids)) != len(ids):
            raise ValueError(f"PagedKVCache.append: seq_ids must be distinct, got {ids}")
        self._check_tokens("k", k)
        self._check_tokens("v", v)
        if v.shape != k.shape:
            raise ValueError(f"PagedKVCache.append: v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
        per_seq = self._counts(ids, k.shape[-3], counts, cu_seqlens)
        if not ids:
            return
        self._reserve_all(dict(zip(ids, per_seq)))
        rows = torch.cat([self._rows(s, self._lengths[s], n) for s, n in zip(ids, per_seq)])
        rows = rows.to(self.device)
        ks, vs = (k, v) if self.num_layers > 1 else (k[None], v[None])
        for i in range(self.num_layers):
            self.k_layers[i].index_copy_(0, rows, ks[i])
            self.v_layers[i].index_copy_(0, rows, vs[i])
        for seq_id, n in zip(ids, per_seq):
            self._lengths[seq_id] += n

    def gather(self, seq_id: int, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``seq_id`` in layer ``layer``, in logical order, ``[seqlen, heads_kv,
        head_dim]`` each (copies: for a prefill onto cached tokens, tests and debugging)."""
        k_pages, v_pages = self.layer(layer)
        rows = self.rows(seq_id).to(self.device)
        return k_pages.index_select(0, rows), v_pages.index_select(0, rows)

    def rows(self, seq_id: int) -> torch.Tensor:
        """int64 ``[seqlen]``: the row of k_pages / v_pages holding each position of ``seq_id``."""
        return self._rows(self._known(seq_id), 0, self._lengths[seq_id])

    def _rows(self, seq_id: int, start: int, n: int) -> torch.Tensor:
        """The rows of positions start .. start+n-1 of seq_id (its pages already reserved)."""
        t = torch.arange(start, start + n, dtype=torch.int64)
        pages = torch.tensor(self._pages[seq_id], dtype=torch.int64)
        return pages[t // self.page_size] * self.page_size + t % self.page_size

    # ---- what the attention ops read ------------------------------------------------

    def block_table(self, seq_ids: int | Sequence[int], max_pages: int | None = None) -> torch.Tensor:
        """int32 ``[B, max_pages]`` (default max_pages_per_seq): row b lists the pages of
        ``seq_ids[b]`` in logical order, then 0s (a valid page: never read past seqlen)."""
        ids = self._ids(seq_ids)
        width = self.max_pages_per_seq if max_pages is None else _positive_int("max_pages", max_pages)
        table = torch.zeros(len(ids), width, dtype=torch.int32)
        for b, seq_id in enumerate(ids):
            pages = self._pages[seq_id]
            if len(pages) > width:
                raise ValueError(
                    f"PagedKVCache.block_table: sequence {seq_id} holds {len(pages)} pages, more than max_pages={width}"
                )
            table[b, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        return table.to(self.device)

    def seqlens(self, seq_ids: int | Sequence[int]) -> torch.Tensor:
        """int32 ``[B]``: the tokens each of ``seq_ids`` holds."""
        ids = self._ids(seq_ids)
        return torch.tensor([self._lengths[s] for s in ids], dtype=torch.int32, device=self.device)

    @staticmethod
    def cu_seqlens(counts: Sequence[int] | torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
        """int32 ``[B + 1]`` prefix sums of ``counts``: request b covers rows cu[b] .. cu[b+1]-1."""
        values = [_count("counts[i]", c) for c in _as_list(counts)]
        out = [0]
        for c in values:
            out.append(out[-1] + c)
        return torch.tensor(out, dtype=torch.int32, device=device)

    # ---- checks ---------------------------------------------------------------------

    def _known(self, seq_id: Any) -> int:
        if isinstance(seq_id, bool) or not isinstance(seq_id, int) or seq_id not in self._pages:
            live = list(self._pages)
            raise KeyError(f"PagedKVCache: no sequence {seq_id!r} (live: {live}; add_sequence() makes one)")
        return seq_id

    def _ids(self, seq_ids: int | Sequence[int]) -> list[int]:
        ids = [seq_ids] if isinstance(seq_ids, int) and not isinstance(seq_ids, bool) else list(seq_ids)
        return [self._known(s) for s in ids]

    def _check_tokens(self, name: str, t: Any) -> None:
        layers = (self.num_layers,) if self.num_layers > 1 else ()
        want = f"[{f'{self.num_layers}, ' if layers else ''}total_new, {self.heads_kv}, {self.head_dim}]"
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"PagedKVCache.append: {name} must be a tensor {want}, got {type(t).__name__}")
        if t.ndim != 3 + len(layers) or tuple(t.shape[: len(layers)]) + tuple(t.shape[-2:]) != (
            *layers,
            self.heads_kv,
            self.head_dim,
        ):
            raise ValueError(f"PagedKVCache.append: {name} must be {want}, got shape {tuple(t.shape)}")
        if t.dtype != self.dtype:
            raise ValueError(f"PagedKVCache.append: {name} must be {self.dtype} (the cache's dtype), got {t.dtype}")
        if t.device != self.device:
            raise ValueError(
                f"PagedKVCache.append: {name} must be on {self.device} (the cache's device), got {t.device}"
            )

    def _counts(self, ids: list[int], total: int, counts: Any, cu_seqlens: Any) -> list[int]:
        if counts is not None and cu_seqlens is not None:
            raise TypeError("PagedKVCache.append: pass counts or cu_seqlens, not both")
        if counts is None and cu_seqlens is None:
            if len(ids) != 1:
                raise TypeError(
                    f"PagedKVCache.append: {len(ids)} sequences need counts= or cu_seqlens= "
                    "(how many of k's rows are each one's)"
                )
            return [total]
        if cu_seqlens is not None:
            cu = [_count("cu_seqlens[i]", c) for c in _as_list(cu_seqlens)]
            if len(cu) != len(ids) + 1 or cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
                raise ValueError(
                    f"PagedKVCache.append: cu_seqlens must be {len(ids) + 1} non-decreasing "
                    f"offsets from 0 (one more than seq_ids), got {cu}"
                )
            per_seq = [b - a for a, b in zip(cu, cu[1:])]
        else:
            per_seq = [_count("counts[i]", c) for c in _as_list(counts)]
            if len(per_seq) != len(ids):
                raise ValueError(
                    f"PagedKVCache.append: counts must have one entry per sequence ({len(ids)}), got {len(per_seq)}"
                )
        if sum(per_seq) != total:
            raise ValueError(
                f"PagedKVCache.append: the counts add up to {sum(per_seq)} tokens, but k and v have {total} rows"
            )
        return per_seq


def _as_list(values: Any) -> list[Any]:
    if isinstance(values, torch.Tensor):
        if values.ndim != 1:
            raise ValueError(f"PagedKVCache: expected a 1-D tensor, got shape {tuple(values.shape)}")
        return values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"PagedKVCache: expected a sequence of ints or a 1-D tensor, got {values!r}")
    return list(values)
