"""The integration tests run on the backends installed, not on fakes: this folder overrides
the two autouse fixtures of tests/conftest.py that hide them, so discovery sees every
installed backend, once per process, as it does for users."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fresh_backend_registry():
    """Discovery runs once per process (tests/conftest.py's fixture resets the registry
    around each test)."""
    yield


@pytest.fixture(autouse=True)
def _only_backends_the_test_installed():
    """Discovery lists every installed backend (tests/conftest.py's fixture hides them)."""
    yield
