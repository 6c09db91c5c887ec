"""Serving utilities that sit beside the ops, outside the backend protocol: a paged KV
cache whose tensors are in the layout the paged attention ops read, and host tensors on
huge pages for what CPU kernels stream (weights, caches).

Not imported by ``import tileops``; ``import tileops.serving`` (torch only).
"""

from .host_memory import huge_page_empty, huge_pages_available
from .kv_cache import PagedKVCache

__all__ = ["PagedKVCache", "huge_page_empty", "huge_pages_available"]
