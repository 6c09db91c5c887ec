"""Discovery in fresh interpreters, where it is truly the first time (B1, B2, B8).
B7 (``-W error`` and a backend that fails) is in tests/reliability/test_broken_backends.py.

Each fresh interpreter costs an ``import torch``; each one checks a whole story and the
tests below read its parts from one module-scoped run.
"""

from __future__ import annotations

import subprocess

import pytest
from _fake_backends import Site, run_fresh

pytestmark = pytest.mark.subprocess

TORCH_CPU = """
import torch

register_detector("torch_cpu", lambda device: device.type == "cpu")

def build_rms_norm(x, weight, *, normalized_shape, eps):
    log("built")
    return lambda x, w: torch.nn.functional.rms_norm(x, tuple(normalized_shape), w, eps)

register_kernel_builder("RMSNormFwdOp", "torch_cpu", build_rms_norm)
"""


# ---- B1, B2: install, then the design page's command ---------------------------------

_FIRST_OP = """
import pathlib
import torch

def imports():
    path = pathlib.Path({log!r})
    lines = path.read_text().splitlines() if path.exists() else []
    return lines.count("imported tileops_cpu")

import tileops, tileops.backend, tileops.ops
from tileops.ops.norm.rms_norm import RMSNormFwdOp
after_import = imports()

op = RMSNormFwdOp(normalized_shape=(64,))
after_construction = imports()

x, w = torch.randn(4, 64, dtype=torch.float16), torch.randn(64, dtype=torch.float16)
out = op(x, w)
for _ in range(3):
    RMSNormFwdOp(normalized_shape=(64,))(x, w)
    tileops.registered_targets(); tileops.load_failures(); tileops.default_target()

report(
    after_import=after_import,
    after_construction=after_construction,
    after_everything=imports(),
    settled=op.settled_target,
    equal=torch.equal(out, torch.nn.functional.rms_norm(x, (64,), w, 1e-6)),
    targets=tileops.registered_targets(),
)
"""


@pytest.fixture(scope="module")
def first_op(tmp_path_factory):
    site = Site(tmp_path_factory.mktemp("b1") / "site")
    site.install("tileops_backend_example", {"torch_cpu": "tileops_cpu"}, {"tileops_cpu": TORCH_CPU})
    # Discovery lists only this site's entry points (robust to whatever else the
    # environment has installed); nothing is read before the script's first op.
    return run_fresh(_FIRST_OP.format(log=str(site.log_path)), site=site)


def test_a_pip_installed_backend_serves_the_design_pages_command_without_any_init_call(first_op):
    assert first_op["settled"] == "torch_cpu"
    assert first_op["equal"] is True
    assert "torch_cpu" in first_op["targets"]


def test_importing_tileops_and_its_ops_does_not_discover_backends(first_op):
    assert first_op["after_import"] == 0


def test_the_first_op_construction_discovers_the_installed_backends(first_op):
    assert first_op["after_construction"] == 1


def test_discovery_imports_each_backend_once_per_process(first_op):
    assert first_op["after_everything"] == 1


# ---- B8: a backend reading the registry while it is imported ------------------------

READER = """
import torch

register_detector("reader", lambda device: device.type == "cpu")
register_kernel_builder(
    "RMSNormFwdOp", "reader",
    lambda x, weight, *, normalized_shape, eps:
        lambda x, w: torch.nn.functional.rms_norm(x, tuple(normalized_shape), w, eps),
)
log("seen " + repr(registered_targets()))
log("seen for op " + repr(registered_targets("RMSNormFwdOp")))
log("failures " + repr(load_failures()))
set_default_target("reader")
log("default " + repr(default_target()))
from tileops.ops import RMSNormFwdOp
RMSNormFwdOp(normalized_shape=(64,))
log("constructed an op")
log("done")
"""

_READ_DURING_IMPORT = """
import torch
import tileops

op_targets = tileops.registered_targets()
from tileops.ops import RMSNormFwdOp
op = RMSNormFwdOp(normalized_shape=(64,))
op(torch.randn(4, 64, dtype=torch.float16), torch.randn(64, dtype=torch.float16))
report(
    targets=op_targets,
    default=tileops.default_target(),
    failures=tileops.load_failures(),
    settled=op.settled_target,
)
"""


@pytest.fixture(scope="module")
def read_during_import(tmp_path_factory):
    site = Site(tmp_path_factory.mktemp("b8") / "site")
    site.backend("a_reader", READER)
    site.backend("b_later", 'register_detector("later", lambda device: False)')
    try:
        result = run_fresh(_READ_DURING_IMPORT, site=site, timeout=90)
    except subprocess.TimeoutExpired:  # a deadlock: every test below fails with this
        result = {"deadlock": True}
    result["site"] = site
    return result


def test_a_backend_reading_the_registry_at_import_neither_deadlocks_nor_fails(read_during_import):
    assert "deadlock" not in read_during_import
    assert read_during_import["failures"] == []
    assert read_during_import["targets"] == ["later", "reader"]


def test_a_backend_reading_the_registry_at_import_sees_what_is_registered_so_far(
    read_during_import,
):
    events = read_during_import["site"].events()
    assert "seen ['reader']" in events
    assert "seen for op ['reader']" in events
    assert "failures []" in events


def test_a_backend_may_set_the_default_target_at_import(read_during_import):
    assert "default 'reader'" in read_during_import["site"].events()
    assert read_during_import["default"] == "reader"
    assert read_during_import["settled"] == "reader"


def test_a_registry_read_at_import_does_not_recurse_into_discovery(read_during_import):
    events = read_during_import["site"].events()
    assert [e for e in events if e.startswith("imported")] == [
        "imported a_reader",
        "imported b_later",
    ]
    assert events.index("done") < events.index("imported b_later")
    assert "constructed an op" in events
