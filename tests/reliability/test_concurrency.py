"""Concurrency: first calls racing on one op instance, builders that call ops, the GIL
while waiting, discovery racing, and a kernel evicted while another thread runs it.

Every thread is joined with a timeout; a thread still alive after it is a deadlock and
fails the test. Scenarios whose failure would freeze the whole interpreter (a thread that
keeps the GIL while it waits) run in a fresh interpreter with a timeout instead.
"""

from __future__ import annotations

import ctypes
import gc
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _fake_backends import explain, run_fresh

import tileops
from tileops.backend import BackendError, register_detector, register_kernel_builder
from tileops.ops import RMSNormFwdOp, SoftmaxFwdOp

JOIN_S = 20.0  # generous: the machine is shared; a real deadlock never ends
META = torch.device("meta")


def meta(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device=META)


def run_threads(*jobs: Callable[[], Any], timeout: float = JOIN_S) -> list[Any]:
    """Runs each job on its own thread; returns their results (an exception counts as a
    result). Fails if a thread is still running after ``timeout``: a deadlock."""
    results: list[Any] = [None] * len(jobs)

    def runner(index: int, job: Callable[[], Any]) -> None:
        try:
            results[index] = job()
        except BaseException as error:  # noqa: BLE001 - reported to the test
            results[index] = error

    threads = [threading.Thread(target=runner, args=(i, job), daemon=True) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [i for i, thread in enumerate(threads) if thread.is_alive()]
    assert not stuck, f"threads {stuck} still running after {timeout} s: a deadlock"
    return results


def raised(results: list[Any]) -> list[BaseException]:
    return [r for r in results if isinstance(r, BaseException)]


class Arrivals:
    """Counts threads reaching target selection (the detector runs once per thread that
    makes a first call), so a builder can wait until every racer has missed the memo."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.count = 0
        self.lock = threading.Lock()
        self.all_here = threading.Event()

    def detect(self, device: torch.device) -> bool:
        if device.type == "meta":
            with self.lock:
                self.count += 1
                if self.count >= self.expected:
                    self.all_here.set()
        return device.type == "meta"


def rms_kernel(tag: str, log: list[str]) -> Callable[..., torch.Tensor]:
    def kernel(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        log.append(tag)
        return torch.empty_like(x)

    return kernel


# ---- build once ---------------------------------------------------------------------


def test_concurrent_first_calls_with_one_signature_run_the_builder_once_and_share_its_kernel():
    racers = 8
    arrivals = Arrivals(racers)
    builds: list[tuple[int, ...]] = []
    ran: list[str] = []

    def build(x, weight, *, normalized_shape, eps):
        builds.append(x.shape)
        # Every racer has missed the memo and chosen its target before this build ends.
        assert arrivals.all_here.wait(JOIN_S), "not every racer reached the op"
        time.sleep(0.2)  # and they are now at the memo, waiting for this build
        return rms_kernel(f"kernel#{len(builds)}", ran)

    register_detector("racy", arrivals.detect)
    register_kernel_builder("RMSNormFwdOp", "racy", build)
    op = RMSNormFwdOp(normalized_shape=(64,))
    x, w = meta(4, 64), meta(64)

    results = run_threads(*[lambda: op(x, w) for _ in range(racers)])

    assert raised(results) == []
    assert builds == [(4, 64)], "the builder ran more than once for one signature"
    assert ran == ["kernel#1"] * racers, "every racer runs the one kernel that was built"
    assert all(r.shape == (4, 64) and r.device == META for r in results)
    assert op.kernel_cache_stats()["builds"] == 1 and op.kernel_cache_stats()["size"] == 1


def test_threads_waiting_on_a_build_that_fails_wake_up_and_one_of_them_builds_again():
    racers = 6
    arrivals = Arrivals(racers)
    attempts: list[int] = []

    def build(x, weight, *, normalized_shape, eps):
        attempts.append(1)
        if len(attempts) == 1:
            assert arrivals.all_here.wait(JOIN_S)
            time.sleep(0.2)  # the others are waiting on this build now
            raise RuntimeError("out of registers")
        return rms_kernel("second try", [])

    register_detector("flaky", arrivals.detect)
    register_kernel_builder("RMSNormFwdOp", "flaky", build)
    op = RMSNormFwdOp(normalized_shape=(64,))
    x, w = meta(4, 64), meta(64)

    results = run_threads(*[lambda: op(x, w) for _ in range(racers)])

    errors = raised(results)
    assert len(errors) == 1 and "out of registers" in str(errors[0])
    assert len(attempts) == 2, "after the failure exactly one waiter builds again"
    assert op.settled_target == "flaky" and op.kernel_cache_stats()["size"] == 1


@pytest.mark.parametrize("instances", ["one instance", "two instances"])
def test_first_calls_with_different_signatures_build_in_parallel(instances):
    # Each builder waits for the other to have started: if building one key held a lock
    # the other needed, the second would never start and the first would time out.
    started = {1: threading.Event(), 2: threading.Event()}

    def build(x, weight, *, normalized_shape, eps):
        rows = x.shape[0]
        started[rows].set()
        other = 3 - rows
        if not started[other].wait(JOIN_S):
            raise TimeoutError(f"the build for {other} rows never started while {rows} was building")
        return rms_kernel(str(rows), [])

    register_detector("parallel", lambda device: device.type == "meta")
    register_kernel_builder("RMSNormFwdOp", "parallel", build)
    first = RMSNormFwdOp(normalized_shape=(8,))
    second = first if instances == "one instance" else RMSNormFwdOp(normalized_shape=(8,))

    results = run_threads(lambda: first(meta(1, 8), meta(8)), lambda: second(meta(2, 8), meta(8)))

    assert raised(results) == []
    assert [r.shape for r in results] == [(1, 8), (2, 8)]


# ---- builders that call ops ------------------------------------------------------------


def _register_meta_softmax(log: list[str]) -> None:
    def build_softmax(x, *, dim):
        log.append(f"softmax {tuple(x.shape)}")
        return lambda x: torch.empty_like(x)

    register_kernel_builder("SoftmaxFwdOp", "nesting", build_softmax)


def test_a_builder_may_call_another_op_instance():
    log: list[str] = []
    softmax = SoftmaxFwdOp(dim=-1)

    def build_rms(x, weight, *, normalized_shape, eps):
        log.append("rms: building")
        softmax(meta(*x.shape))  # e.g. a builder that warms up a helper op
        log.append("rms: built")
        return rms_kernel("rms", log)

    register_detector("nesting", lambda device: device.type == "meta")
    register_kernel_builder("RMSNormFwdOp", "nesting", build_rms)
    _register_meta_softmax(log)
    rms = RMSNormFwdOp(normalized_shape=(8,))

    (result,) = run_threads(lambda: rms(meta(3, 8), meta(8)))

    assert not isinstance(result, BaseException), result
    assert log == ["rms: building", "softmax (3, 8)", "rms: built", "rms"]


def test_a_builder_may_call_its_own_instance_with_another_signature():
    log: list[str] = []
    holder: dict[str, Any] = {}

    def build(x, weight, *, normalized_shape, eps):
        rows = x.shape[0]
        log.append(f"build {rows}")
        if rows == 4:
            holder["op"](meta(1, 8), meta(8))  # same instance, another signature
        return rms_kernel(f"kernel {rows}", log)

    register_detector("nesting", lambda device: device.type == "meta")
    register_kernel_builder("RMSNormFwdOp", "nesting", build)
    op = holder["op"] = RMSNormFwdOp(normalized_shape=(8,))

    (result,) = run_threads(lambda: op(meta(4, 8), meta(8)))

    assert not isinstance(result, BaseException), result
    assert log == ["build 4", "build 1", "kernel 1", "kernel 4"]
    assert op.kernel_cache_stats()["size"] == 2


def test_a_builder_calling_its_own_instance_with_its_own_signature_gets_a_clear_error():
    holder: dict[str, Any] = {}
    attempts: list[int] = []

    def build(x, weight, *, normalized_shape, eps):
        attempts.append(1)
        if len(attempts) == 1:
            holder["op"](meta(*x.shape), meta(8))  # would wait on itself forever
        return rms_kernel("ok", [])

    register_detector("selfish", lambda device: device.type == "meta")
    register_kernel_builder("RMSNormFwdOp", "selfish", build)
    op = holder["op"] = RMSNormFwdOp(normalized_shape=(8,))

    (result,) = run_threads(lambda: op(meta(4, 8), meta(8)))

    assert isinstance(result, BackendError), f"expected a BackendError, got {result!r}"
    text = str(result)
    assert "RMSNormFwdOp" in text
    assert "same op instance with the same input signature" in text
    # Nothing half-built stays behind: the next call builds and works.
    assert op.settled_target is None and op.kernel_cache_stats()["size"] == 0
    assert op(meta(4, 8), meta(8)).shape == (4, 8)
    assert op.settled_target == "selfish"


# ---- the GIL ---------------------------------------------------------------------------

_GIL_SCRIPT = """
import sys, threading, time
import torch
from tileops.backend import register_detector, register_kernel_builder
from tileops.ops import SoftmaxFwdOp

sys.setswitchinterval(0.001)
building, release = threading.Event(), threading.Event()
builds = []

def build(x, *, dim):
    builds.append(1)
    building.set()
    release.wait(60)          # thread A's builder blocks in pure Python
    return lambda x: torch.empty_like(x)

register_detector("slow", lambda device: device.type == "meta")
register_kernel_builder("SoftmaxFwdOp", "slow", build)
op = SoftmaxFwdOp(dim=-1)
x = torch.empty(2, 3, device="meta")
outputs = {}

def call(name):
    outputs[name] = tuple(op(x).shape)

def count_for(seconds):
    # Pure Python work on a third thread: it only advances while it can take the GIL.
    box = [0]
    def spin():
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            box[0] += 1
    t = threading.Thread(target=spin, daemon=True)
    t.start()
    t.join(seconds + 30)
    return box[0]

a = threading.Thread(target=call, args=("a",), daemon=True)
a.start()
assert building.wait(30)
baseline = count_for(0.4)       # A is building; nobody waits on the memo yet

b = threading.Thread(target=call, args=("b",), daemon=True)
b.start()
deadline = time.monotonic() + 30
while True:                     # until B sits in the memo fetch, waiting for A's build
    frame = sys._current_frames().get(b.ident)
    if frame is not None and frame.f_code.co_name == "get_or_build_kernel":
        break
    assert time.monotonic() < deadline, "B never reached the memo"
    time.sleep(0.005)
time.sleep(0.1)
waiting = count_for(0.4)        # B waits for A's build of the same key
b_was_waiting = b.is_alive() and "b" not in outputs

release.set()
a.join(30)
b.join(30)
report(baseline=baseline, waiting=waiting, b_was_waiting=b_was_waiting,
       outputs=outputs, builds=len(builds))
"""


def test_a_thread_waiting_for_another_threads_build_releases_the_gil(fresh_site):
    result = run_fresh(_GIL_SCRIPT, site=fresh_site, timeout=120, expect_rc=None)
    assert result["_rc"] == 0, (
        "the interpreter hung or failed: a thread waiting on the memo may keep the GIL\n" + explain(result)
    )
    assert result["b_was_waiting"], "B had already finished: the wait was not observed"
    assert result["builds"] == 1
    assert result["outputs"] == {"a": [2, 3], "b": [2, 3]}
    # The third thread kept running Python while B waited (within a wide margin of what it
    # managed before B arrived: the machine is shared and noisy).
    assert result["waiting"] > 0.1 * result["baseline"], result


_FORK_SCRIPT = """
import os, signal, threading, torch
from tileops.backend import register_detector, register_kernel_builder
from tileops.ops import SoftmaxFwdOp

building, release = threading.Event(), threading.Event()
parent = os.getpid()

def build(x, *, dim):
    if os.getpid() == parent:   # the parent's build blocks; a child's goes straight through
        building.set()
        release.wait(60)
    return lambda x: torch.empty_like(x)

register_detector("slow", lambda device: device.type == "meta")
register_kernel_builder("SoftmaxFwdOp", "slow", build)
op = SoftmaxFwdOp(dim=-1)
x = torch.empty(2, 3, device="meta")
builder = threading.Thread(target=op, args=(x,), daemon=True)
builder.start()
assert building.wait(30)
child = os.fork()   # e.g. a DataLoader worker starting while a kernel is being built
if child == 0:
    signal.alarm(4)     # a child stuck on the memo dies of SIGALRM
    op(x)
    os._exit(0)
release.set()
builder.join(30)
_, status = os.waitpid(child, 0)
report(child_exit=os.waitstatus_to_exitcode(status))
"""


def test_a_child_forked_while_a_build_is_in_flight_can_still_call_the_op(fresh_site):
    result = run_fresh(_FORK_SCRIPT, site=fresh_site, timeout=120)
    assert result["child_exit"] == 0, f"the forked child exited {result['child_exit']} (-14: stuck, killed by SIGALRM)"


# ---- discovery racing ------------------------------------------------------------------

_DISCOVERY_RACE = """
import threading
import tileops
from tileops.backend import load_failures, registered_targets
from tileops.ops import SoftmaxFwdOp

racers = 8
barrier = threading.Barrier(racers)
seen = [None] * racers
errors = []

def race(i):
    try:
        barrier.wait(30)
        # Three doors into discovery: an op construction and two registry reads.
        [lambda: SoftmaxFwdOp(dim=-1), registered_targets, load_failures][i % 3]()
        seen[i] = registered_targets()
    except BaseException as error:
        errors.append(repr(error))

threads = [threading.Thread(target=race, args=(i,)) for i in range(racers)]
for t in threads:
    t.start()
for t in threads:
    t.join(60)
report(seen=seen, errors=errors, alive=sum(t.is_alive() for t in threads))
"""


def test_discovery_racing_from_several_threads_imports_each_backend_once(fresh_site):
    fresh_site.backend(
        "slow_backend",
        """
        import time
        time.sleep(0.3)   # a slow import widens the race
        from tileops.backend import register_detector
        register_detector("slow", lambda device: False)
    """,
    )
    fresh_site.backend(
        "quick_backend",
        """
        from tileops.backend import register_detector
        register_detector("quick", lambda device: False)
    """,
    )

    result = run_fresh(_DISCOVERY_RACE, site=fresh_site)

    assert result["alive"] == 0 and result["errors"] == []
    assert fresh_site.imports_of("slow_backend") == 1
    assert fresh_site.imports_of("quick_backend") == 1
    # No racer got an answer before discovery had finished.
    assert result["seen"] == [["quick", "slow"]] * 8


# ---- a kernel evicted while it runs ----------------------------------------------------


class _Semaphore:
    """A POSIX semaphore: the kernel below blocks in sem_wait with the GIL released, as a
    compiled kernel does while it computes."""

    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.buffer = ctypes.create_string_buffer(64)  # >= sizeof(sem_t)
        assert self.libc.sem_init(self.buffer, 0, 0) == 0

    def post(self) -> None:
        assert self.libc.sem_post(self.buffer) == 0

    def wait_address(self) -> int:
        return ctypes.cast(self.libc.sem_wait, ctypes.c_void_p).value


def test_a_kernel_evicted_while_another_thread_runs_it_stays_alive_until_it_returns():
    semaphore = _Semaphore()
    events: list[str] = []
    entered = threading.Event()

    class Input:
        """ctypes argument conversion: runs (holding the GIL) just before the C call."""

        @classmethod
        def from_param(cls, tensor: torch.Tensor) -> ctypes.c_void_p:
            events.append("kernel entered")
            entered.set()
            return ctypes.c_void_p(ctypes.addressof(semaphore.buffer))

    class BlockingKernel(ctypes._CFuncPtr):  # a C callable, like a compiled backend's
        _flags_ = ctypes._FUNCFLAG_CDECL
        _argtypes_ = (Input,)
        _restype_ = ctypes.c_int

    def returned(status: int) -> torch.Tensor:  # the kernel's output, after the C call
        events.append("kernel returned")
        return torch.zeros(1, 4)

    def build(x, *, dim):
        if x.shape[0] == 1:
            kernel = BlockingKernel(semaphore.wait_address())
            kernel.restype = returned
            kernel.on_release = weakref.ref(kernel, lambda _: events.append("kernel released"))
            return kernel
        return lambda x: torch.zeros_like(x)

    register_detector("blocking", lambda device: device.type == "cpu")
    register_kernel_builder("SoftmaxFwdOp", "blocking", build)
    tileops.set_kernel_cache_capacity(1)
    op = SoftmaxFwdOp(dim=-1)
    small = torch.zeros(1, 4)
    semaphore.post()
    op(small)  # builds and memoizes the blocking kernel (the post lets this call through)
    events.clear()
    entered.clear()

    def hit_and_block() -> torch.Tensor:
        return op(small)  # a memo hit: runs the kernel, which blocks until posted

    worker = threading.Thread(target=hit_and_block, daemon=True)
    worker.start()
    try:
        assert entered.wait(JOIN_S)
        op(torch.zeros(2, 4))  # another signature: with capacity 1 it evicts the running kernel
        events.append("evicted")
    finally:
        semaphore.post()
        worker.join(JOIN_S)
    assert not worker.is_alive()
    gc.collect()
    assert "kernel released" in events
    assert events.index("kernel released") > events.index("kernel returned"), (
        f"the kernel was released while it was still running: {events}"
    )
