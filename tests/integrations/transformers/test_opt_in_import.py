"""The transformers integration is opt-in: ``import tileops`` (and the integrations
package itself) never imports transformers; the extra that installs it is declared."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _imports_transformers(statement: str) -> bool:
    code = f"import sys; {statement}; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.strip() == "True"


@pytest.mark.parametrize("statement", ["import tileops", "import tileops.ops", "import tileops.integrations"])
def test_tileops_does_not_import_transformers(statement):
    assert not _imports_transformers(statement)


def test_the_integration_is_the_transformers_extra():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("transformers>=5") for req in extras["transformers"])


def test_the_integration_imports_where_transformers_is_installed():
    pytest.importorskip("transformers", reason="transformers is not installed")
    assert _imports_transformers("import tileops.integrations.transformers")
