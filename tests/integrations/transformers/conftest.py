"""The model tests run on the backends installed, not on fakes (tests/integrations/conftest.py
lets discovery see them; each test still names its target to ``enable``).

``target`` is the CPU target a test enables its models on, each in turn; a test that takes
it is marked ``models`` (pyproject.toml), which ``make test-integrations`` runs where both
backends are installed. A target whose backend is not installed skips its tests, and
fails them where ``TILEOPS_REQUIRE_BACKENDS=1`` (CI): a missing backend cannot pass for a
green run.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from tileops.backend import load_failures, registered_targets

from ._models import TARGETS

# each target, its backend's module and the package that installs it
BACKENDS = {
    "native_cpu": ("tileops_native_cpu", "backends/native_cpu"),
    "torch_cpu": ("tileops_cpu", "backends/example"),
}


@pytest.fixture(scope="module", params=[pytest.param(t, marks=pytest.mark.models) for t in TARGETS])
def target(request) -> str:
    name = request.param
    module, package = BACKENDS[name]
    if importlib.util.find_spec(module) is None:
        message = (
            f"target {name}: its backend {module} is not installed "
            f"(pip install -e {package}, or run `make test-integrations`)"
        )
        if os.environ.get("TILEOPS_REQUIRE_BACKENDS") == "1":
            pytest.fail(f"{message}, and TILEOPS_REQUIRE_BACKENDS=1 requires it", pytrace=False)
        pytest.skip(message)
    if name not in registered_targets():
        pytest.fail(
            f"target {name}: {module} is installed but registered no such target (load failures: {load_failures()})",
            pytrace=False,
        )
    return name
