"""Host tensors on transparent huge pages, for data a CPU kernel streams whole: weights a
decode step reads once per token, KV caches.

On 4 KiB pages a stream crosses a page boundary every 4 KiB: the hardware prefetcher
stops there and the TLB misses on nearly every page. On 2 MiB pages neither happens, and
a GEMV streams its weight faster (docs/performance.md, "Weights on huge pages").

``huge_page_empty`` maps private anonymous memory aligned to 2 MiB and advises the kernel
to back it with huge pages (``madvise(MADV_HUGEPAGE)``), so it works where transparent huge
pages are ``always`` or ``madvise``; where they are off, or on a platform without them,
``huge_pages_available()`` is False and callers keep their ordinary tensors.
"""

from __future__ import annotations

import functools
import mmap
from pathlib import Path

import torch

__all__ = ["HUGE_PAGE", "huge_page_empty", "huge_pages_available", "on_huge_pages"]

HUGE_PAGE = 2 << 20
_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@functools.cache
def huge_pages_available() -> bool:
    """Whether transparent huge pages can back an advised mapping here."""
    if not hasattr(mmap, "MADV_HUGEPAGE") or not hasattr(mmap, "MAP_PRIVATE"):
        return False
    try:
        return "[never]" not in _THP.read_text()
    except OSError:
        return False


def huge_page_empty(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor whose memory starts on a 2 MiB boundary and
    is advised for huge pages. The tensor keeps its mapping alive; it is freed with the
    last tensor that views it. Raises RuntimeError where huge pages are not available."""
    if not huge_pages_available():
        raise RuntimeError("huge_page_empty: transparent huge pages are not available on this machine")
    numel = 1
    for n in shape:
        numel *= int(n)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    mapping = mmap.mmap(-1, max(nbytes, 1) + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(mmap.MADV_HUGEPAGE)
    raw = torch.frombuffer(mapping, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE
    return raw[start : start + nbytes].view(dtype).view(tuple(shape))


def on_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """A copy of CPU tensor ``t`` on huge pages; ``t`` itself on another device or where
    huge pages are not available."""
    if t.device.type != "cpu" or not huge_pages_available():
        return t
    moved = huge_page_empty(t.shape, t.dtype)
    moved.copy_(t)
    return moved
