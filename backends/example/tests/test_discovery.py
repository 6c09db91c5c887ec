"""pip install is the whole set-up: the entry point makes tileops import the backend on
its first op, and the backend's import registers target torch_cpu."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest
import torch

from tileops import manifest
from tileops.backend import BUILTIN, default_target, load_failures, registered_targets
from tileops.ops import GemmFwdOp, RMSNormFwdOp


def test_the_entry_point_is_declared_in_the_installed_distributions_metadata():
    dist = importlib.metadata.distribution("tileops-backend-example")
    declared = [(ep.name, ep.value) for ep in dist.entry_points if ep.group == "tileops.backends"]
    assert declared == [("torch_cpu", "tileops_cpu")]


def test_the_distribution_does_not_depend_on_tileops():
    requires = importlib.metadata.requires("tileops-backend-example") or []
    names = [r.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].strip() for r in requires]
    assert "tileops" not in names


def test_the_target_is_registered_without_anyone_importing_tileops_cpu():
    # A fresh interpreter: nothing imports tileops_cpu; the first registry read runs
    # discovery, which imports it through the entry point.
    script = (
        "import sys\n"
        "import tileops.backend as backend\n"
        "before = 'tileops_cpu' in sys.modules\n"
        "targets = backend.registered_targets()\n"
        "print(before, targets, 'tileops_cpu' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[0] == "False ['torch_cpu'] True"


def test_the_first_op_construction_runs_discovery_in_a_fresh_interpreter():
    script = (
        "import torch\n"
        "from tileops.ops import RMSNormFwdOp\n"
        "op = RMSNormFwdOp(normalized_shape=(8,))\n"
        "import sys; print('tileops_cpu' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "True"


def test_the_target_has_builders_for_the_ops_it_takes_over():
    assert registered_targets() == ["torch_cpu"]
    assert registered_targets("RMSNormFwdOp") == ["torch_cpu"]
    assert registered_targets("GemmFwdOp") == ["torch_cpu"]
    assert registered_targets("SoftmaxFwdOp") == []


def test_the_pending_builder_is_registered_under_a_name_no_manifest_declares():
    assert registered_targets("GemmOp") == ["torch_cpu"]
    with pytest.raises(LookupError):
        manifest.entry("GemmOp")


def test_nothing_failed_to_load():
    assert load_failures() == []


def test_installing_a_backend_sets_no_default_target():
    assert default_target() is None


def test_detection_settles_a_cpu_call_on_torch_cpu():
    op = RMSNormFwdOp(normalized_shape=(8,))
    assert op.settled_target is None  # nothing is decided before the first call
    op(torch.randn(2, 8, dtype=torch.float16), torch.randn(8, dtype=torch.float16))
    assert op.settled_target == "torch_cpu"


def test_a_named_target_skips_detection():
    op = GemmFwdOp(target="torch_cpu")
    op(torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(3, 8, dtype=torch.bfloat16))
    assert op.settled_target == "torch_cpu"


def test_a_device_the_detector_does_not_claim_stays_with_the_in_tree_kernels():
    # meta tensors: no registered detector claims them, so the in-tree kernel is chosen,
    # and it says it is a CUDA kernel — without "Another target's backend serves ...".
    x = torch.empty(2, 8, dtype=torch.float16, device="meta")
    op = RMSNormFwdOp(normalized_shape=(8,))
    with pytest.raises(ValueError) as caught:
        op(x, x[0])
    assert str(caught.value) == "RMSNormKernel is a CUDA kernel; got x on meta and weight on meta."


def test_builtin_is_a_choice_of_the_caller_not_a_target():
    assert BUILTIN not in registered_targets()
