"""`tileops new-backend NAME`: a backend package from the template, with a stub builder
per op in its manifest signature, that installs and passes its own tests as generated."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _overlay import make_overlay  # the overlay venv helper (same folder)

from tileops import cli, manifest


def _run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-m", "tileops", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _written(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_it_writes_the_example_backends_layout_under_the_names_derived_from_name(tmp_path):
    folder = cli.new_backend("acme", device_type="meta", dest=tmp_path)
    assert folder == tmp_path / "tileops-backend-acme"
    assert _written(folder) == {
        "pyproject.toml",
        "README.md",
        ".gitignore",
        "src/tileops_acme/__init__.py",
        "src/tileops_acme/kernels.py",
        "tests/conftest.py",
        "tests/test_discovery.py",
        "tests/test_errors.py",
        "tests/test_takeover.py",
        "tests/test_memoization.py",
    }
    pyproject = (folder / "pyproject.toml").read_text()
    assert 'name = "tileops-backend-acme"' in pyproject
    assert '[project.entry-points."tileops.backends"]\nacme = "tileops_acme"' in pyproject
    # torch only: tileops is deliberately not a dependency
    assert re.search(r"^dependencies = \[\"torch>=[\d.]+\"\]$", pyproject, re.MULTILINE)
    init = (folder / "src/tileops_acme/__init__.py").read_text()
    assert 'TARGET = "acme"' in init and 'DEVICE_TYPE = "meta"' in init
    assert 'register_kernel_builder(op="RMSNormFwdOp", target=TARGET' in init
    assert "$" not in "".join(p.read_text() for p in folder.rglob("*") if p.is_file())


def test_the_device_type_defaults_to_the_name_and_the_op_to_rms_norm(tmp_path):
    folder = cli.new_backend("acme", dest=tmp_path)
    init = (folder / "src/tileops_acme/__init__.py").read_text()
    assert 'DEVICE_TYPE = "acme"' in init
    assert re.findall(r'register_kernel_builder\(op="(\w+)"', init) == ["RMSNormFwdOp"]


@pytest.mark.parametrize("op", sorted(manifest.all_entries()))
def test_each_stub_has_its_ops_manifest_signature(op):
    source = cli.builder_stub(op)
    (fn,) = [node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)]
    entry = manifest.entry(op)
    assert fn.name == cli.builder_name(op)
    assert [a.arg for a in fn.args.args] == [i.name for i in entry.inputs]
    assert all(a.annotation is not None for a in fn.args.args)
    assert [a.arg for a in fn.args.kwonlyargs] == [p.name for p in entry.params]
    assert fn.args.vararg is None and fn.args.kwarg is None and not fn.args.defaults


def test_a_stubs_error_names_the_op_the_target_and_what_it_received():
    namespace: dict = {}
    init_head = (cli.TEMPLATES / "package/__init__.py.tmpl").read_text()
    helper = init_head[init_head.index("def _no_kernel_yet") : init_head.index("$builders")]
    exec(
        "from tileops.backend import TensorSpec\nTARGET = 'acme'\n__name__ = 'tileops_acme'\n"
        + helper
        + cli.builder_stub("RMSNormFwdOp"),
        namespace,
    )
    import torch

    x = namespace["TensorSpec"](torch.device("meta"), torch.float16, (4, 64))
    w = namespace["TensorSpec"](torch.device("meta"), torch.float16, (64,))
    with pytest.raises(NotImplementedError) as caught:
        namespace["build_rms_norm_fwd"](x, w, normalized_shape=(64,), eps=1e-6)
    assert str(caught.value) == (
        f"acme has no kernel for RMSNormFwdOp yet; received x={x!r}, weight={w!r}, "
        "params normalized_shape=(64,), eps=1e-06 — write it in tileops_acme/kernels.py"
    )


def test_builder_names_are_snake_case_of_the_op_without_op():
    assert cli.builder_name("RMSNormFwdOp") == "build_rms_norm_fwd"
    assert cli.builder_name("GroupedQueryAttentionDecodeWithKVCacheFwdOp") == (
        "build_grouped_query_attention_decode_with_kv_cache_fwd"
    )


@pytest.mark.parametrize("name", ["Acme", "acme-1", "1acme", "", "class", "ac me", "acmé"])
def test_a_name_that_is_not_a_lowercase_identifier_is_refused(tmp_path, name):
    with pytest.raises(cli.UsageError, match="NAME must be a lowercase Python identifier"):
        cli.new_backend(name, dest=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_an_op_no_manifest_declares_is_refused_with_a_suggestion(tmp_path):
    with pytest.raises(cli.UsageError) as caught:
        cli.new_backend("acme", ops=["RMSNormFwdOp", "RmsNormFwdOp"], dest=tmp_path)
    message = str(caught.value)
    assert ("'RmsNormFwdOp' is not an op any manifest declares (did you mean 'RMSNormFwdOp'?)") in message
    assert "GemmFwdOp" in message  # the list of real ops
    assert list(tmp_path.iterdir()) == []


def test_an_invalid_device_type_is_refused(tmp_path):
    with pytest.raises(cli.UsageError, match="--device-type must be a torch device type"):
        cli.new_backend("acme", device_type="Acme:0", dest=tmp_path)


def test_an_existing_folder_is_never_overwritten(tmp_path):
    existing = tmp_path / "tileops-backend-acme"
    existing.mkdir()
    (existing / "mine.txt").write_text("keep me")
    with pytest.raises(cli.UsageError, match="already exists; refusing to overwrite it"):
        cli.new_backend("acme", dest=tmp_path)
    assert _written(existing) == {"mine.txt"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tileops-backend-acme"]


def test_the_command_line_reports_errors_with_exit_status_2(tmp_path):
    run = _run_cli("new-backend", "acme", "--ops", "SoftmaxFwdOp,NopeOp", "--dest", str(tmp_path))
    assert run.returncode == 2
    assert run.stderr.startswith("tileops new-backend: error: --ops: 'NopeOp' is not an op")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.subprocess
def test_python_dash_m_tileops_writes_the_package_and_says_what_to_do_next(tmp_path):
    run = _run_cli(
        "new-backend",
        "acme",
        "--device-type",
        "meta",
        "--ops",
        "GemmFwdOp, RMSNormFwdOp,GemmFwdOp",
        "--dest",
        str(tmp_path),
    )
    assert run.returncode == 0, run.stderr
    assert f"wrote {tmp_path / 'tileops-backend-acme'}" in run.stdout
    assert "pip install -e ." in run.stdout and "python -m pytest -q" in run.stdout
    init = (tmp_path / "tileops-backend-acme/src/tileops_acme/__init__.py").read_text()
    assert re.findall(r'register_kernel_builder\(op="(\w+)"', init) == ["GemmFwdOp", "RMSNormFwdOp"]


@pytest.mark.subprocess
def test_the_generated_backend_installs_and_its_tests_pass_as_generated(tmp_path):
    folder = cli.new_backend("acme", device_type="meta", dest=tmp_path)
    python = make_overlay(tmp_path / "venv-acme", folder)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    run = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-rs"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    tail = run.stdout[-4000:] + run.stderr[-2000:]
    assert run.returncode == 0, tail
    summary = run.stdout.strip().splitlines()[-1]
    assert "failed" not in summary and "error" not in summary, tail
    # The stub, discovery and error tests run on meta tensors; only the tests that need
    # a kernel (and the numeric one, meaningless on meta) skip.
    assert int(re.search(r"(\d+) passed", summary).group(1)) >= 14, tail
    skipped = re.findall(r"^SKIPPED \[\d+\] .*$", run.stdout, re.MULTILINE)
    assert all("still a stub" in s or "meta tensors hold no numbers" in s for s in skipped), tail
