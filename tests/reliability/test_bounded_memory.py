"""Bounded memory: a decode loop that changes shape at every step must not grow the op
layer without bound, and what it drops must really be released. The memo's counters and
eviction, which these bounds are read from, are checked here too (the example backend's
suite leaves them to tileops).

A fake target keeps ten thousand builds fast: nothing is computed, every kernel is a small
object the test holds weak references to. The tensors are small uninitialised CPU tensors
rather than meta ones: a meta tensor costs the call path about a millisecond per tensor (the
DLPack exchange refuses it, expensively, before the fallback reader runs), which would
make this loop take a minute instead of a second.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import tileops
from tileops.backend import BUILTIN, register_detector, register_kernel_builder
from tileops.ops import RMSNormFwdOp, SoftmaxFwdOp

STEPS = 10_000
HIDDEN = 8


def empty(*shape: int) -> torch.Tensor:
    return torch.empty(*shape, dtype=torch.float16)


class Kernel:
    """A built kernel: weak-referenceable, returns an output of the input's shape."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def __call__(self, x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)


class Builds:
    """A fake target whose builder remembers a weak reference to each kernel it builds."""

    def __init__(self) -> None:
        self.kernels: list[weakref.ref[Kernel]] = []
        register_detector("decode", lambda device: device.type == "cpu")
        register_kernel_builder("RMSNormFwdOp", "decode", self.build)

    def build(self, x, weight, *, normalized_shape, eps) -> Kernel:
        kernel = Kernel(x.shape[0])
        self.kernels.append(weakref.ref(kernel))
        return kernel

    def alive(self) -> list[Kernel]:
        gc.collect()
        return [k for ref in self.kernels if (k := ref()) is not None]


def decode_loop(op: RMSNormFwdOp, steps: int, bound: int) -> None:
    """One call per sequence length 1..steps (one new signature per step); the memo never
    holds more than ``bound`` kernels along the way."""
    weight = empty(HIDDEN)
    for rows in range(1, steps + 1):
        op(empty(rows, HIDDEN), weight)
        size = op.kernel_cache_stats()["size"]
        assert size <= bound, f"step {rows}: {size} kernels memoized, bound {bound}"


def test_ten_thousand_decode_shapes_keep_the_memo_within_its_bound_and_release_evicted_kernels():
    builds = Builds()
    bound = tileops.kernel_cache_capacity()
    assert bound == tileops.DEFAULT_KERNEL_CACHE_CAPACITY
    op = RMSNormFwdOp(normalized_shape=(HIDDEN,))

    decode_loop(op, STEPS, bound)

    stats = op.kernel_cache_stats()
    assert stats["builds"] == STEPS and stats["size"] == bound
    assert stats["evictions"] == STEPS - bound
    alive = builds.alive()
    assert len(alive) == bound, f"{len(alive)} kernels still alive; the memo keeps {bound}"
    # The survivors are exactly what the memo holds: the most recent shapes.
    memoized = set(map(id, op.built_kernels("rms_norm").values()))
    assert set(map(id, alive)) == memoized
    assert sorted(k.rows for k in alive) == list(range(STEPS - bound + 1, STEPS + 1))


def test_an_op_dropped_after_a_decode_loop_is_collected_with_all_its_kernels():
    builds = Builds()
    op = RMSNormFwdOp(normalized_shape=(HIDDEN,))
    decode_loop(op, 1_000, tileops.kernel_cache_capacity())
    op_ref = weakref.ref(op)

    del op
    gc.collect()

    assert op_ref() is None, f"the op is still referenced by {gc.get_referrers(op_ref())}"
    assert builds.alive() == []


def test_the_bound_is_configurable_process_wide_and_applies_at_the_next_build():
    builds = Builds()
    tileops.set_kernel_cache_capacity(8)
    assert tileops.kernel_cache_capacity() == 8
    first, second = (
        RMSNormFwdOp(normalized_shape=(HIDDEN,)),
        RMSNormFwdOp(normalized_shape=(HIDDEN,)),
    )
    decode_loop(first, 100, 8)
    decode_loop(second, 100, 8)
    assert first.kernel_cache_stats()["size"] == second.kernel_cache_stats()["size"] == 8
    assert len(builds.alive()) == 16

    tileops.set_kernel_cache_capacity(3)  # lowered: each instance shrinks at its next build
    first(empty(1_000, HIDDEN), empty(HIDDEN))
    assert first.kernel_cache_stats()["size"] == 3
    assert second.kernel_cache_stats()["size"] == 8  # not built since
    assert len(builds.alive()) == 3 + 8

    tileops.set_kernel_cache_capacity(20_000)  # raised: a long loop keeps everything
    third = RMSNormFwdOp(normalized_shape=(HIDDEN,))
    decode_loop(third, 500, 20_000)
    assert third.kernel_cache_stats()["size"] == 500


@pytest.mark.parametrize("bad", [0, -5])
def test_a_bound_below_one_kernel_is_refused_and_the_old_bound_stays(bad):
    tileops.set_kernel_cache_capacity(12)
    with pytest.raises(ValueError, match="positive"):
        tileops.set_kernel_cache_capacity(bad)
    assert tileops.kernel_cache_capacity() == 12


def test_in_tree_kernels_evicted_from_the_memo_are_released():
    # The in-tree path (target=BUILTIN) with a kernel_map factory that runs on the CPU. Its
    # memo key is the whole input signature, so a decode loop makes a kernel per step.
    made: list[weakref.ref[Kernel]] = []

    def softmax_factory(specs, **params) -> Kernel:
        kernel = Kernel(specs["x"].shape[0])
        made.append(weakref.ref(kernel))
        return kernel

    tileops.set_kernel_cache_capacity(16)
    op = SoftmaxFwdOp(dim=-1, target=BUILTIN, kernel_map={"softmax_fwd": softmax_factory})
    for rows in range(1, 1_001):
        op(empty(rows, HIDDEN))
    gc.collect()

    assert op.kernel_cache_stats()["size"] == 16
    alive = sum(ref() is not None for ref in made)
    assert alive <= 16, f"{alive} in-tree kernels alive after 1000 shapes; the memo keeps 16"


# ---- what the bound is read from: the memo's counters, and eviction --------------------


def test_a_repeated_signature_counts_one_miss_and_one_build_then_a_hit_per_call():
    builds = Builds()
    op = RMSNormFwdOp(normalized_shape=(HIDDEN,))
    for _ in range(3):
        op(empty(4, HIDDEN), empty(HIDDEN))  # new tensors, same signature
    stats = op.kernel_cache_stats()
    assert (stats["builds"], stats["misses"], stats["hits"], stats["size"]) == (1, 1, 2, 1)
    assert len(builds.kernels) == 1


def test_a_signature_whose_kernel_was_evicted_is_built_again_at_its_next_call():
    builds = Builds()
    tileops.set_kernel_cache_capacity(2)
    op = RMSNormFwdOp(normalized_shape=(HIDDEN,))
    for rows in (1, 2, 3):
        op(empty(rows, HIDDEN), empty(HIDDEN))
    stats = op.kernel_cache_stats()
    assert stats["size"] == 2 and stats["evictions"] == 1
    op(empty(1, HIDDEN), empty(HIDDEN))  # the least recently used one was evicted
    assert len(builds.kernels) == 4
