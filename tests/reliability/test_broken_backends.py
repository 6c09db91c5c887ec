"""Broken backends: each is a tiny package installed for real (a module plus a dist-info
folder declaring an entry point in ``tileops.backends``). Where the first discovery of a
process is what is tested, the scenario runs in a fresh interpreter.

Whatever breaks, tileops keeps working, the failure is visible (``load_failures()`` or the
error's text and notes), and nothing half-done stays behind.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from tileops.backend import (
    BackendError,
    OpNotAvailableError,
    default_target,
    load_failures,
    registered_targets,
)
from tileops.ops import LogSoftmaxFwdOp, SoftmaxFwdOp

from ._backends import explain, run_fresh

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


# ---- failing imports ---------------------------------------------------------------------


def test_a_backend_whose_import_fails_is_skipped_with_one_warning_and_one_load_failure(packages):
    packages.add("broken", 'raise ImportError("libacme.so: cannot open shared object file")')
    packages.add("healthy", HEALTHY.format(target="healthy"))

    with pytest.warns(RuntimeWarning) as record:
        targets = registered_targets()

    assert targets == ["healthy"]
    assert load_failures() == [
        "broken (broken): ImportError: libacme.so: cannot open shared object file"
    ]
    texts = [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]
    assert len(texts) == 1 and "broken" in texts[0] and "load_failures()" in texts[0]
    # tileops keeps working, through the healthy backend; no second warning later on.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        op = SoftmaxFwdOp(dim=-1)
        torch.testing.assert_close(op(x := torch.randn(3, 5)), torch.softmax(x, -1))
    assert op.settled_target == "healthy"


def test_a_backend_failing_midway_through_registering_leaves_nothing_behind(packages):
    packages.add(
        "half_done",
        """
        import torch
        from tileops.backend import (
            register_detector, register_kernel_builder, set_default_target,
        )
        register_detector("half", lambda device: device.type == "cpu")
        register_kernel_builder("SoftmaxFwdOp", "half", lambda x, *, dim: torch.softmax)
        set_default_target("half")
        raise RuntimeError("cannot find the device firmware")
    """,
    )
    # Sorted after it: registers the very same target name, which only works if the first
    # backend's detector was really removed (a second detector for a target is an error).
    packages.add(
        "z_half_again",
        """
        from tileops.backend import register_detector
        register_detector("half", lambda device: False)
    """,
    )

    with pytest.warns(RuntimeWarning, match="half_done"):
        targets = registered_targets()

    assert targets == ["half"]
    assert registered_targets("SoftmaxFwdOp") == [], "the builder was not rolled back"
    assert default_target() is None, "the default target was not rolled back"
    assert load_failures() == [
        "half_done (half_done): RuntimeError: cannot find the device firmware"
    ]
    # No target claims the CPU now: the call goes to the in-tree kernels (CUDA only).
    with pytest.raises(ValueError, match="SoftmaxKernel is a CUDA kernel; got x on cpu.$"):
        SoftmaxFwdOp(dim=-1)(x())


_INTERRUPTED = """
import tileops
from tileops.backend import load_failures, registered_targets
from tileops.backend.registry import _registry
from tileops.ops import SoftmaxFwdOp

try:
    SoftmaxFwdOp(dim=-1)
    interrupted = False
except KeyboardInterrupt:
    interrupted = True
# Read the tables directly: a public read would start discovery again.
after_interrupt = _registry.targets()
default_after_interrupt = list(_registry.default_target())
targets = registered_targets()   # discovery is retried here
report(interrupted=interrupted, after_interrupt=after_interrupt,
       default_after_interrupt=default_after_interrupt, targets=targets,
       failures=load_failures(), default=list(_registry.default_target()))
"""

_INTERRUPT_ONCE = """
    import pathlib
    from tileops.backend import register_detector, set_default_target
    register_detector("b", lambda device: False)
    set_default_target("b")
    marker = pathlib.Path(__file__).with_suffix(".interrupted")
    if not marker.exists():
        marker.write_text("once")
        raise KeyboardInterrupt   # Ctrl-C while the backend is importing
"""


def _detector_only(target: str) -> str:
    return f"""
        from tileops.backend import register_detector
        register_detector("{target}", lambda device: False)
    """


def test_a_keyboard_interrupt_during_an_import_reaches_the_caller_and_discovery_can_be_retried(
    fresh_packages,
):
    fresh_packages.add("a_first", _detector_only("a"))
    fresh_packages.add("b_interrupted", _INTERRUPT_ONCE)
    fresh_packages.add("c_last", _detector_only("c"))

    result = run_fresh(_INTERRUPTED, fresh_packages)

    assert result["_rc"] == 0, explain(result)
    assert result["interrupted"], "the KeyboardInterrupt did not reach the caller"
    # The interrupted backend was rolled back, its default target included.
    assert result["after_interrupt"] == ["a"]
    assert result["default_after_interrupt"] == ["none", ""]
    # The retry completes discovery: the interrupted backend loads, the last one too.
    assert result["targets"] == ["a", "b", "c"]
    assert result["failures"] == []
    assert result["default"] == ["named", "b"]
    assert fresh_packages.imports_of("a_first") == 1
    assert fresh_packages.imports_of("b_interrupted") == 2
    assert fresh_packages.imports_of("c_last") == 1


def test_a_backend_that_failed_before_an_interrupted_import_is_listed_once_after_the_retry(
    fresh_packages,
):
    fresh_packages.add("a_broken", 'raise ImportError("no driver")')
    fresh_packages.add("b_interrupted", _INTERRUPT_ONCE)
    fresh_packages.add("c_last", _detector_only("c"))

    result = run_fresh(_INTERRUPTED, fresh_packages)

    assert result["_rc"] == 0, explain(result)
    assert result["interrupted"] and result["targets"] == ["b", "c"]
    assert result["failures"] == ["a_broken (a_broken): ImportError: no driver"]


def test_with_warnings_as_errors_a_failing_backend_does_not_leave_a_later_one_unloaded(
    fresh_packages,
):
    fresh_packages.add("a_broken", 'raise ImportError("no driver")')
    fresh_packages.add("b_broken", 'raise OSError("no device node")')
    fresh_packages.add("c_healthy", HEALTHY.format(target="c"))

    result = run_fresh(
        """
        from tileops.backend import load_failures, registered_targets
        try:
            registered_targets()
            warning = None
        except RuntimeWarning as error:      # -W error turned the first warning into this
            warning = str(error)
        report(warning=warning, targets=registered_targets(), failures=load_failures())
    """,
        fresh_packages,
        flags=("-W", "error"),
    )

    assert result["_rc"] == 0, explain(result)
    assert result["warning"] is not None and "a_broken" in result["warning"]
    assert result["targets"] == ["c"], "a backend after the failing ones was left unloaded"
    assert result["failures"] == [
        "a_broken (a_broken): ImportError: no driver",
        "b_broken (b_broken): OSError: no device node",
    ]
    assert fresh_packages.imports_of("c_healthy") == 1


def test_two_packages_claiming_one_op_and_target_make_the_second_a_misinstall_load_failure(
    packages,
):
    packages.add("acme_a", HEALTHY.format(target="acme"))
    packages.add(
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
    # The second package is rolled back whole; the first one serves.
    assert registered_targets("LogSoftmaxFwdOp") == []
    op = SoftmaxFwdOp(dim=-1)
    torch.testing.assert_close(op(t := x()), torch.softmax(t, -1))
    assert op.settled_target == "acme"


# ---- failures at call time ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "cause"),
    [
        ('raise RuntimeError("driver query failed")', RuntimeError),
        ("return None", TypeError),  # a detector must answer True or False
    ],
    ids=["raises", "answers None"],
)
def test_a_broken_detector_is_a_backend_error_naming_target_and_detector_chained_to_the_cause(
    packages, body, cause
):
    packages.add(
        "moody",
        f"""
        from tileops.backend import register_detector

        def detect(device):
            {body}

        register_detector("moody", detect)
    """,
    )
    op = SoftmaxFwdOp(dim=-1)

    with pytest.raises(BackendError) as info:
        op(x())

    text = str(info.value)
    assert "'moody'" in text and "moody.detect" in text and "'cpu'" in text
    assert isinstance(info.value.__cause__, cause)
    assert op.settled_target is None
    assert load_failures() == []  # it loaded fine; the failure is in the error text


@pytest.mark.parametrize("failure", [RuntimeError, KeyboardInterrupt])
def test_a_raising_builder_pins_nothing_and_the_next_call_retries(packages, failure):
    packages.add(
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
        assert notes(info.value) == [
            "raised by the kernel builder of target 'crashy' for SoftmaxFwdOp"
        ]
    assert op.settled_target is None
    assert op.kernel_cache_stats()["size"] == 0
    torch.testing.assert_close(op(t := x()), torch.softmax(t, -1))
    assert op.settled_target == "crashy"
    import crashy

    assert len(crashy.attempts) == 2


def test_a_builder_returning_a_non_callable_is_an_error_naming_target_object_op_and_role(
    packages,
):
    packages.add(
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


def test_a_raising_kernel_reaches_the_caller_with_the_target_named_in_a_note(packages):
    packages.add(
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
        assert notes(info.value) == [
            "raised by the kernel that target 'angry' built for LogSoftmaxFwdOp"
        ], call
