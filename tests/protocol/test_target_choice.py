"""Choosing a target, layer one (C1, C2, C5, C6, C8; C4 where it is about the choice).
A broken detector (C3) or builder is in tests/reliability/test_broken_backends.py.

The op is RMSNormFwdOp on CPU (or ``meta``) tensors; fake targets claim those devices.
The in-tree RMSNorm kernel is a CUDA kernel: on CPU, choosing it shows as its
``ValueError``, or as a call of a CPU ``kernel_map`` factory standing in for it.
"""

from __future__ import annotations

import pytest
import torch
from _fake_backends import CUDA_ONLY_ON_CPU, cpu_in_tree, rms_builder, rms_inputs, rms_op

from tileops.backend import (
    BUILTIN,
    AmbiguousTargetError,
    OpNotAvailableError,
    UnknownTargetError,
    register_detector,
    register_kernel_builder,
    set_default_target,
)


def claims(device_type: str):
    return lambda device: device.type == device_type


def never(device):
    return False


@pytest.fixture
def calls():
    """What got built, in order: a target's tag or "in-tree"."""
    return []


@pytest.fixture
def three_targets(calls):
    """``det`` claims the CPU; ``dflt`` and ``ctor`` claim nothing; all three build."""
    for target, detect in (("det", claims("cpu")), ("dflt", never), ("ctor", never)):
        register_detector(target, detect)
        register_kernel_builder("RMSNormFwdOp", target, rms_builder(calls, target))


def first_call(op):
    op(*rms_inputs())
    return op.settled_target


# ---- C1 ------------------------------------------------------------------------------


def test_without_target_or_default_device_detection_decides(three_targets, calls):
    assert first_call(rms_op()) == "det"
    assert calls == ["det"]


def test_the_process_default_beats_device_detection(three_targets, calls):
    set_default_target("dflt")
    assert first_call(rms_op()) == "dflt"
    assert calls == ["dflt"]


def test_the_constructors_target_beats_the_process_default(three_targets, calls):
    set_default_target("dflt")
    assert first_call(rms_op(target="ctor")) == "ctor"
    assert calls == ["ctor"]


def test_the_constructors_target_beats_a_builtin_default(three_targets, calls):
    set_default_target(BUILTIN)
    assert first_call(rms_op(target="ctor")) == "ctor"
    assert calls == ["ctor"]


def test_target_builtin_in_the_constructor_beats_the_process_default(three_targets, calls):
    set_default_target("dflt")
    assert first_call(rms_op(target=BUILTIN, kernel_map=cpu_in_tree(calls))) is BUILTIN
    assert calls == ["in-tree"]


def test_target_builtin_forces_the_in_tree_kernel_although_a_target_claims_the_cpu(three_targets, calls):
    op = rms_op(target=BUILTIN)
    with pytest.raises(ValueError) as raised:
        first_call(op)
    assert str(raised.value).startswith(CUDA_ONLY_ON_CPU)
    assert calls == [] and op.settled_target is None


def test_a_builtin_default_forces_the_in_tree_kernel_although_a_target_claims_the_cpu(three_targets, calls):
    set_default_target(BUILTIN)
    with pytest.raises(ValueError) as raised:
        first_call(rms_op())
    assert str(raised.value).startswith(CUDA_ONLY_ON_CPU)
    assert calls == []


def test_a_named_target_skips_device_detection_entirely(calls):
    def exploding(device):
        raise AssertionError("detection ran")

    register_detector("exploding", exploding)
    register_detector("named", never)
    register_kernel_builder("RMSNormFwdOp", "named", rms_builder(calls, "named"))
    assert first_call(rms_op(target="named")) == "named"
    set_default_target("named")
    assert first_call(rms_op()) == "named"


def test_precedence_is_decided_per_op_instance(three_targets, calls):
    pinned, detected = rms_op(target="ctor"), rms_op()
    assert (first_call(pinned), first_call(detected)) == ("ctor", "det")


# ---- C2 ------------------------------------------------------------------------------


@pytest.mark.parametrize("device_type", ["cpu", "meta"])
def test_every_detector_receives_the_inputs_device_object_untouched(device_type):
    received: dict[str, list] = {"first": [], "second": [], "third": []}

    def recorder(name, answer):
        def detect(device):
            received[name].append(device)
            return answer

        return detect

    register_detector("first", recorder("first", True))
    register_detector("second", recorder("second", False))
    register_detector("third", recorder("third", False))
    register_kernel_builder("RMSNormFwdOp", "first", lambda *s, **p: lambda x, w: torch.empty_like(x))
    x, w = rms_inputs(device_type)
    rms_op()(x, w)
    (first,), (second,), (third,) = received["first"], received["second"], received["third"]
    assert first is second is third  # one object, handed to every detector
    assert type(first) is torch.device
    assert first == x.device and first.type == x.device.type and first.index == x.device.index


def test_exactly_one_claimant_serves_the_call():
    register_detector("on_cpu", claims("cpu"))
    register_detector("on_meta", claims("meta"))
    for target in ("on_cpu", "on_meta"):
        register_kernel_builder("RMSNormFwdOp", target, lambda *s, **p: lambda x, w: torch.empty_like(x))
    on_cpu, on_meta = rms_op(), rms_op()
    on_cpu(*rms_inputs("cpu"))
    on_meta(*rms_inputs("meta"))
    assert (on_cpu.settled_target, on_meta.settled_target) == ("on_cpu", "on_meta")


def test_when_no_detector_claims_the_device_the_in_tree_kernels_serve(calls):
    register_detector("on_meta", claims("meta"))
    register_kernel_builder("RMSNormFwdOp", "on_meta", rms_builder(calls, "on_meta"))
    assert first_call(rms_op(kernel_map=cpu_in_tree(calls))) is BUILTIN
    assert calls == ["in-tree"]


def test_with_no_claimant_on_cpu_the_in_tree_kernel_says_it_is_a_cuda_kernel():
    register_detector("on_meta", claims("meta"))
    with pytest.raises(ValueError) as raised:
        first_call(rms_op())
    assert str(raised.value) == CUDA_ONLY_ON_CPU


def test_two_claimants_are_an_ambiguity_naming_them_sorted_and_asking_for_target(calls):
    register_detector("zeta", claims("cpu"))
    register_detector("mid", never)
    register_detector("alpha", claims("cpu"))
    for target in ("zeta", "mid", "alpha"):
        register_kernel_builder("RMSNormFwdOp", target, rms_builder(calls, target))
    op = rms_op(kernel_map=cpu_in_tree(calls))
    with pytest.raises(AmbiguousTargetError) as raised:
        first_call(op)
    message = str(raised.value)
    assert "['alpha', 'zeta']" in message
    assert "target=" in message and "'mid'" not in message
    assert calls == [] and op.settled_target is None


def test_an_ambiguity_is_settled_by_naming_the_target(calls):
    register_detector("zeta", claims("cpu"))
    register_detector("alpha", claims("cpu"))
    register_kernel_builder("RMSNormFwdOp", "zeta", rms_builder(calls, "zeta"))
    assert first_call(rms_op(target="zeta")) == "zeta"


# ---- C4 (the choice only) -------------------------------------------------------------


def test_a_later_default_does_not_reaim_a_settled_instance(three_targets, calls):
    op = rms_op()
    assert first_call(op) == "det"
    set_default_target("dflt")
    x, w = rms_inputs()
    op(x[:2], w)  # another shape: a memo miss, built again on the settled target
    assert op.settled_target == "det"
    assert calls == ["det", "det"]


# ---- C5 ------------------------------------------------------------------------------


def test_a_detector_registered_later_changes_the_answer_for_new_instances(calls):
    before = rms_op(kernel_map=cpu_in_tree(calls))
    assert first_call(before) is BUILTIN
    register_detector("late", claims("cpu"))
    register_kernel_builder("RMSNormFwdOp", "late", rms_builder(calls, "late"))
    assert first_call(rms_op(kernel_map=cpu_in_tree(calls))) == "late"
    assert calls == ["in-tree", "late"]


def test_each_new_instance_asks_the_detectors_again(calls):
    answer = {"claim": True, "asked": 0}

    def changeable(device):
        answer["asked"] += 1
        return answer["claim"]

    register_detector("changeable", changeable)
    register_kernel_builder("RMSNormFwdOp", "changeable", rms_builder(calls, "changeable"))
    assert first_call(rms_op(kernel_map=cpu_in_tree(calls))) == "changeable"
    answer["claim"] = False
    assert first_call(rms_op(kernel_map=cpu_in_tree(calls))) is BUILTIN
    assert answer["asked"] == 2


# ---- C6 ------------------------------------------------------------------------------


def test_an_unregistered_target_is_an_unknown_target_error_with_the_exact_text():
    register_detector("torch_cpu", claims("cpu"))
    with pytest.raises(UnknownTargetError) as raised:
        rms_op(target="nope")(*rms_inputs())
    assert str(raised.value) == "no backend registered target 'nope'; known targets: ['torch_cpu']"


def test_an_unregistered_default_target_is_the_same_unknown_target_error():
    register_detector("torch_cpu", claims("cpu"))
    with pytest.raises(UnknownTargetError) as raised:
        set_default_target("nope")
    assert str(raised.value) == "no backend registered target 'nope'; known targets: ['torch_cpu']"


# ---- C8 ------------------------------------------------------------------------------


@pytest.fixture
def a_without_builder(calls):
    """``a`` claims the CPU but builds nothing; ``b`` claims nothing and builds RMSNorm."""
    register_detector("a", claims("cpu"))
    register_detector("b", never)
    register_kernel_builder("RMSNormFwdOp", "b", rms_builder(calls, "b"))


CHOOSE_A = {
    "detection": lambda calls: rms_op(kernel_map=cpu_in_tree(calls)),
    "constructor": lambda calls: rms_op(target="a", kernel_map=cpu_in_tree(calls)),
    "default": lambda calls: (set_default_target("a"), rms_op(kernel_map=cpu_in_tree(calls)))[1],
}


@pytest.mark.parametrize("how", sorted(CHOOSE_A))
def test_a_chosen_target_without_a_builder_falls_back_to_nothing(a_without_builder, calls, how):
    op = CHOOSE_A[how](calls)
    with pytest.raises(OpNotAvailableError) as raised:
        first_call(op)
    assert "targets that do: ['b']" in str(raised.value)
    assert calls == []  # neither b's builder nor the in-tree kernel
    assert op.settled_target is None


def test_a_default_target_without_a_builder_does_not_fall_back_to_detection(calls):
    register_detector("pinned", never)
    register_detector("claimant", claims("cpu"))
    register_kernel_builder("RMSNormFwdOp", "claimant", rms_builder(calls, "claimant"))
    register_kernel_builder("SoftmaxFwdOp", "pinned", rms_builder(calls, "pinned"))
    set_default_target("pinned")
    with pytest.raises(OpNotAvailableError, match="'pinned' registers no kernel builder"):
        first_call(rms_op())
    assert calls == []


def test_an_unregistered_target_constructs_and_is_reported_at_the_first_call():
    register_detector("torch_cpu", claims("cpu"))
    op = rms_op(target="nope")  # C4: the target is settled by the first call
    assert op.settled_target is None
    with pytest.raises(UnknownTargetError) as raised:
        op(*rms_inputs())
    assert str(raised.value) == "no backend registered target 'nope'; known targets: ['torch_cpu']"
    assert op.settled_target is None
    register_kernel_builder("RMSNormFwdOp", "nope", rms_builder([], "nope"))
    op(*rms_inputs())  # registered since: the same instance now settles on it
    assert op.settled_target == "nope"
