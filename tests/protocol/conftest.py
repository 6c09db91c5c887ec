"""Fixtures of the protocol tests.

In this process discovery sees no backend unless a test installs one with ``site``:
whatever else the environment has installed under ``tileops.backends`` is filtered out,
so every test starts from "nothing installed" (tests/conftest.py resets the registry).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from tileops.backend import discovery

from ._support import Site

_sites: list[Site] = []


@pytest.fixture(autouse=True)
def _only_test_backends(monkeypatch):
    """Discovery lists only entry points of distributions a test installed."""
    every_entry_point = discovery._entry_points
    monkeypatch.setattr(
        discovery,
        "_entry_points",
        lambda: [ep for ep in every_entry_point() if any(s.owns(ep) for s in _sites)],
    )
    yield
    _sites.clear()


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site directory on ``sys.path`` whose backends this process can discover."""
    made = Site(tmp_path / "site")
    monkeypatch.syspath_prepend(str(made.root))
    _sites.append(made)
    yield _Installing(made)
    root = str(made.root.resolve())
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and str(Path(file).resolve()).startswith(root):
            del sys.modules[name]
    importlib.invalidate_caches()


class _Installing:
    """``Site`` that also refreshes the import caches after each install."""

    def __init__(self, site: Site) -> None:
        self._site = site

    def __getattr__(self, name):
        return getattr(self._site, name)

    def install(self, *args, **kwargs) -> None:
        self._site.install(*args, **kwargs)
        importlib.invalidate_caches()

    def backend(self, *args, **kwargs) -> None:
        self._site.backend(*args, **kwargs)
        importlib.invalidate_caches()


@pytest.fixture
def fresh_site(tmp_path):
    """A site for fresh interpreters only (not on this process's ``sys.path``)."""
    return Site(tmp_path / "site")
