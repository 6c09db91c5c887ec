"""Broken backends (B4-B7, B9, C3, and builders and kernels that fail: C4, C8, D6), each
behaviour tested once, here. Healthy discovery is in tests/protocol/test_discovery*.py.

A broken backend is a tiny package installed for real (a module plus a dist-info folder
declaring an entry point in ``tileops.backends``, see tests/_fake_backends.py); where the
first discovery of a process under ``-W error`` is what is tested, the scenario runs in a
fresh interpreter.

Whatever breaks, tileops keeps working, the failure is visible (``load_failures()`` or the
error's text and notes), and nothing half-done stays behind.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from _fake_backends import (
    cpu_in_tree,
    discover,
    good,
    rms_builder,
    rms_inputs,
    rms_op,
    run_fresh,
)

from tileops.backend import (
    BUILTIN,
    AmbiguousTargetError,
    BackendError,
    OpNotAvailableError,
    UnknownTargetError,
    default_target,
    load_failures,
    register_detector,
    register_kernel_builder,
    registered_targets,
    set_default_target,
)
from tileops.backend.registry import _registry
from tileops.ops import LogSoftmaxFwdOp, SoftmaxFwdOp

HEALTHY = """
    import torch
    from tileops.backend import register_detector, register_kernel_builder

    register_detector("{target}", lambda device: device.type == "cpu")

    def build_softmax(x, *, dim):
        return lambda x: torch.softmax(x, dim)

    register_kernel_builder("SoftmaxFwdOp", "{target}", build_softmax)
"""


def x() -> torch.Tensor:
    return torch.randn(3, 5)


def notes(error: BaseException) -> list[str]:
    return list(getattr(error, "__notes__", []))


# ---- B4: an import that fails --------------------------------------------------------


def test_each_backend_whose_import_fails_is_skipped_with_one_warning_and_one_load_failure(site):
    site.backend("broken", 'raise ImportError("libacme.so: cannot open shared object file")')
    site.backend("healthy", HEALTHY.format(target="healthy"))
    site.backend("missing_dep", "import not_installed_anywhere")

    caught = discover()

    assert registered_targets() == ["healthy"]
    assert load_failures() == [
        "broken (broken): ImportError: libacme.so: cannot open shared object file",
        "missing_dep (missing_dep): ModuleNotFoundError: No module named 'not_installed_anywhere'",
    ]
    # One RuntimeWarning per failed backend, in load order, and no other warning.
    assert [w.category for w in caught] == [RuntimeWarning, RuntimeWarning]
    for warning, name in zip(caught, ["broken", "missing_dep"]):
        text = str(warning.message)
        assert "failed to load" in text and "load_failures()" in text and name in text
    # tileops keeps working, through the healthy backend; no warning again, however often
    # the registry is read or an op is made.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            registered_targets()
            load_failures()
            op = SoftmaxFwdOp(dim=-1)
            torch.testing.assert_close(op(t := x()), torch.softmax(t, -1))
            assert op.settled_target == "healthy"


def test_tileops_keeps_working_when_its_only_backend_fails_to_load(site):
    site.backend("broken", "raise ValueError('kaput')")
    with pytest.warns(RuntimeWarning):
        op = rms_op(kernel_map=cpu_in_tree())
    op(*rms_inputs())
    assert op.settled_target is BUILTIN and registered_targets() == []


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
        "needs_dep (needs_dep_mod:thing): ModuleNotFoundError: No module named 'not_installed_anywhere'",
    ]


# ---- B5: all or nothing ----------------------------------------------------------------


def test_a_backend_that_fails_midway_registers_nothing(site):
    site.backend(
        "half_done",
        """
        register_detector("half", lambda device: device.type == "cpu")
        register_kernel_builder("RMSNormFwdOp", "half", lambda *specs, **params: None)
        register_kernel_builder("SoftmaxFwdOp", "half", lambda *specs, **params: None)
        set_default_target("half")
        raise RuntimeError("cannot find the device firmware")
        """,
    )

    with pytest.warns(RuntimeWarning, match="half_done"):
        targets = registered_targets()

    assert targets == []
    assert registered_targets("RMSNormFwdOp") == []
    assert registered_targets("SoftmaxFwdOp") == [], "the builders were not rolled back"
    assert default_target() is None, "the default target was not rolled back"
    assert load_failures() == ["half_done (half_done): RuntimeError: cannot find the device firmware"]
    # No target claims the CPU now: the call goes to the in-tree kernels (CUDA only), and
    # their error does not say another target serves the CPU.
    with pytest.raises(ValueError, match="SoftmaxKernel is a CUDA kernel; got x on cpu.$"):
        SoftmaxFwdOp(dim=-1)(x())


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
    # The later backend registers the very same detector and builder: that only works if
    # the first one's were really removed (a second one for a target is an error).
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
    assert registered_targets() == ["shared"]
    assert registered_targets("RMSNormFwdOp") == ["shared"]


def test_two_packages_claiming_one_op_and_target_make_the_second_a_misinstall_load_failure(site):
    site.backend("acme_a", HEALTHY.format(target="acme"))
    site.backend(
        "acme_b",
        """
        import torch
        from tileops.backend import register_kernel_builder
        register_kernel_builder("LogSoftmaxFwdOp", "acme", lambda x, *, dim: torch.log_softmax)
        register_kernel_builder("SoftmaxFwdOp", "acme", lambda x, *, dim: torch.softmax)
        """,
    )

    with pytest.warns(RuntimeWarning, match="acme_b"):
        failures = load_failures()

    (line,) = failures
    assert line.startswith("acme_b (acme_b): BackendError: ")
    assert "misinstall" in line and "SoftmaxFwdOp" in line
    assert "acme_a.build_softmax" in line, "the error names the builder already registered"
    # The second package is rolled back whole; the first one is intact and serves.
    assert registered_targets("LogSoftmaxFwdOp") == []
    assert registered_targets("SoftmaxFwdOp") == ["acme"]
    op = SoftmaxFwdOp(dim=-1)
    torch.testing.assert_close(op(t := x()), torch.softmax(t, -1))
    assert op.settled_target == "acme"


# ---- B6: an interrupt during discovery -------------------------------------------------

INTERRUPTED_ONCE = """
import pathlib

register_detector("flaky", lambda device: False)
register_kernel_builder("RMSNormFwdOp", "flaky", lambda *specs, **params: None)
set_default_target("flaky")
marker = pathlib.Path({marker!r})
if not marker.exists():
    marker.write_text("interrupted once")
    raise {error}   # e.g. Ctrl-C while the backend is importing
log("flaky completed")
"""

INTERRUPTS = {"KeyboardInterrupt": KeyboardInterrupt, "SystemExit": SystemExit}
TRIGGERS = {"registry read": lambda: registered_targets(), "op construction": lambda: rms_op()}


@pytest.mark.parametrize("trigger", sorted(TRIGGERS))
@pytest.mark.parametrize("error", sorted(INTERRUPTS))
def test_an_interrupt_during_discovery_reaches_the_caller_rolls_back_and_leaves_it_retryable(
    site, tmp_path, error, trigger
):
    site.backend("a_before", good("before"))
    site.backend("b_flaky", INTERRUPTED_ONCE.format(marker=str(tmp_path / "marker"), error=error))
    site.backend("c_after", good("after"))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(INTERRUPTS[error]):
            TRIGGERS[trigger]()
        # Read the tables directly (a public read would start discovery again): b_flaky is
        # rolled back, its default target included, and c_after was not reached.
        assert _registry.targets() == ["before"]
        assert tuple(_registry.default_target()) == ("none", "")
        # The next read retries: b_flaky is imported again (had its first registrations
        # survived, the second would be refused as duplicates and be a load failure).
        assert registered_targets() == ["after", "before", "flaky"]
        assert load_failures() == []
    assert caught == [], "an interrupt is not a load failure: nothing warns"
    assert default_target() == "flaky"
    assert site.imports_of("b_flaky") == 2
    assert "flaky completed" in site.events()
    assert site.imports_of("a_before") == 1 and site.imports_of("c_after") == 1


def test_a_backend_that_failed_before_an_interrupted_import_is_listed_once_after_the_retry(site, tmp_path):
    site.backend("a_broken", 'raise ImportError("no driver")')
    site.backend(
        "b_flaky",
        INTERRUPTED_ONCE.format(marker=str(tmp_path / "marker"), error="KeyboardInterrupt"),
    )
    site.backend("c_after", good("after"))

    with pytest.raises(KeyboardInterrupt):
        SoftmaxFwdOp(dim=-1)
    with pytest.warns(RuntimeWarning, match="a_broken"):
        targets = registered_targets()  # discovery is retried here

    assert targets == ["after", "flaky"]
    assert load_failures() == ["a_broken (a_broken): ImportError: no driver"]


# ---- B7: -W error --------------------------------------------------------------------


@pytest.mark.subprocess
def test_with_warnings_as_errors_a_failing_backend_does_not_leave_a_later_one_unloaded(
    fresh_site,
):
    fresh_site.backend("a_broken", 'raise ImportError("no driver")')
    fresh_site.backend("b_broken", 'raise OSError("no device node")')
    fresh_site.backend("c_healthy", HEALTHY.format(target="c"))

    result = run_fresh(
        """
        import warnings
        from tileops.backend import load_failures, registered_targets
        try:
            registered_targets()
            warning = None
        except RuntimeWarning as error:      # -W error turned the first warning into this
            warning = str(error)
        report(
            warnings_are_errors=any(f[0] == "error" for f in warnings.filters),
            warning=warning,
            targets=registered_targets(),
            failures=load_failures(),
        )
        """,
        site=fresh_site,
        flags=("-W", "error"),
    )

    assert result["warnings_are_errors"] is True
    assert result["warning"] is not None
    assert "a_broken" in result["warning"] and "load_failures()" in result["warning"]
    assert result["targets"] == ["c"], "a backend after the failing ones was left unloaded"
    assert result["failures"] == [
        "a_broken (a_broken): ImportError: no driver",
        "b_broken (b_broken): OSError: no device node",
    ]
    assert fresh_site.imports_of("c_healthy") == 1


# ---- B9: the failure note --------------------------------------------------------------

NOTE = " (1 backend(s) failed to load; see tileops.backend.load_failures())"


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
    assert str(raised.value) == ("no backend registered target 'nope'; known targets: ['torch_cpu']" + NOTE)


def test_with_a_failed_backend_an_unknown_default_target_ends_with_the_failure_note(one_failed):
    with pytest.raises(UnknownTargetError) as raised:
        set_default_target("nope")
    assert str(raised.value) == ("no backend registered target 'nope'; known targets: ['torch_cpu']" + NOTE)


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
    with pytest.raises(OpNotAvailableError) as no_builder:
        SoftmaxFwdOp(dim=-1)(rms_inputs()[0])
    register_kernel_builder("SoftmaxFwdOp", "torch_cpu", lambda *specs, **params: 42)
    with pytest.raises(OpNotAvailableError) as not_callable:
        SoftmaxFwdOp(dim=-1)(rms_inputs()[0])
    for raised in (no_builder, not_callable):
        assert "failed to load" not in str(raised.value)
        assert "load_failures" not in str(raised.value)


# ---- C3: a broken detector -------------------------------------------------------------

# The broken detector's body: it raises ``original``, or answers something not a bool.
DETECTORS = {
    "raises": "raise original",
    "answers None": "return None",  # a detector must answer True or False
    "answers 1": "return 1",
    "answers 'cpu'": "return 'cpu'",
    "answers [True]": "return [True]",
}


@pytest.mark.parametrize("behaviour", list(DETECTORS))
def test_a_broken_detector_is_a_backend_error_naming_target_and_detector_chained_to_the_cause(site, behaviour):
    site.backend(
        "moody",
        f"""
        original = RuntimeError("driver query failed")

        def detect(device):
            {DETECTORS[behaviour]}

        register_detector("moody", detect)
        """,
    )
    site.backend(  # claims the CPU too: the broken detector is not skipped in its favour
        "fine",
        """
        import torch

        builds = []
        register_detector("fine", lambda device: device.type == "cpu")

        def build_softmax(x, *, dim):
            builds.append(x)
            return lambda x: torch.softmax(x, dim)

        register_kernel_builder("SoftmaxFwdOp", "fine", build_softmax)
        """,
    )
    op = SoftmaxFwdOp(dim=-1)

    with pytest.raises(BackendError) as info:
        op(x())

    text = str(info.value)
    assert "'moody'" in text and "moody.detect" in text and "'cpu'" in text
    import fine
    import moody

    if behaviour == "raises":
        assert info.value.__cause__ is moody.original
    else:
        assert isinstance(info.value.__cause__, TypeError)
        answer = DETECTORS[behaviour].removeprefix("return ")
        assert answer in text + str(info.value.__cause__)
    assert fine.builds == []
    assert op.settled_target is None
    assert load_failures() == []  # it loaded fine; the failure is in the error text


# ---- C4, C8: a builder that raises -----------------------------------------------------


@pytest.mark.parametrize("failure", [RuntimeError, KeyboardInterrupt])
def test_a_raising_builder_pins_nothing_and_the_next_call_retries(site, failure):
    site.backend(
        "crashy",
        f"""
        import torch
        from tileops.backend import register_detector, register_kernel_builder

        attempts = []
        register_detector("crashy", lambda device: device.type == "cpu")

        def build_softmax(x, *, dim):
            attempts.append(x)
            if len(attempts) == 1:
                raise {failure.__name__}("compiler crashed")
            return lambda x: torch.softmax(x, dim)

        register_kernel_builder("SoftmaxFwdOp", "crashy", build_softmax)
        """,
    )
    op = SoftmaxFwdOp(dim=-1)

    with pytest.raises(failure, match="compiler crashed") as info:
        op(x())

    if failure is RuntimeError:
        assert notes(info.value) == ["raised by the kernel builder of target 'crashy' for SoftmaxFwdOp"]
    assert op.settled_target is None
    assert op.kernel_cache_stats()["size"] == 0
    torch.testing.assert_close(op(t := x()), torch.softmax(t, -1))
    assert op.settled_target == "crashy"
    import crashy

    assert len(crashy.attempts) == 2


def test_a_raising_builder_falls_back_to_nothing():
    calls = []

    def build_fussy(x, weight, *, normalized_shape, eps):
        calls.append("fussy")
        raise ValueError(f"fussy rms_norm needs float32, got dtype {x.dtype}")

    register_detector("fussy", lambda device: device.type == "cpu")
    register_kernel_builder("RMSNormFwdOp", "fussy", build_fussy)
    register_kernel_builder("RMSNormFwdOp", "spare", rms_builder(calls, "spare"))
    with pytest.raises(ValueError, match="fussy rms_norm needs float32"):
        rms_op(kernel_map=cpu_in_tree(calls))(*rms_inputs())
    assert calls == ["fussy"]  # neither the spare target nor the in-tree kernel


# ---- D6: a builder returning something that is not a kernel ----------------------------


def test_a_builder_returning_a_non_callable_is_an_error_naming_target_object_op_and_role(site):
    site.backend(
        "lazy",
        """
        from tileops.backend import register_detector, register_kernel_builder
        builds = []
        register_detector("lazy", lambda device: device.type == "cpu")

        def build_softmax(x, *, dim):
            builds.append(x)
            return 42   # forgot to return the kernel

        register_kernel_builder("SoftmaxFwdOp", "lazy", build_softmax)
        """,
    )
    op = SoftmaxFwdOp(dim=-1)

    for _attempt in (1, 2):
        with pytest.raises(OpNotAvailableError) as info:
            op(x())
        text = str(info.value)
        assert "'lazy'" in text and "42" in text and "SoftmaxFwdOp" in text
        assert "'softmax_fwd'" in text and "not callable" in text
        assert op.settled_target is None and op.kernel_cache_stats()["size"] == 0
    import lazy

    assert len(lazy.builds) == 2, "a rejected kernel is not memoized: the next call rebuilds"


# ---- a kernel that raises ----------------------------------------------------------------


def test_a_raising_kernel_reaches_the_caller_with_the_target_named_in_a_note(site):
    site.backend(
        "angry",
        """
        from tileops.backend import register_detector, register_kernel_builder
        register_detector("angry", lambda device: device.type == "cpu")

        class TileError(ValueError):
            pass

        def build_log_softmax(x, *, dim):
            def kernel(x):
                raise TileError(f"no tile config for {tuple(x.shape)}")
            return kernel

        register_kernel_builder("LogSoftmaxFwdOp", "angry", build_log_softmax)
        """,
    )
    op = LogSoftmaxFwdOp(dim=-1)

    for call in ("first call (memo miss)", "second call (memo hit)"):
        with pytest.raises(ValueError, match=r"no tile config for \(3, 5\)") as info:
            op(x())
        assert type(info.value).__name__ == "TileError", f"{call}: the kernel's own error"
        assert notes(info.value) == ["raised by the kernel that target 'angry' built for LogSoftmaxFwdOp"], call
