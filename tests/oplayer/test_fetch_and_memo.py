"""The kernel fetch (D1-D5, D9) and per-instance target settling (C4)."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch
import torch.nn.functional as F

import tileops
from tileops.backend import (
    BUILTIN,
    BackendError,
    TensorSpec,
    register_detector,
    register_kernel_builder,
    set_default_target,
)
from tileops.ops import GemmFwdOp, GroupNormFwdOp, RMSNormFwdOp, SoftmaxFwdOp


def half(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float16)


def rms_builder(log):
    def build(x, weight, *, normalized_shape, eps):
        log.append((x, weight, normalized_shape, eps))
        return lambda x, w: F.rms_norm(x, normalized_shape, w, eps)

    return build


@pytest.fixture
def rms_log():
    log = []
    register_detector("fake", lambda d: d.type == "cpu")
    register_kernel_builder("RMSNormFwdOp", "fake", rms_builder(log))
    return log


def test_the_builder_receives_tensor_specs_in_manifest_order_and_resolved_params(rms_log):
    RMSNormFwdOp(normalized_shape=[64], eps=None)(half(4, 64), half(64))
    ((x, weight, normalized_shape, eps),) = rms_log
    assert x == TensorSpec(torch.device("cpu"), torch.float16, (4, 64))
    assert weight == TensorSpec(torch.device("cpu"), torch.float16, (64,))
    assert normalized_shape == (64,)
    assert eps == 1e-6  # a None param arrives as the value the op resolves it to


def test_an_absent_optional_input_reaches_the_builder_as_none(cpu_target):
    x = torch.randn(2, 8, 3, 3)
    GroupNormFwdOp(num_groups=4)(x)
    ((specs, params),) = cpu_target.builds_of("GroupNormFwdOp")
    assert specs[1] is None and specs[2] is None
    assert params == {"num_groups": 4, "eps": 1e-5}
    # ... and the kernel is called with the same slots, None included.
    assert cpu_target.calls[-1].devices == (torch.device("cpu"), None, None)


def test_the_same_signature_reuses_the_kernel_without_calling_the_builder_again(rms_log):
    op = RMSNormFwdOp(normalized_shape=(64,))
    for _ in range(3):
        op(half(4, 64), half(64))
    assert len(rms_log) == 1
    assert op.kernel_cache_stats()["hits"] == 2


def test_a_new_shape_or_dtype_builds_again(rms_log):
    op = RMSNormFwdOp(normalized_shape=(64,))
    op(half(4, 64), half(64))
    op(half(5, 64), half(64))
    op(torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16))
    assert len(rms_log) == 3


def test_each_instance_has_its_own_memo(rms_log):
    a, b = RMSNormFwdOp(normalized_shape=(64,)), RMSNormFwdOp(normalized_shape=(64,))
    a(half(4, 64), half(64))
    b(half(4, 64), half(64))
    assert len(rms_log) == 2


def test_built_kernels_keys_are_the_device_then_dtype_and_shape_per_slot(cpu_target):
    op = GroupNormFwdOp(num_groups=2)
    x = torch.randn(2, 4, 5)
    op(x)
    (key,) = op.built_kernels("group_norm_no_affine")
    assert key == (torch.device("cpu"), (torch.float32, (2, 4, 5)), None, None)
    assert dict(op.built_kernels("group_norm")) == {}


def test_built_kernels_is_read_only(cpu_target):
    op = SoftmaxFwdOp(dim=-1)
    op(torch.randn(3, 4))
    view = op.built_kernels("softmax_fwd")
    with pytest.raises(TypeError):
        view[("x",)] = None  # type: ignore[index]


def test_built_kernels_rejects_a_role_the_op_does_not_have(cpu_target):
    with pytest.raises(ValueError, match="no kernel role 'nope'"):
        SoftmaxFwdOp().built_kernels("nope")


def test_the_gemm_role_is_chosen_from_the_shapes(cpu_target):
    op = GemmFwdOp()
    op(half(1, 32), half(16, 32))  # m == 1, NT: the gemv case
    op(half(8, 32), half(16, 32))
    assert len(op.built_kernels("gemv_kernel")) == 1
    assert len(op.built_kernels("gemm_kernel")) == 1


def test_the_settled_target_is_none_before_the_first_call_then_fixed(rms_log):
    op = RMSNormFwdOp(normalized_shape=(64,))
    assert op.settled_target is None
    op(half(4, 64), half(64))
    assert op.settled_target == "fake"
    set_default_target(BUILTIN)  # a later default does not re-aim a settled instance
    op(half(7, 64), half(64))
    assert op.settled_target == "fake"


def test_a_call_that_fails_validation_settles_nothing_and_builds_nothing(rms_log):
    op = RMSNormFwdOp(normalized_shape=(64,))
    with pytest.raises(ValueError):
        op(half(4, 32), half(32))
    assert op.settled_target is None and rms_log == []


def test_a_settled_instance_on_a_device_its_target_does_not_claim_is_an_error(rms_log):
    register_detector("metaonly", lambda d: d.type == "meta")
    register_kernel_builder("RMSNormFwdOp", "metaonly", rms_builder([]))
    op = RMSNormFwdOp(normalized_shape=(64,))
    op(half(4, 64), half(64))  # settles on "fake" (claims cpu)
    meta = dict(device="meta", dtype=torch.float16)
    with pytest.raises(BackendError, match="settled on target 'fake'.*'meta'"):
        op(torch.empty(4, 64, **meta), torch.empty(64, **meta))


def test_a_target_named_at_construction_serves_new_signatures_on_a_device_it_does_not_claim(rms_log):
    """An explicit target= skips detection on every call, not just the first: an opt-in
    backend whose detector claims nothing serves each new shape it is asked for."""
    register_detector("optin", lambda d: False)
    register_kernel_builder("RMSNormFwdOp", "optin", rms_builder(rms_log))
    op = RMSNormFwdOp(normalized_shape=(64,), target="optin")
    for rows in (4, 7):
        x, w = half(rows, 64), half(64)
        assert torch.equal(op(x, w), F.rms_norm(x, (64,), w, 1e-6))
    assert op.settled_target == "optin" and len(rms_log) == 2  # one build per signature


def test_concurrent_first_calls_with_one_signature_build_once(rms_log):
    release = threading.Event()

    def slow(x, weight, *, normalized_shape, eps):
        rms_log.append("slow")
        release.wait(5)
        return lambda x, w: F.rms_norm(x, normalized_shape, w, eps)

    register_detector("slow", lambda d: d.type == "meta")
    register_kernel_builder("RMSNormFwdOp", "slow", slow)
    op = RMSNormFwdOp(normalized_shape=(64,))
    meta = dict(device="meta", dtype=torch.float16)
    results, errors = [], []

    def call():
        try:
            results.append(op(torch.empty(4, 64, **meta), torch.empty(64, **meta)).shape)
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    threading.Timer(0.3, release.set).start()
    for t in threads:
        t.join(10)
    assert errors == []
    assert rms_log.count("slow") == 1
    assert results == [torch.Size([4, 64])] * 6


def test_the_memo_is_bounded_and_evicted_kernels_are_released(rms_log):
    tileops.set_kernel_cache_capacity(3)
    refs = []

    class Kernel:
        def __call__(self, x, w):
            return torch.empty_like(x)

    def build(x, weight, *, normalized_shape, eps):
        kernel = Kernel()
        refs.append(weakref.ref(kernel))
        return kernel

    register_detector("bounded", lambda d: d.type == "meta")
    register_kernel_builder("RMSNormFwdOp", "bounded", build)
    op = RMSNormFwdOp(normalized_shape=(8,))
    for rows in range(1, 21):
        meta = dict(device="meta", dtype=torch.float16)
        op(torch.empty(rows, 8, **meta), torch.empty(8, **meta))
    gc.collect()
    assert op.kernel_cache_stats()["size"] == 3
    assert sum(r() is not None for r in refs) == 3
    assert op.kernel_cache_stats()["evictions"] == 17


def test_the_kernel_cache_capacity_is_process_wide_and_validated():
    assert tileops.kernel_cache_capacity() == tileops.DEFAULT_KERNEL_CACHE_CAPACITY
    tileops.set_kernel_cache_capacity(7)
    assert tileops.kernel_cache_capacity() == 7
    with pytest.raises(ValueError, match="positive"):
        tileops.set_kernel_cache_capacity(0)
    with pytest.raises(TypeError):
        tileops.set_kernel_cache_capacity(2.5)  # type: ignore[arg-type]


def test_a_memo_hit_runs_no_tileops_python_code_beyond_forward(rms_log):
    import sys

    op = RMSNormFwdOp(normalized_shape=(64,))
    x, w = half(4, 64), half(64)
    op(x, w)
    seen = []

    def profile(frame, event, arg):
        if event == "call":
            seen.append(frame.f_code.co_filename)

    sys.setprofile(profile)
    try:
        op(x, w)
    finally:
        sys.setprofile(None)
    tileops_frames = [f for f in seen if "tileops" in f]
    assert tileops_frames == ["<tileops forward of RMSNormFwdOp>"]
