"""Serving utilities that sit beside the ops, outside the backend protocol: a paged KV
cache whose tensors are in the layout the paged attention ops read.

Not imported by ``import tileops``; ``import tileops.serving`` (torch only).
"""

from .kv_cache import PagedKVCache

__all__ = ["PagedKVCache"]
