"""pytest plugin shipped with tileops (entry point ``pytest11``): the
``requires_cuda_runtime`` marker, which skips a test where no CUDA runtime and device
are present. Loaded in every pytest run of an environment with tileops installed, so it
imports nothing heavy until a marked test is collected."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires_cuda_runtime: needs a working CUDA runtime and device")


def _cuda_runtime_present() -> bool:
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("requires_cuda_runtime")]
    if not marked or _cuda_runtime_present():
        return
    skip = pytest.mark.skip(reason="needs a CUDA runtime and device; none here")
    for item in marked:
        item.add_marker(skip)
