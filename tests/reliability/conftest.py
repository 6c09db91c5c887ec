"""Isolation for the reliability tests.

Every test starts with an empty registry that discovery has already filled from nothing:
backends installed in the environment are hidden, only packages a test installs with the
``packages`` fixture are discovered. The memo bound is back at its default before and
after each test.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

import tileops
from tileops.backend import discovery

from ._backends import Packages

_installed: list[Packages] = []


def _reset() -> None:
    discovery._reset_for_tests()
    tileops.set_kernel_cache_capacity(tileops.DEFAULT_KERNEL_CACHE_CAPACITY)


@pytest.fixture(autouse=True)
def only_test_packages(monkeypatch):
    listed = discovery._entry_points
    monkeypatch.setattr(
        discovery,
        "_entry_points",
        lambda: [ep for ep in listed() if any(p.owns(ep) for p in _installed)],
    )
    _reset()
    yield
    _installed.clear()
    _reset()


@pytest.fixture
def packages(tmp_path, monkeypatch):
    """A folder of backend packages on this process's ``sys.path``; discovery has not run
    yet when the test body starts, so the test's first registry read discovers them."""
    made = Packages(tmp_path / "site")
    monkeypatch.syspath_prepend(str(made.root))
    _installed.append(made)
    yield made
    root = made.root.resolve()
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and Path(file).resolve().is_relative_to(root):
            del sys.modules[name]
    importlib.invalidate_caches()


@pytest.fixture
def fresh_packages(tmp_path):
    """A folder of backend packages for fresh interpreters only."""
    return Packages(tmp_path / "site")
