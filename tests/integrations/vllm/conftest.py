"""The plugin's in-process tests build vLLM layers, whose ops settle on the installed
backend (native_cpu in ``.venv-vllm``) as they do in an engine: this folder overrides the
two autouse fixtures of tests/conftest.py that hide installed backends."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fresh_backend_registry():
    yield


@pytest.fixture(autouse=True)
def _only_backends_the_test_installed():
    yield
