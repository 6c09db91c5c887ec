"""The names of the protocol (A1), TensorSpec (A2) and the BUILTIN sentinel (A6)."""

from __future__ import annotations

import copy
import gc
import pickle
import typing
import weakref

import pytest
import torch
from _fake_backends import F16, N, rms_builder, rms_inputs, rms_op

import tileops
import tileops.backend as backend
from tileops.backend import (
    BUILTIN,
    AmbiguousTargetError,
    BackendError,
    OpNotAvailableError,
    TensorSpec,
    UnknownTargetError,
    default_target,
    register_detector,
    register_kernel_builder,
    registered_targets,
    set_default_target,
)

PROTOCOL_NAMES = {
    "TensorSpec",
    "BUILTIN",
    "register_detector",
    "register_kernel_builder",
    "registered_targets",
    "set_default_target",
    "default_target",
    "load_failures",
    "BackendError",
    "UnknownTargetError",
    "AmbiguousTargetError",
    "OpNotAvailableError",
    "BuildKernel",
    "KernelResult",
    "Target",
}
CALLER_FACING = {
    "BUILTIN",
    "BackendError",
    "UnknownTargetError",
    "AmbiguousTargetError",
    "OpNotAvailableError",
    "registered_targets",
    "set_default_target",
    "default_target",
    "load_failures",
}


# ---- A1 ------------------------------------------------------------------------------


def test_tileops_backend_exports_every_protocol_name():
    assert sorted(n for n in PROTOCOL_NAMES if not hasattr(backend, n)) == []
    assert PROTOCOL_NAMES <= set(backend.__all__)


def test_a_star_import_of_tileops_backend_brings_every_protocol_name():
    namespace: dict = {}
    exec("from tileops.backend import *", namespace)
    assert PROTOCOL_NAMES <= set(namespace)


def test_the_caller_facing_names_are_reachable_from_the_package_root_as_the_same_objects():
    for name in sorted(CALLER_FACING):
        assert getattr(tileops, name) is getattr(backend, name), name


def test_every_protocol_error_is_a_backend_error():
    for error in (UnknownTargetError, AmbiguousTargetError, OpNotAvailableError):
        assert issubclass(error, BackendError)
    assert issubclass(BackendError, Exception)


def test_the_typing_names_describe_targets_and_kernel_results():
    assert set(typing.get_args(backend.Target)) == {str, type(BUILTIN)}
    assert {torch.Tensor, type(None)} <= set(typing.get_args(backend.KernelResult))
    assert callable(backend.BuildKernel)


# ---- A2 ------------------------------------------------------------------------------


def test_tensor_spec_is_a_named_tuple_of_device_dtype_shape_in_that_order():
    assert issubclass(TensorSpec, tuple)
    assert TensorSpec._fields == ("device", "dtype", "shape")
    assert typing.get_type_hints(TensorSpec) == {
        "device": torch.device,
        "dtype": torch.dtype,
        "shape": tuple[int, ...],
    }
    spec = TensorSpec(torch.device("cpu"), F16, (4, N))
    assert tuple(spec) == (torch.device("cpu"), F16, (4, N))


def test_tensor_specs_compare_by_value():
    a = TensorSpec(torch.device("cpu"), F16, (4, N))
    b = TensorSpec(device=torch.device("cpu"), dtype=torch.float16, shape=(4, N))
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert a != TensorSpec(torch.device("cpu"), F16, (4, N + 1))
    assert a != TensorSpec(torch.device("cpu"), torch.bfloat16, (4, N))
    assert a != TensorSpec(torch.device("meta"), F16, (4, N))


def test_a_builder_receives_tensor_specs_that_describe_the_inputs_without_holding_them():
    received = []

    def build(*specs, **params):
        received.append(specs)
        return rms_builder()(*specs, **params)

    register_detector("spec_probe", lambda device: device.type == "cpu")
    register_kernel_builder("RMSNormFwdOp", "spec_probe", build)
    x, w = rms_inputs()
    op = rms_op()
    op(x, w)

    (specs,) = received
    assert specs == (
        TensorSpec(torch.device("cpu"), F16, (4, N)),
        TensorSpec(torch.device("cpu"), F16, (N,)),
    )
    for spec in specs:
        assert type(spec) is TensorSpec
        assert not any(isinstance(field, torch.Tensor) for field in spec)
        assert type(spec.shape) is tuple and all(type(n) is int for n in spec.shape)
    # The specs (and the memoized kernel) stay alive; the tensors they describe do not.
    x_alive, w_alive = weakref.ref(x), weakref.ref(w)
    del x, w
    gc.collect()
    assert x_alive() is None and w_alive() is None
    assert op.settled_target == "spec_probe"


# ---- A6 ------------------------------------------------------------------------------


def test_builtin_is_one_object_however_it_is_reached_or_copied():
    from tileops.backend.types import BUILTIN as from_types

    assert tileops.BUILTIN is BUILTIN is from_types
    assert copy.copy(BUILTIN) is BUILTIN
    assert copy.deepcopy(BUILTIN) is BUILTIN
    assert pickle.loads(pickle.dumps(BUILTIN)) is BUILTIN
    assert type(BUILTIN)() is BUILTIN
    assert repr(BUILTIN) == "BUILTIN"


def test_builtin_never_appears_among_registered_targets():
    register_detector("anything", lambda device: False)
    register_kernel_builder("RMSNormFwdOp", "anything", rms_builder())
    set_default_target(BUILTIN)
    assert default_target() is BUILTIN
    assert registered_targets() == ["anything"]
    assert registered_targets("RMSNormFwdOp") == ["anything"]
    assert BUILTIN not in registered_targets() + registered_targets("RMSNormFwdOp")


def test_builtin_cannot_be_registered_as_a_target():
    with pytest.raises((TypeError, BackendError)):
        register_detector(BUILTIN, lambda device: True)  # type: ignore[arg-type]
    with pytest.raises((TypeError, BackendError)):
        register_kernel_builder("RMSNormFwdOp", BUILTIN, rms_builder())  # type: ignore[arg-type]
    assert registered_targets() == []


def test_a_target_spelled_BUILTIN_is_a_name_not_the_sentinel():
    with pytest.raises(UnknownTargetError, match=r"no backend registered target 'BUILTIN'"):
        rms_op(target="BUILTIN")(*rms_inputs())
    with pytest.raises(UnknownTargetError):
        set_default_target("BUILTIN")
    assert default_target() is None
