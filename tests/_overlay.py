"""Shared by tests that need an environment with particular backends installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make_overlay(dest: Path, *packages: Path) -> Path:
    """An overlay venv at ``dest`` over this interpreter's venv with ``packages`` installed
    (editable); returns its python."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["BASE_VENV"] = sys.prefix
    made = subprocess.run(
        ["bash", str(REPO / "tools" / "overlay_venv.sh"), str(dest), *map(str, packages)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, f"overlay_venv.sh failed:\n{made.stdout}\n{made.stderr}"
    return dest / "bin" / "python"
