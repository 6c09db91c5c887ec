from __future__ import annotations

import pytest

import tileops
from tileops.backend import discovery
from tileops.testing.fakes import RecordingTarget


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    """Each test starts with no backend at all (installed ones are hidden) and default
    memo capacity, and leaves nothing behind."""
    monkeypatch.setattr(discovery, "_entry_points", lambda: [])
    discovery._reset_for_tests()
    discovery.ensure_discovered()
    yield
    discovery._reset_for_tests()
    tileops.set_kernel_cache_capacity(tileops.DEFAULT_KERNEL_CACHE_CAPACITY)


@pytest.fixture
def cpu_target() -> RecordingTarget:
    return RecordingTarget("fake_cpu", "cpu").register()


@pytest.fixture
def meta_target() -> RecordingTarget:
    return RecordingTarget("fake_meta", "meta").register()
