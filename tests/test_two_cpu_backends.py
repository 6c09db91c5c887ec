"""The example backend and the native C++ backend installed together, as `make demo`
installs them: both claim the CPU, so layer one refuses to guess, and target= or the
process default choose. The README's code runs as written there."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from _overlay import REPO, make_overlay

README = REPO / "README.md"
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)

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


@pytest.fixture(scope="module")
def both_backends(tmp_path_factory) -> Path:
    """What `make demo` makes: the base venv plus both CPU backends (its python)."""
    root = tmp_path_factory.mktemp("both")
    backends = REPO / "backends"
    return make_overlay(root / "venv-both", backends / "example", backends / "native_cpu")


def _run(python: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.mark.subprocess
def test_two_backends_claiming_the_cpu_need_an_explicit_choice(both_backends, tmp_path):
    done = _run(both_backends, SCRIPT, tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["targets"] == ["native_cpu", "torch_cpu"]
    assert report["ambiguous"].startswith("targets ['native_cpu', 'torch_cpu'] all claim device 'cpu'; pass target=")
    assert report["named"] == "native_cpu"
    assert report["default"] == "torch_cpu"


def _readme_blocks(language: str) -> list[str]:
    return [body for info, body in FENCE.findall(README.read_text()) if info.strip() == language]


@pytest.mark.subprocess
@pytest.mark.parametrize("index", range(len(_readme_blocks("python"))))
def test_the_readmes_python_runs_as_written_where_make_demo_installs_both_backends(both_backends, tmp_path, index):
    code = _readme_blocks("python")[index]
    done = _run(both_backends, code, tmp_path)
    assert done.returncode == 0, f"README python block {index}:\n{code}\n{done.stderr[-3000:]}"
    # A print() line's trailing comment is what it prints.
    said = [line.split("#", 1)[1].strip() for line in code.splitlines() if line.startswith("print(") and "#" in line]
    printed = done.stdout.strip().splitlines()
    assert len(printed) == len(said)
    for got, claim in zip(printed, said):
        assert got == claim, (got, claim)


def test_the_readme_has_python_to_run():
    assert _readme_blocks("python")


def test_the_readmes_commands_name_make_targets_and_files_that_exist():
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.MULTILINE))
    for block in _readme_blocks("sh"):
        for line in block.splitlines():
            command = line.split("#", 1)[0].split()
            if not command:
                continue
            if command[0] == "make":
                assert command[1] in targets, line
            else:
                for word in command:
                    if "/" in word and not word.startswith("-"):
                        assert (REPO / word).exists() or word.startswith(".venv"), line
