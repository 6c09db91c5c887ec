"""Discovery through the entry-point group ``tileops.backends`` (B1-B3), in this process:
each test installs real distributions in a site directory on ``sys.path`` and starts from
an undiscovered, empty registry (tests/conftest.py). Backends that fail to load (B4-B7,
B9) are tested in tests/reliability/test_broken_backends.py."""

from __future__ import annotations

import importlib.metadata
import threading

import pytest
from _fake_backends import discover, good, rms_inputs, rms_op

from tileops.backend import (
    UnknownTargetError,
    default_target,
    discovery,
    load_failures,
    registered_targets,
    set_default_target,
)

CLAIMS_CPU = """
register_detector({target!r}, lambda device: device.type == "cpu")
"""


# ---- B1 ------------------------------------------------------------------------------


def test_installing_a_backend_is_all_it_takes_to_register_it(site):
    site.backend("acme", good("acme"))
    assert registered_targets() == ["acme"]
    assert registered_targets("RMSNormFwdOp") == ["acme"]


def test_an_installed_backend_serves_an_op_with_no_initialisation_call(site):
    site.backend(
        "acme",
        """
        import torch

        register_detector("acme", lambda device: device.type == "cpu")
        register_kernel_builder(
            "RMSNormFwdOp", "acme",
            lambda x, weight, *, normalized_shape, eps:
                lambda x, w: torch.nn.functional.rms_norm(x, tuple(normalized_shape), w, eps),
        )
        """,
    )
    op = rms_op()
    op(*rms_inputs())
    assert op.settled_target == "acme"


def test_an_entry_point_value_names_the_module_whose_import_registers(site):
    site.install(
        "acme_dist",
        {"acme": "acme_pkg.registration"},
        {"acme_pkg.registration": CLAIMS_CPU.format(target="acme"), "acme_pkg.unrelated": ""},
    )
    assert registered_targets() == ["acme"]
    assert site.imports_of("acme_pkg.registration") == 1
    assert site.imports_of("acme_pkg.unrelated") == 0


def test_entry_points_of_another_group_are_not_backends(site):
    site.install(
        "elsewhere_dist",
        {"elsewhere": "elsewhere_mod"},
        {"elsewhere_mod": CLAIMS_CPU.format(target="elsewhere")},
        group="tileops.backend",  # singular: not the protocol's group
    )
    assert registered_targets() == []
    assert site.events() == []


# ---- B2 ------------------------------------------------------------------------------


def test_discovery_waits_for_the_first_op_construction(site):
    site.backend("acme", good("acme"))
    from tileops.ops import RMSNormFwdOp  # noqa: F401 - importing ops discovers nothing

    assert site.events() == []
    rms_op()
    assert site.imports_of("acme") == 1


READS = {
    "registered_targets()": lambda: registered_targets(),
    "registered_targets(op)": lambda: registered_targets("RMSNormFwdOp"),
    "load_failures()": lambda: load_failures(),
    "set_default_target(None)": lambda: set_default_target(None),
    "default_target()": lambda: default_target(),
}


@pytest.mark.parametrize("read", sorted(READS))
def test_a_registry_read_before_any_op_runs_discovery_first(site, read):
    site.backend("acme", good("acme"))
    assert site.events() == []
    READS[read]()
    assert site.imports_of("acme") == 1


def test_set_default_target_sees_a_backend_that_was_not_discovered_yet(site):
    site.backend("acme", good("acme"))
    set_default_target("acme")  # the first read: discovery must run before the check
    assert default_target() == "acme"


def test_discovery_runs_once_per_process(site):
    site.backend("acme", good("acme"))
    for _ in range(3):
        registered_targets()
        load_failures()
        default_target()
        rms_op()
    assert site.imports_of("acme") == 1


def test_concurrent_first_reads_discover_once_and_all_see_the_whole_registry(site):
    site.backend("acme", "import time\ntime.sleep(0.3)\n" + good("acme"))
    seen: list = []
    readers = [threading.Thread(target=lambda: seen.append(registered_targets()), daemon=True) for _ in range(4)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(timeout=30)
    assert seen == [["acme"]] * 4
    assert site.imports_of("acme") == 1


def test_a_backend_installed_after_discovery_is_not_picked_up(site):
    site.backend("acme", good("acme"))
    assert registered_targets() == ["acme"]
    site.backend("later", good("later"))
    assert registered_targets() == ["acme"]
    assert site.imports_of("later") == 0


def test_after_the_first_time_no_read_enumerates_entry_points_again(site, monkeypatch):
    site.backend("acme", good("acme"))
    registered_targets()

    def enumerating(*args, **kwargs):
        raise AssertionError("entry points enumerated again")

    monkeypatch.setattr(discovery, "_entry_points", enumerating)
    monkeypatch.setattr(importlib.metadata, "entry_points", enumerating)
    assert registered_targets() == ["acme"]
    assert load_failures() == []
    set_default_target(None)
    op = rms_op(target="acme")
    op(*rms_inputs())
    assert op.settled_target == "acme"


# ---- B3 ------------------------------------------------------------------------------


def _install_out_of_order(site, body: str) -> None:
    # Installed in neither name nor value order; two entry points share the name "mid".
    site.install("d1", {"zeta": "order_a"}, {"order_a": body})
    site.install("d2", {"mid": "order_m2"}, {"order_m2": body})
    site.install("d3", {"alpha": "order_z"}, {"order_z": body})
    site.install("d4", {"mid": "order_m1"}, {"order_m1": body})


def test_backends_load_in_entry_point_name_then_value_order(site):
    _install_out_of_order(site, "")
    registered_targets()
    assert [e for e in site.events() if e.startswith("imported")] == [
        "imported order_z",
        "imported order_m1",
        "imported order_m2",
        "imported order_a",
    ]


def test_load_failures_and_warnings_follow_the_same_fixed_order(site):
    _install_out_of_order(site, "raise RuntimeError('no')")
    caught = discover()
    expected = [
        "alpha (order_z): RuntimeError: no",
        "mid (order_m1): RuntimeError: no",
        "mid (order_m2): RuntimeError: no",
        "zeta (order_a): RuntimeError: no",
    ]
    assert load_failures() == expected
    messages = [str(w.message) for w in caught if w.category is RuntimeWarning]
    assert len(messages) == 4
    assert all(line in message for line, message in zip(expected, messages))


# ---- B4, B9 when nothing failed ------------------------------------------------------
# Backends that fail to load (B4-B7, B9) are tested in tests/reliability/test_broken_backends.py.


def test_load_failures_is_empty_when_every_backend_loaded(site):
    site.backend("acme", good("acme"))
    caught = discover()
    assert load_failures() == [] and caught == []


def test_without_failed_backends_no_error_carries_the_failure_note(site):
    site.backend("acme", good("acme"))
    with pytest.raises(UnknownTargetError) as raised:
        rms_op(target="nope")(*rms_inputs())
    assert str(raised.value) == "no backend registered target 'nope'; known targets: ['acme']"
