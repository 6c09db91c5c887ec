"""The kit's niceties are optional: `import tileops` (and the CLI's modules) never import
rich, matplotlib or transformers; the extra that installs rich and matplotlib is declared;
without rich a terminal gets the plain table."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.subprocess
def test_importing_tileops_and_its_cli_imports_none_of_the_optional_packages():
    code = (
        "import sys, tileops, tileops.cli; "
        "print(sorted(m for m in ('rich', 'matplotlib', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_rich_and_matplotlib_are_the_cli_extra_and_in_the_dev_requirements():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert sorted(r.split(">")[0] for r in extras["cli"]) == ["matplotlib", "rich"]
    dev = (REPO / "requirements-dev.txt").read_text().split()
    assert any(r.startswith("rich") for r in dev) and any(r.startswith("matplotlib") for r in dev)


def test_a_table_prints_plain_when_stdout_is_not_a_terminal(capsys):
    from tileops.cli._common import Table, show

    table = Table("title", ["op", "worst"])
    table.add("RMSNormFwdOp", 0.5)
    show([table])
    assert capsys.readouterr().out.splitlines() == [
        "title",
        "op            worst",
        "------------  -----",
        "RMSNormFwdOp  0.5",
    ]


def test_every_command_has_help():
    from tileops import cli

    parser = cli._parser()
    commands = parser._subparsers._group_actions[0].choices
    assert set(commands) == {"new-backend", "check", "bench", "profile-machine", "coverage", "doctor"}
    for name, sub in commands.items():
        text = sub.format_help()
        assert text.startswith(f"usage: tileops {name}"), name
        if name != "new-backend":
            assert "--json" in text, name
