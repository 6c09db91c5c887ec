"""The example backend's own test suite, run where it is the only backend installed.

An overlay venv (tools/overlay_venv.sh) sees the project's venv — torch, tileops — and
adds backends/example alone, so entry-point discovery finds exactly one backend claiming
the CPU. The suite must pass there as it is, with no GPU: its two premise tests (a GEMM
call and a BUILTIN call on CPU) carry no skip, and only the test marked
``requires_cuda_runtime`` may be skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from _overlay import make_overlay  # tests/ is on sys.path (pytest rootdir import mode)

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "backends" / "example"


@pytest.mark.subprocess
def test_the_example_backends_suite_passes_where_it_is_the_only_backend(tmp_path):
    python = make_overlay(tmp_path / "venv-example", EXAMPLE)
    listed = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m; "
            "print(sorted(ep.value for ep in m.entry_points(group='tileops.backends')))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.stdout.strip() == "['tileops_cpu']", listed.stderr

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    run = subprocess.run(
        [str(python), "-m", "pytest", "-q"],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    tail = run.stdout[-4000:] + run.stderr[-2000:]
    assert run.returncode == 0, tail
    summary = run.stdout.strip().splitlines()[-1]
    assert re.search(r"\b\d+ passed\b", summary), tail
    assert "failed" not in summary and "error" not in summary, tail
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    found = re.search(r"(\d+) skipped", summary)
    skipped = int(found.group(1)) if found else 0
    assert passed >= 22, summary  # at least the design page's 22 behaviours
    assert skipped <= 1, summary  # only the requires_cuda_runtime test, on a machine without CUDA
