"""Shared test isolation: every test starts and ends with an empty backend registry, and
discovery sees only the backends the test itself installed.

``_reset_for_tests()`` forgets every registration (the default target included), clears
``load_failures()``, drops the modules of backends discovery imported and lets discovery
run again; the kernel memo bound goes back to its documented default. Whatever the
environment has installed under ``tileops.backends`` is hidden; a test installs fake
backends with ``site`` (discovered by this process) or ``fresh_site`` (for fresh
interpreters, see ``_fake_backends.run_fresh``). The model tests of
tests/integrations/transformers override both fixtures: they run on the installed backends.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest
import torch
from _fake_backends import Site

import tileops
from tileops.backend import discovery

# Under pytest-xdist, torch in each worker (and in the interpreters tests start) gets the
# cores divided among the workers, unless OMP_NUM_THREADS says otherwise: with every
# worker on every core, one worker's OpenMP threads spin on the cores the other needs
# (this suite on 2 cores: 3m23 with 2 threads a worker, 1m59 with 1). Plugins may have
# imported torch already, so the running one is told too.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // _workers)))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

_sites: list[Site] = []  # the sites of the running test that this process may discover


def _reset() -> None:
    discovery._reset_for_tests()
    tileops.set_kernel_cache_capacity(tileops.DEFAULT_KERNEL_CACHE_CAPACITY)


@pytest.fixture(autouse=True)
def _fresh_backend_registry():
    _reset()
    yield
    _reset()


@pytest.fixture(autouse=True)
def _only_backends_the_test_installed(monkeypatch):
    """Discovery lists only entry points of distributions installed with ``site``."""
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
    """A site folder on ``sys.path`` whose backends this process discovers. Discovery has
    not run when the test body starts: the test's first registry read (or op) runs it."""
    made = Site(tmp_path / "site")
    monkeypatch.syspath_prepend(str(made.root))
    _sites.append(made)
    yield made
    root = made.root.resolve()
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and Path(file).resolve().is_relative_to(root):
            del sys.modules[name]
    importlib.invalidate_caches()


@pytest.fixture
def fresh_site(tmp_path):
    """A site folder for fresh interpreters only (not on this process's ``sys.path``)."""
    return Site(tmp_path / "fresh_site")
