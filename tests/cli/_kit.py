"""Helpers for the vendor kit's tests. The kit's commands run as a user runs them: ``python -m tileops COMMAND`` in a
fresh interpreter that sees the fake backends of a site folder (on PYTHONPATH, installed
as distributions: discovery finds them by their entry points)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from _fake_backends import Site

# A correct RMSNorm and a Softmax whose kernel is 0.05 off everywhere: check must catch it.
MIXED = """
import torch

TILEOPS_PROTOCOL_VERSION = (1, 0)
register_detector("acme_cpu", lambda device: device.type == "cpu")


def build_rms_norm(x, weight, *, normalized_shape, eps):
    return lambda x, w: torch.nn.functional.rms_norm(x, tuple(normalized_shape), w, eps)


def build_softmax(x, *, dim):
    return lambda x: (torch.softmax(x.float(), dim) + 0.05).to(x.dtype)


register_kernel_builder("RMSNormFwdOp", "acme_cpu", build_rms_norm)
register_kernel_builder("SoftmaxFwdOp", "acme_cpu", build_softmax)
"""

# A second CPU target with the same correct RMSNorm: a baseline for bench.
OTHER = """
import torch

register_detector("other_cpu", lambda device: device.type == "cpu")
register_kernel_builder(
    "RMSNormFwdOp", "other_cpu",
    lambda x, w, *, normalized_shape, eps: (
        lambda x, w: torch.nn.functional.rms_norm(x, tuple(normalized_shape), w, eps)),
)
"""

# The example backend's mistake: a builder under an op name no manifest declares.
MISSPELT = """
register_detector("typo_cpu", lambda device: False)
register_kernel_builder("GemmOp", "typo_cpu", lambda a, b, *, trans_a, trans_b: None)
register_kernel_builder("RMSNormFwdOp", "typo_cpu", lambda x, w, *, normalized_shape, eps: None)
"""

# Written for a protocol this tileops does not speak.
FUTURE = """
TILEOPS_PROTOCOL_VERSION = (99, 0)
register_detector("future_cpu", lambda device: False)
"""


def block(folder: Path, *modules: str) -> Path:
    """A folder that, first on PYTHONPATH, makes ``modules`` fail to import as if absent."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in modules:
        (folder / name).mkdir(exist_ok=True)
        (folder / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n"
        )
    return folder


def run_cli(
    *args: str, site: Site | None = None, path: tuple[Path, ...] = (), timeout: float = 240
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONWARNINGS")}
    entries = [str(p) for p in path] + ([str(site.root)] if site is not None else [])
    if entries:
        env["PYTHONPATH"] = os.pathsep.join(entries)
    env["TILEOPS_MACHINE_PROFILE"] = str((site.root.parent if site else Path("/nonexistent")) / "machine.yaml")
    return subprocess.run(
        [sys.executable, "-m", "tileops", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=site.root.parent if site is not None else None,
    )


def output(run: subprocess.CompletedProcess) -> str:
    return f"exit {run.returncode}\n--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}"


def as_json(run: subprocess.CompletedProcess) -> dict[str, Any]:
    try:
        return json.loads(run.stdout)
    except ValueError:
        raise AssertionError("stdout is not JSON:\n" + output(run)) from None


def rows(payload: dict[str, Any], table: str) -> list[dict[str, Any]]:
    return payload["tables"][table]["rows"]
