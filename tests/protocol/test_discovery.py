"""Discovery through the entry-point group ``tileops.backends`` (B1-B6, B9), in this
process: each test installs real distributions in a site directory on ``sys.path`` and
starts from an undiscovered, empty registry (tests/conftest.py)."""

from __future__ import annotations

import importlib.metadata
import textwrap
import threading
import warnings

import pytest

from tileops.backend import (
    BUILTIN,
    AmbiguousTargetError,
    BackendError,
    OpNotAvailableError,
    UnknownTargetError,
    default_target,
    discovery,
    load_failures,
    register_detector,
    register_kernel_builder,
    registered_targets,
    set_default_target,
)

from ._support import cpu_in_tree, rms_inputs, rms_op

CLAIMS_CPU = """
register_detector({target!r}, lambda device: device.type == "cpu")
"""

NOTE = " (1 backend(s) failed to load; see tileops.backend.load_failures())"


def good(target: str) -> str:
    """A backend body registering ``target`` (claims nothing) with an RMSNorm builder."""
    return textwrap.dedent(f"""
    import torch

    register_detector({target!r}, lambda device: False)

    def build_rms_norm(x, weight, *, normalized_shape, eps):
        return lambda x, w: torch.nn.functional.rms_norm(x, tuple(normalized_shape), w, eps)

    register_kernel_builder("RMSNormFwdOp", {target!r}, build_rms_norm)
    """)


def discover() -> list[warnings.WarningMessage]:
    """Run discovery (through a registry read) and return the warnings it issued."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        registered_targets()
    return list(caught)


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
    readers = [
        threading.Thread(target=lambda: seen.append(registered_targets()), daemon=True)
        for _ in range(4)
    ]
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


# ---- B4 ------------------------------------------------------------------------------


def test_a_backend_whose_import_raises_is_skipped_and_the_others_load(site):
    site.backend("broken", "raise ValueError('kaput')")
    site.backend("acme", good("acme"))
    discover()
    assert registered_targets() == ["acme"]
    op = rms_op(target="acme")
    op(*rms_inputs())
    assert op.settled_target == "acme"


def test_tileops_keeps_working_when_its_only_backend_fails_to_load(site):
    site.backend("broken", "raise ValueError('kaput')")
    with pytest.warns(RuntimeWarning):
        op = rms_op(kernel_map=cpu_in_tree())
    op(*rms_inputs())
    assert op.settled_target is BUILTIN and registered_targets() == []


def test_each_failed_backend_gives_exactly_one_runtime_warning_pointing_to_load_failures(site):
    site.backend("broken_one", "raise ValueError('kaput')")
    site.backend("broken_two", "import not_installed_anywhere")
    site.backend("acme", good("acme"))
    caught = discover()
    assert [w.category for w in caught] == [RuntimeWarning, RuntimeWarning]
    for warning, name in zip(caught, ["broken_one", "broken_two"]):
        text = str(warning.message)
        assert "failed to load" in text and "load_failures()" in text and name in text


def test_a_failed_backend_warns_only_once_however_often_the_registry_is_read(site):
    site.backend("broken", "raise ValueError('kaput')")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            registered_targets()
            load_failures()
            rms_op()
    assert len([w for w in caught if w.category is RuntimeWarning]) == 1


def test_load_failures_has_one_line_per_failure_in_the_documented_format(site):
    site.install("d1", {"broken": "broken_mod"}, {"broken_mod": "raise ValueError('kaput')"})
    site.install(
        "d2",
        {"needs_dep": "needs_dep_mod:thing"},
        {"needs_dep_mod": "import not_installed_anywhere"},
    )
    site.install("d3", {"ghost": "no_such_module"}, {})
    site.backend("acme", good("acme"))
    discover()
    assert load_failures() == [
        "broken (broken_mod): ValueError: kaput",
        "ghost (no_such_module): ModuleNotFoundError: No module named 'no_such_module'",
        "needs_dep (needs_dep_mod:thing): ModuleNotFoundError: "
        "No module named 'not_installed_anywhere'",
    ]


def test_load_failures_is_empty_when_every_backend_loaded(site):
    site.backend("acme", good("acme"))
    caught = discover()
    assert load_failures() == [] and caught == []


# ---- B5 ------------------------------------------------------------------------------


def test_a_backend_that_fails_midway_registers_nothing(site):
    site.backend(
        "half",
        """
        register_detector("half", lambda device: device.type == "cpu")
        register_kernel_builder("RMSNormFwdOp", "half", lambda *specs, **params: None)
        register_kernel_builder("SoftmaxFwdOp", "half", lambda *specs, **params: None)
        set_default_target("half")
        raise RuntimeError("midway")
        """,
    )
    discover()
    assert registered_targets() == []
    assert registered_targets("RMSNormFwdOp") == []
    assert registered_targets("SoftmaxFwdOp") == []
    assert default_target() is None
    assert load_failures() == ["half (half): RuntimeError: midway"]


def test_a_rolled_back_backend_restores_the_default_an_earlier_backend_set(site):
    site.backend("a_first", good("first") + "\nset_default_target('first')\n")
    site.backend(
        "b_half",
        """
        register_detector("half", lambda device: False)
        set_default_target("half")
        raise RuntimeError("midway")
        """,
    )
    discover()
    assert default_target() == "first"
    assert registered_targets() == ["first"]


def test_a_rolled_back_backend_leaves_its_target_free_for_a_later_backend(site):
    site.backend(
        "a_half",
        """
        register_detector("shared", lambda device: False)
        register_kernel_builder("RMSNormFwdOp", "shared", lambda *specs, **params: None)
        raise RuntimeError("midway")
        """,
    )
    site.backend("b_full", good("shared"))
    discover()
    assert load_failures() == ["a_half (a_half): RuntimeError: midway"]
    assert registered_targets("RMSNormFwdOp") == ["shared"]


def test_a_second_package_claiming_a_target_fails_as_a_misinstall_and_leaves_the_first_intact(site):
    site.backend("a_one", good("acme"))
    site.backend(
        "b_two",
        """
        register_kernel_builder("SoftmaxFwdOp", "acme", lambda *specs, **params: None)
        register_kernel_builder("RMSNormFwdOp", "acme", lambda *specs, **params: None)
        """,
    )
    discover()
    (line,) = load_failures()
    assert line.startswith("b_two (b_two): BackendError: ") and "misinstall" in line
    assert registered_targets("SoftmaxFwdOp") == []
    assert registered_targets("RMSNormFwdOp") == ["acme"]


# ---- B6 ------------------------------------------------------------------------------

INTERRUPTED_ONCE = """
import pathlib

register_detector("flaky", lambda device: False)
register_kernel_builder("RMSNormFwdOp", "flaky", lambda *specs, **params: None)
marker = pathlib.Path({marker!r})
if not marker.exists():
    marker.write_text("interrupted once")
    raise {error}
log("flaky completed")
"""

TRIGGERS = {"registry read": lambda: registered_targets(), "op construction": lambda: rms_op()}


@pytest.mark.parametrize("trigger", sorted(TRIGGERS))
@pytest.mark.parametrize("error", ["KeyboardInterrupt", "SystemExit"])
def test_an_interrupt_during_discovery_reaches_the_caller(site, tmp_path, error, trigger):
    site.backend("b_flaky", INTERRUPTED_ONCE.format(marker=str(tmp_path / "marker"), error=error))
    with pytest.raises({"KeyboardInterrupt": KeyboardInterrupt, "SystemExit": SystemExit}[error]):
        TRIGGERS[trigger]()


@pytest.mark.parametrize("error", ["KeyboardInterrupt", "SystemExit"])
def test_an_interrupted_discovery_is_rolled_back_and_retried_by_the_next_read(
    site, tmp_path, error
):
    site.backend("a_before", good("before"))
    site.backend("b_flaky", INTERRUPTED_ONCE.format(marker=str(tmp_path / "marker"), error=error))
    site.backend("c_after", good("after"))
    with pytest.raises(BaseException) as interrupted:
        registered_targets()
    assert type(interrupted.value).__name__ == error
    # The retry imports b_flaky again: had its first registrations survived, the second
    # would be refused as duplicates and show up in load_failures().
    assert registered_targets() == ["after", "before", "flaky"]
    assert load_failures() == []
    assert site.imports_of("b_flaky") == 2
    assert "flaky completed" in site.events()
    assert site.imports_of("a_before") == 1 and site.imports_of("c_after") == 1


def test_an_interrupt_is_not_recorded_as_a_load_failure(site, tmp_path):
    site.backend(
        "b_flaky", INTERRUPTED_ONCE.format(marker=str(tmp_path / "m"), error="KeyboardInterrupt")
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(KeyboardInterrupt):
            registered_targets()
        assert load_failures() == []
    assert caught == []


# ---- B9 ------------------------------------------------------------------------------


@pytest.fixture
def one_failed(site):
    """A broken backend and a working ``torch_cpu`` (claims the CPU, builds RMSNorm)."""
    site.backend("broken", "raise ValueError('kaput')")
    site.backend(
        "torch_cpu",
        """
        import torch

        register_detector("torch_cpu", lambda device: device.type == "cpu")
        register_kernel_builder(
            "RMSNormFwdOp", "torch_cpu",
            lambda x, weight, *, normalized_shape, eps:
                lambda x, w: torch.nn.functional.rms_norm(x, tuple(normalized_shape), w, eps),
        )
        """,
    )
    with pytest.warns(RuntimeWarning):
        registered_targets()
    assert len(load_failures()) == 1


def test_with_a_failed_backend_an_unknown_target_error_ends_with_the_failure_note(one_failed):
    with pytest.raises(UnknownTargetError) as raised:
        rms_op(target="nope")(*rms_inputs())
    assert str(raised.value) == (
        "no backend registered target 'nope'; known targets: ['torch_cpu']" + NOTE
    )


def test_with_a_failed_backend_an_unknown_default_target_ends_with_the_failure_note(one_failed):
    with pytest.raises(UnknownTargetError) as raised:
        set_default_target("nope")
    assert str(raised.value) == (
        "no backend registered target 'nope'; known targets: ['torch_cpu']" + NOTE
    )


def test_with_a_failed_backend_an_ambiguity_error_ends_with_the_failure_note(one_failed):
    register_detector("also_cpu", lambda device: device.type == "cpu")
    with pytest.raises(AmbiguousTargetError) as raised:
        rms_op()(*rms_inputs())
    assert str(raised.value).endswith(NOTE)
    assert str(raised.value).count("failed to load") == 1


def test_with_a_failed_backend_a_detector_error_ends_with_the_failure_note(one_failed):
    def detect(device):
        raise RuntimeError("confused")

    register_detector("raiser", detect)
    with pytest.raises(BackendError) as raised:
        rms_op()(*rms_inputs())
    assert "raiser" in str(raised.value)
    assert str(raised.value).endswith(NOTE)


def test_the_failure_note_counts_every_failed_backend(site):
    site.backend("broken_one", "raise ValueError('kaput')")
    site.backend("broken_two", "raise ValueError('kaput')")
    discover()
    with pytest.raises(UnknownTargetError) as raised:
        rms_op(target="nope")(*rms_inputs())
    assert str(raised.value) == (
        "no backend registered target 'nope'; known targets: []"
        " (2 backend(s) failed to load; see tileops.backend.load_failures())"
    )


def test_an_op_not_available_error_never_carries_the_failure_note(one_failed):
    from tileops.ops import SoftmaxFwdOp

    with pytest.raises(OpNotAvailableError) as no_builder:
        SoftmaxFwdOp(dim=-1)(rms_inputs()[0])
    register_kernel_builder("SoftmaxFwdOp", "torch_cpu", lambda *specs, **params: 42)
    with pytest.raises(OpNotAvailableError) as not_callable:
        SoftmaxFwdOp(dim=-1)(rms_inputs()[0])
    for raised in (no_builder, not_callable):
        assert "failed to load" not in str(raised.value)
        assert "load_failures" not in str(raised.value)


def test_without_failed_backends_no_error_carries_the_failure_note(site):
    site.backend("acme", good("acme"))
    with pytest.raises(UnknownTargetError) as raised:
        rms_op(target="nope")(*rms_inputs())
    assert str(raised.value) == "no backend registered target 'nope'; known targets: ['acme']"
