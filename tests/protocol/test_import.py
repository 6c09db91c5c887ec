"""Importing tileops is cheap and inert (A9), checked in fresh interpreters with a real
backend installed, so that there is one to (not) import."""

from __future__ import annotations

import pytest
from _fake_backends import Site, run_fresh

# Everything a GPU query at import would go through, wrapped before tileops is imported.
_IMPORT_PROBE = """
import importlib.metadata
import sys
import time

import torch
import torch.cuda

queries = []
def spy(name, fn):
    def wrapped(*args, **kwargs):
        queries.append(name)
        return fn(*args, **kwargs)
    return wrapped

for name in ("is_available", "device_count", "current_device", "get_device_capability",
             "get_device_properties", "get_device_name", "get_arch_list", "init",
             "_lazy_init", "synchronize", "mem_get_info", "is_bf16_supported"):
    if hasattr(torch.cuda, name):
        setattr(torch.cuda, name, spy(name, getattr(torch.cuda, name)))

entry_point_reads = []
_entry_points = importlib.metadata.entry_points
def entry_points(*args, **kwargs):
    entry_point_reads.append(repr((args, kwargs)))
    return _entry_points(*args, **kwargs)
importlib.metadata.entry_points = entry_points

before = set(sys.modules)
started = time.perf_counter()
import {module}
cost_ms = (time.perf_counter() - started) * 1000.0

report(
    cost_ms=cost_ms,
    new_modules=sorted(set(sys.modules) - before),
    entry_point_reads=entry_point_reads,
    cuda_initialized=torch.cuda.is_initialized(),
    cuda_queries=queries,
)
"""


@pytest.fixture(scope="module", params=["tileops", "tileops.backend"])
def imported(request, tmp_path_factory):
    """A fresh interpreter that imports torch, then ``tileops`` or ``tileops.backend``,
    with a backend installed; what it saw."""
    site = Site(tmp_path_factory.mktemp("a9") / "site")
    site.backend(
        "a9_backend",
        """
        register_detector("a9", lambda device: device.type == "cpu")
        """,
    )
    result = run_fresh(_IMPORT_PROBE.replace("{module}", request.param), site=site, isolate=False)
    result["module"] = request.param
    result["site"] = site
    return result


def test_importing_tileops_imports_no_installed_backend(imported):
    assert "a9_backend" not in imported["new_modules"]
    assert imported["site"].events() == []


def test_importing_tileops_runs_no_discovery(imported):
    assert [read for read in imported["entry_point_reads"] if "tileops.backends" in read] == []


def test_importing_tileops_asks_the_gpu_nothing(imported):
    assert imported["cuda_queries"] == []
    assert imported["cuda_initialized"] is False


def test_importing_tileops_loads_no_compiler(imported):
    heavy = ("tilelang", "triton", "torch._inductor", "torch.utils.cpp_extension")
    assert [m for m in imported["new_modules"] if m.startswith(heavy)] == []


def test_importing_tileops_costs_little_beyond_torch(imported):
    print(f"import {imported['module']} after import torch: {imported['cost_ms']:.1f} ms")
    assert imported["cost_ms"] < 200.0
