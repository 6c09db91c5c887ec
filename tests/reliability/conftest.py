"""The reliability suites' shared fixture."""

from __future__ import annotations

import pytest

from ._hostile import Recorder


@pytest.fixture
def recorder() -> Recorder:
    """A fresh recording target (the hostile-input tests): every builder call and kernel call."""
    return Recorder().register()
