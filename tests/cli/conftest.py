"""Fixtures of the vendor kit's tests (helpers in _kit.py)."""

from __future__ import annotations

import pytest
from _fake_backends import Site

from ._kit import MIXED, OTHER


@pytest.fixture
def kit_site(fresh_site: Site) -> Site:
    fresh_site.install("tileops-backend-acme", {"acme_cpu": "tileops_acme"}, {"tileops_acme": MIXED})
    fresh_site.install("tileops-backend-other", {"other_cpu": "tileops_other"}, {"tileops_other": OTHER})
    return fresh_site
