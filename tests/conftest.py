"""Shared test isolation: every test starts and ends with an empty backend registry.

``_reset_for_tests()`` forgets every registration (the default target included), clears
``load_failures()``, drops the modules of backends discovery imported and lets discovery
run again; the kernel memo bound goes back to its documented default.
"""

from __future__ import annotations

import pytest

import tileops
from tileops.backend import discovery


def _reset() -> None:
    discovery._reset_for_tests()
    tileops.set_kernel_cache_capacity(tileops.DEFAULT_KERNEL_CACHE_CAPACITY)


@pytest.fixture(autouse=True)
def _fresh_backend_registry():
    _reset()
    yield
    _reset()
