"""docs/writing-a-backend.md is tested: its backend is installed from the page itself,
its Python sessions run as doctests against it, and every error message it quotes is
what tileops prints in the situation the page describes.

How the page's code blocks are read:

* a block whose first line is ``# file: PATH`` is a file of the example backend;
* a ``python`` block whose first line starts with ``>>>`` is a session (all sessions run
  in order, in one namespace, with the example backend installed);
* a ``text error:ID`` block is an error message, checked against scenario ID below;
* any other ``python`` block is an illustration and must at least compile.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import textwrap
from pathlib import Path

import pytest
from _overlay import make_overlay  # the overlay venv helper (same folder)

from tileops import cli

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "writing-a-backend.md"
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def _blocks() -> list[tuple[str, str]]:
    """(info string, body) of every fenced block of the guide, in order."""
    return [(m.group(1).strip(), m.group(2)) for m in FENCE.finditer(GUIDE.read_text())]


def _files() -> dict[str, str]:
    files = {}
    for _, body in _blocks():
        first, _, rest = body.partition("\n")
        if first.startswith("# file: "):
            path = first.removeprefix("# file: ").strip()
            assert path not in files, f"the guide shows {path} twice"
            files[path] = rest
    return files


def _sessions() -> list[str]:
    return [body for info, body in _blocks() if info == "python" and body.startswith(">>>")]


def _messages() -> dict[str, str]:
    out = {}
    for info, body in _blocks():
        if info.startswith("text error:"):
            out[info.removeprefix("text error:")] = " ".join(body.split())
    return out


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONWARNINGS")}


# ---- what the page contains ------------------------------------------------------------


def test_the_guide_shows_every_file_of_its_backend_once():
    assert set(_files()) == {
        "pyproject.toml",
        "src/tileops_mini/__init__.py",
        "src/tileops_mini/kernels.py",
    }


def test_every_illustrative_python_block_compiles():
    illustrations = [body for info, body in _blocks() if info == "python" and not body.startswith((">>>", "# file: "))]
    assert illustrations, "the guide has illustrative snippets (graph capture, errors)"
    for body in illustrations:
        compile(body, str(GUIDE), "exec")


def test_the_guides_command_lines_are_ones_tileops_accepts():
    lines = [
        line.removeprefix("$ tileops ")
        for info, body in _blocks()
        if info == "console"
        for line in body.splitlines()
        if line.startswith("$ tileops ")
    ]
    assert lines
    for line in lines:
        args = cli._parser().parse_args(shlex.split(line))
        if args.command == "new-backend":
            cli.check_name(args.name)
            cli.check_ops(args.ops)


def test_every_command_line_the_docs_show_parses():
    root = GUIDE.parents[1]
    lines = [
        line.strip().removeprefix("$ tileops ")
        for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]
        for line in doc.read_text().splitlines()
        if line.strip().startswith("$ tileops ")
    ]
    assert len(lines) >= 6
    for line in lines:
        cli._parser().parse_args(shlex.split(line.split(" #")[0]))


def test_the_guide_quotes_every_error_it_promises_to_explain():
    assert set(_messages()) == set(SCENARIOS) | {"load-failure-warning", "load-failure-line", "protocol-mismatch-line"}


# ---- running it ------------------------------------------------------------------------

# Each scenario is the situation its message describes, set up against the installed
# example backend (mini_cpu). They run in order in one fresh interpreter.
SCENARIOS = {
    "no-builder": "SoftmaxFwdOp()(x)",
    "unknown-target": "RMSNormFwdOp(normalized_shape=(64,), target='nope')(x, w)",
    "builtin-on-cpu": "RMSNormFwdOp(normalized_shape=(64,), target=BUILTIN)(x, w)",
    "wrong-device": """
        op = RMSNormFwdOp(normalized_shape=(64,))
        op(x, w)
        op(x.to('meta'), w.to('meta'))
    """,
    "not-wired": """
        register_kernel_builder('GemmOp', 'mini_cpu', lambda a, b, *, trans_a, trans_b: None)

        class GemmOp(GemmFwdOp):
            def _fetch(self, a, b):
                return self.get_or_build_kernel('gemm_kernel', None, key=None, build=None)

        GemmOp()(x, x)
    """,
    "not-callable": """
        register_kernel_builder('SiluFwdOp', 'mini_cpu', lambda input, *, inplace: 42)
        SiluFwdOp()(x)
    """,
    "duplicate-builder": """
        import tileops_mini
        register_kernel_builder('RMSNormFwdOp', 'mini_cpu', tileops_mini.build_rms_norm)
    """,
    "ambiguous": """
        def other_detect(device):
            return device.type == 'cpu'
        register_detector('other_cpu', other_detect)
        RMSNormFwdOp(normalized_shape=(64,))(x, w)
    """,
    "detector-raised": """
        def _detect(device):
            raise RuntimeError('acme runtime not initialised')
        _detect.__module__ = 'tileops_acme'
        register_detector('acme', _detect)
        RMSNormFwdOp(normalized_shape=(64,))(x, w)
    """,
}

_SCENARIO_PRELUDE = """
import json
import torch
from tileops.backend import BUILTIN, register_detector, register_kernel_builder
from tileops.ops import GemmFwdOp, RMSNormFwdOp, SiluFwdOp, SoftmaxFwdOp

x = torch.randn(4, 64, dtype=torch.float16)
w = torch.randn(64, dtype=torch.float16)
printed = {}
"""


def _scenario_script() -> str:
    parts = [_SCENARIO_PRELUDE]
    for name, code in SCENARIOS.items():
        body = textwrap.indent(textwrap.dedent(code).strip(), "    ")
        parts.append(
            f"try:\n{body}\nexcept Exception as error:\n"
            f"    printed[{name!r}] = f'{{type(error).__name__}}: {{error}}'\n"
            f"else:\n    printed[{name!r}] = None\n"
        )
    parts.append("print(json.dumps(printed))")
    return "\n".join(parts)


@pytest.fixture(scope="module")
def guide_venv(tmp_path_factory) -> Path:
    """An overlay venv with the guide's backend, written from the guide, installed alone."""
    root = tmp_path_factory.mktemp("guide")
    package = root / "tileops-backend-mini"
    for path, text in _files().items():
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).write_text(text)
    return make_overlay(root / "venv", package)


@pytest.mark.subprocess
def test_the_guides_sessions_run_against_the_backend_it_shows(guide_venv, tmp_path):
    doctest_file = tmp_path / "sessions.txt"
    doctest_file.write_text("\n\n".join(_sessions()))
    run = subprocess.run(
        [str(guide_venv), "-m", "doctest", "-o", "NORMALIZE_WHITESPACE", str(doctest_file)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_clean_env(),
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert len(_sessions()) >= 5


@pytest.mark.subprocess
def test_every_error_message_in_the_guide_is_what_tileops_prints(guide_venv):
    run = subprocess.run(
        [str(guide_venv), "-c", _scenario_script()],
        capture_output=True,
        text=True,
        timeout=300,
        env=_clean_env(),
    )
    assert run.returncode == 0, run.stderr[-4000:]
    printed = json.loads(run.stdout.strip().splitlines()[-1])
    quoted = _messages()
    for name in SCENARIOS:
        assert printed[name] is not None, f"scenario {name!r} raised nothing"
        assert " ".join(printed[name].split()) == quoted[name], name


@pytest.mark.subprocess
def test_the_guides_load_failure_texts_are_what_tileops_prints(guide_venv, tmp_path):
    # A second, broken backend beside mini_cpu: its module needs a vendor runtime that
    # is not installed. PYTHONPATH makes the site visible to importlib.metadata.
    site = tmp_path / "site"
    (site / "tileops_acme-0.1.dist-info").mkdir(parents=True)
    (site / "tileops_acme-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tileops-acme\nVersion: 0.1\n"
    )
    (site / "tileops_acme-0.1.dist-info" / "entry_points.txt").write_text("[tileops.backends]\nacme = tileops_acme\n")
    (site / "tileops_acme.py").write_text("import acme_runtime\n")
    # and one written for protocol 2.0
    (site / "tileops_old-0.1.dist-info").mkdir(parents=True)
    (site / "tileops_old-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tileops-old\nVersion: 0.1\n"
    )
    (site / "tileops_old-0.1.dist-info" / "entry_points.txt").write_text("[tileops.backends]\nold = tileops_old\n")
    (site / "tileops_old.py").write_text("TILEOPS_PROTOCOL_VERSION = (2, 0)\n")
    script = (
        "import json, warnings\n"
        "from tileops.backend import load_failures, registered_targets\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    targets = registered_targets()\n"
        "shown = [f'{w.category.__name__}: {w.message}' for w in caught]\n"
        "print(json.dumps([targets, shown, load_failures()]))\n"
    )
    env = {**_clean_env(), "PYTHONPATH": str(site)}
    run = subprocess.run([str(guide_venv), "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    targets, warned, failures = json.loads(run.stdout.strip().splitlines()[-1])
    quoted = _messages()
    assert targets == ["mini_cpu"]
    assert [" ".join(w.split()) for w in warned][0] == quoted["load-failure-warning"]
    assert failures == [quoted["load-failure-line"], quoted["protocol-mismatch-line"]]


CITED = re.compile(r"`?([\w/]*test_\w+\.py)::(test_\w+)")


def test_every_test_the_docs_cite_exists():
    """docs/*.md name the tests behind their promises (file.py::test_name)."""
    root = GUIDE.parents[1]
    cited = [
        (doc.name, file, name)
        for doc in sorted((root / "docs").glob("*.md"))
        for file, name in CITED.findall(doc.read_text())
    ]
    assert cited
    suites = [root / "tests", root / "backends"]
    for doc, file, name in cited:
        found = [p for suite in suites for p in suite.rglob(Path(file).name)]
        assert any(f"def {name}(" in p.read_text() for p in found), (doc, file, name)
