"""The protocol version handshake: a backend module may declare the protocol it was
written for as ``TILEOPS_PROTOCOL_VERSION = (major, minor)``; another major is a load
failure naming both versions and the fix; declaring nothing is accepted."""

from __future__ import annotations

import warnings

import pytest
from _fake_backends import discover, good

from tileops.backend import PROTOCOL_VERSION, discovery, load_failures, registered_targets


def test_the_protocol_version_is_a_major_minor_pair_of_ints():
    assert isinstance(PROTOCOL_VERSION, tuple) and len(PROTOCOL_VERSION) == 2
    assert all(isinstance(v, int) for v in PROTOCOL_VERSION)
    import tileops.backend

    assert "PROTOCOL_VERSION" in tileops.backend.__all__


def test_a_backend_declaring_another_major_is_a_load_failure_naming_both_versions(site):
    site.backend("acme", "TILEOPS_PROTOCOL_VERSION = (99, 0)\n" + good("acme"))
    site.backend("beta", good("beta"))
    caught = discover()
    ours = f"{PROTOCOL_VERSION[0]}.{PROTOCOL_VERSION[1]}"
    assert load_failures() == [
        f"acme (acme): BackendError: acme was written for tileops backend protocol 99.0, but "
        f"this tileops speaks protocol {ours}; install a release of acme written for protocol "
        f"{PROTOCOL_VERSION[0]}.x, or a tileops whose protocol is 99.x "
        "(tileops.backend.PROTOCOL_VERSION)"
    ]
    # rolled back like any failed import: the other backend is unaffected
    assert registered_targets() == ["beta"]
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)][0].startswith(
        "tileops backend failed to load and was skipped: acme (acme): BackendError"
    )


@pytest.mark.parametrize("minor", [0, 7])
def test_a_backend_declaring_this_major_loads_whatever_its_minor(site, minor):
    site.backend("acme", f"TILEOPS_PROTOCOL_VERSION = ({PROTOCOL_VERSION[0]}, {minor})\n" + good("acme"))
    discover()
    assert load_failures() == []
    assert registered_targets() == ["acme"]
    (info,) = discovery.backends()
    assert info.declared_protocol == (PROTOCOL_VERSION[0], minor)
    assert info.targets == ("acme",)


def test_a_backend_declaring_nothing_is_accepted(site):
    site.backend("acme", good("acme"))
    discover()
    assert load_failures() == []
    (info,) = discovery.backends()
    assert info.declared_protocol is None and info.failure is None
    assert (info.distribution, info.version, info.module) == ("acme_dist", "0.1", "acme")


@pytest.mark.parametrize("declared", ["'1.0'", "(1,)", "(1, 0, 0)", "(True, 0)", "[1, 0]"])
def test_a_malformed_declaration_is_a_load_failure_saying_what_is_expected(site, declared):
    site.backend("acme", f"TILEOPS_PROTOCOL_VERSION = {declared}\n" + good("acme"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        registered_targets()
    (line,) = load_failures()
    assert line.startswith(
        "acme (acme): BackendError: acme.TILEOPS_PROTOCOL_VERSION must be a (major, minor) pair of non-negative ints"
    )
    assert registered_targets() == []
