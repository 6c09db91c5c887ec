"""Where transformers' APIs differ between the releases tileops serves (5.19 to the newest),
found by the feature, never by the version string.

- 5.24 renamed the cache's keyword argument and output field from ``past_key_values`` to
  ``cache``: ``cache_field`` names the field an output class has, ``cache_kwarg`` the
  keyword a forward takes.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

__all__ = ["cache_field", "cache_kwarg", "pop_cache"]


def cache_field(output: type) -> str:
    """The name of an output class's cache field: ``cache`` or ``past_key_values``."""
    return "cache" if "cache" in {f.name for f in dataclasses.fields(output)} else "past_key_values"


def cache_kwarg(forward: Any) -> str:
    """The keyword a forward takes its cache by: ``cache`` or ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def pop_cache(kwargs: dict) -> Any:
    """The cache a call passed by either name (removed from ``kwargs``), or None."""
    cache = kwargs.pop("cache", None)
    legacy = kwargs.pop("past_key_values", None)
    return legacy if cache is None else cache
