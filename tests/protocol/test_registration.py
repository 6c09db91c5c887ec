"""Registering detectors and builders (A3, A4, A5), reading the tables (A7) and the
process default target (A8)."""

from __future__ import annotations

import functools

import pytest
import torch
from _fake_backends import cpu_in_tree, name_of, rms_builder, rms_inputs, rms_op, rms_reference

from tileops.backend import (
    BUILTIN,
    BackendError,
    BuildKernel,
    UnknownTargetError,
    default_target,
    register_detector,
    register_kernel_builder,
    registered_targets,
    set_default_target,
)


def claims_cpu(device):
    return device.type == "cpu"


def also_claims_cpu(device):
    return device.type == "cpu"


def claims_nothing(device):
    return False


def build_rms_norm(x, weight, *, normalized_shape, eps):
    return functools.partial(rms_reference, normalized_shape=normalized_shape, eps=eps)


def build_rms_norm_too(x, weight, *, normalized_shape, eps):
    return functools.partial(rms_reference, normalized_shape=normalized_shape, eps=eps)


# ---- A3 ------------------------------------------------------------------------------


def test_a_second_detector_for_a_target_is_refused_naming_both_functions():
    register_detector("acme", claims_cpu)
    with pytest.raises(BackendError) as refused:
        register_detector("acme", also_claims_cpu)
    message = str(refused.value)
    assert "'acme'" in message
    assert name_of(claims_cpu) in message
    assert name_of(also_claims_cpu) in message
    assert name_of(claims_cpu) == f"{__name__}.claims_cpu"


def test_a_refused_second_detector_leaves_the_first_in_charge():
    register_detector("acme", claims_cpu)
    register_kernel_builder("RMSNormFwdOp", "acme", build_rms_norm)
    with pytest.raises(BackendError):
        register_detector("acme", claims_nothing)
    op = rms_op()
    op(*rms_inputs())
    assert op.settled_target == "acme"


# ---- A4 ------------------------------------------------------------------------------


def test_a_second_builder_for_one_op_and_target_is_a_misinstall_naming_both():
    register_kernel_builder("RMSNormFwdOp", "acme", build_rms_norm)
    with pytest.raises(BackendError) as refused:
        register_kernel_builder("RMSNormFwdOp", "acme", build_rms_norm_too)
    message = str(refused.value)
    assert "misinstall" in message
    assert name_of(build_rms_norm) in message
    assert name_of(build_rms_norm_too) in message
    assert "'acme'" in message and "RMSNormFwdOp" in message


def test_registering_the_very_same_builder_twice_is_still_a_misinstall():
    register_kernel_builder("RMSNormFwdOp", "acme", build_rms_norm)
    with pytest.raises(BackendError, match="misinstall") as refused:
        register_kernel_builder("RMSNormFwdOp", "acme", build_rms_norm)
    assert str(refused.value).count(name_of(build_rms_norm)) == 2


def test_one_builder_function_may_serve_several_ops_and_targets():
    register_kernel_builder("RMSNormFwdOp", "acme", build_rms_norm)
    register_kernel_builder("RMSNormFwdOp", "zenith", build_rms_norm)
    register_kernel_builder("SoftmaxFwdOp", "acme", build_rms_norm)
    assert registered_targets("RMSNormFwdOp") == ["acme", "zenith"]
    assert registered_targets("SoftmaxFwdOp") == ["acme"]


# ---- A5 ------------------------------------------------------------------------------


def test_plain_functions_are_a_complete_backend():
    register_detector("plain", claims_cpu)
    register_kernel_builder("RMSNormFwdOp", "plain", build_rms_norm)
    x, w = rms_inputs()
    op = rms_op()
    torch.testing.assert_close(op(x, w), rms_reference(x, w, normalized_shape=(64,), eps=1e-6))
    assert op.settled_target == "plain"


def test_callable_objects_without_any_base_class_serve_as_detector_builder_and_kernel():
    class Detector:
        def __call__(self, device):
            return device.type == "cpu"

    class Kernel:
        def __init__(self, normalized_shape, eps):
            self.normalized_shape, self.eps = normalized_shape, eps

        def __call__(self, x, w):
            return rms_reference(x, w, normalized_shape=self.normalized_shape, eps=self.eps)

    class Builder:
        def __call__(self, x, weight, *, normalized_shape, eps):
            return Kernel(normalized_shape, eps)

    for cls in (Detector, Kernel, Builder):
        assert cls.__mro__ == (cls, object)
    register_detector("objects", Detector())
    register_kernel_builder("RMSNormFwdOp", "objects", Builder())
    x, w = rms_inputs()
    op = rms_op()
    torch.testing.assert_close(op(x, w), rms_reference(x, w, normalized_shape=(64,), eps=1e-6))
    assert op.settled_target == "objects"


class _Norm:
    def __init__(self, normalized_shape, eps):
        self.normalized_shape, self.eps = normalized_shape, eps

    def run(self, x, w):
        return rms_reference(x, w, normalized_shape=self.normalized_shape, eps=self.eps)

    __call__ = run


KERNEL_SHAPES = {
    "lambda": lambda ns, eps: lambda x, w: rms_reference(x, w, normalized_shape=ns, eps=eps),
    "partial": lambda ns, eps: functools.partial(rms_reference, normalized_shape=ns, eps=eps),
    "bound method": lambda ns, eps: _Norm(ns, eps).run,
    "object with __call__": lambda ns, eps: _Norm(ns, eps),
}


@pytest.mark.parametrize("kind", sorted(KERNEL_SHAPES))
def test_a_builder_may_return_any_callable(kind):
    make = KERNEL_SHAPES[kind]
    register_detector("anycall", claims_cpu)
    register_kernel_builder(
        "RMSNormFwdOp",
        "anycall",
        lambda x, weight, *, normalized_shape, eps: make(normalized_shape, eps),
    )
    x, w = rms_inputs()
    expected = rms_reference(x, w, normalized_shape=(64,), eps=1e-6)
    torch.testing.assert_close(rms_op()(x, w), expected)


def test_build_kernel_is_a_structural_protocol_not_a_base_class():
    assert getattr(BuildKernel, "_is_protocol", False)
    assert not isinstance(build_rms_norm, type)  # a function, registered as is


# ---- A7 ------------------------------------------------------------------------------


def test_registered_targets_is_an_empty_list_when_nothing_is_installed():
    assert registered_targets() == []
    assert registered_targets("RMSNormFwdOp") == []


def test_registered_targets_lists_every_target_with_a_detector_or_a_builder_sorted():
    register_detector("zeta", claims_nothing)
    register_kernel_builder("SoftmaxFwdOp", "mid", build_rms_norm)  # a builder, no detector
    register_detector("alpha", claims_nothing)
    assert registered_targets() == ["alpha", "mid", "zeta"]


def test_registered_targets_for_an_op_lists_the_targets_with_its_builder_sorted():
    register_kernel_builder("RMSNormFwdOp", "zeta", build_rms_norm)
    register_detector("beta", claims_nothing)  # no builder: not listed for any op
    register_kernel_builder("SoftmaxFwdOp", "mid", build_rms_norm)
    register_kernel_builder("RMSNormFwdOp", "alpha", build_rms_norm)
    assert registered_targets("RMSNormFwdOp") == ["alpha", "zeta"]
    assert registered_targets("SoftmaxFwdOp") == ["mid"]
    assert registered_targets("GemmFwdOp") == []


# ---- A8 ------------------------------------------------------------------------------


def test_there_is_no_default_target_unless_a_program_sets_one():
    register_detector("acme", claims_cpu)
    assert default_target() is None


def test_a_registered_name_set_as_default_target_is_read_back():
    register_detector("acme", claims_nothing)
    set_default_target("acme")
    assert default_target() == "acme"


def test_a_target_known_only_by_its_builder_can_be_the_default():
    register_kernel_builder("RMSNormFwdOp", "builder_only", build_rms_norm)
    set_default_target("builder_only")
    assert default_target() == "builder_only"


def test_default_target_builtin_turns_replacement_off_process_wide():
    calls: list = []
    register_detector("acme", claims_cpu)
    register_kernel_builder("RMSNormFwdOp", "acme", rms_builder(calls, "acme"))
    set_default_target(BUILTIN)
    assert default_target() is BUILTIN
    op = rms_op(kernel_map=cpu_in_tree(calls))
    op(*rms_inputs())
    assert op.settled_target is BUILTIN
    assert calls == ["in-tree"]


def test_default_target_none_restores_device_detection():
    calls: list = []
    register_detector("acme", claims_cpu)
    register_kernel_builder("RMSNormFwdOp", "acme", rms_builder(calls, "acme"))
    register_kernel_builder("RMSNormFwdOp", "other", rms_builder(calls, "other"))
    set_default_target("other")
    set_default_target(None)
    assert default_target() is None
    op = rms_op()
    op(*rms_inputs())
    assert op.settled_target == "acme"
    assert calls == ["acme"]


def test_an_unregistered_default_target_is_refused_and_the_default_is_kept():
    register_detector("acme", claims_nothing)
    set_default_target("acme")
    with pytest.raises(UnknownTargetError, match=r"^no backend registered target 'nope'"):
        set_default_target("nope")
    assert default_target() == "acme"


@pytest.mark.parametrize(
    "junk",
    [42, b"acme", torch.device("cpu"), ["acme"], object()],
    ids=["int", "bytes", "device", "list", "object"],
)
def test_a_default_target_that_is_not_a_name_builtin_or_none_is_a_type_error(junk):
    register_detector("acme", claims_nothing)
    set_default_target("acme")
    with pytest.raises(TypeError):
        set_default_target(junk)
    assert default_target() == "acme"
