"""The example backend and the native C++ backend installed together: both claim the
CPU, so layer one refuses to guess, and target= or the process default choose."""

from __future__ import annotations

import json
import subprocess

import pytest
from _overlay import REPO, make_overlay

SCRIPT = r"""
import json
import torch
from tileops.backend import AmbiguousTargetError, registered_targets, set_default_target
from tileops.ops import RMSNormFwdOp

x = torch.randn(4, 64, dtype=torch.bfloat16)
w = torch.randn(64, dtype=torch.bfloat16)
report = {"targets": registered_targets()}
try:
    RMSNormFwdOp(normalized_shape=(64,))(x, w)
except AmbiguousTargetError as error:
    report["ambiguous"] = str(error)
named = RMSNormFwdOp(normalized_shape=(64,), target="native_cpu")
named(x, w)
report["named"] = named.settled_target
set_default_target("torch_cpu")
by_default = RMSNormFwdOp(normalized_shape=(64,))
by_default(x, w)
report["default"] = by_default.settled_target
print(json.dumps(report))
"""


@pytest.mark.subprocess
def test_two_backends_claiming_the_cpu_need_an_explicit_choice(tmp_path):
    python = make_overlay(
        tmp_path / "venv-both", REPO / "backends" / "example", REPO / "backends" / "native_cpu"
    )
    done = subprocess.run(
        [str(python), "-c", SCRIPT], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["targets"] == ["native_cpu", "torch_cpu"]
    assert report["ambiguous"].startswith(
        "targets ['native_cpu', 'torch_cpu'] all claim device 'cpu'; pass target="
    )
    assert report["named"] == "native_cpu"
    assert report["default"] == "torch_cpu"
