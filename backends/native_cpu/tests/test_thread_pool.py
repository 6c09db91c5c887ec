"""Scheduling of parallel regions: every index of a range runs exactly once, on our own pool
and on torch's OpenMP team, from one or several calling threads, with more threads asked
for than the machine has; work too small to split stays on the calling thread."""

import threading

import pytest
import torch

from conftest import spec
from tileops_native_cpu import builders as b

POOLS = ["own", "openmp"]


@pytest.fixture(params=POOLS)
def pool(request, native):
    if request.param == "openmp" and not native.openmp_available():
        pytest.skip("no OpenMP runtime loaded in this process")
    native.set_use_openmp(request.param == "openmp")
    yield request.param
    native.set_use_openmp(True)


@pytest.mark.parametrize(
    "n, grain, threads",
    [
        (1, 1, 4),
        (2, 1, 2),
        (7, 3, 2),
        (100, 1, 2),
        (1000, 1, 3),
        (4096, 16, 2),
        (100000, 7, 8),
        (5000, 1, 64),
        (65535 * 3, 1, 256),
    ],
)
def test_every_index_runs_exactly_once(native, pool, n, grain, threads):
    visits, ranges, max_worker = native.parallel_for_check(n, grain, threads)
    assert len(visits) == n
    assert set(visits) == {1}
    assert ranges <= max(1, min(threads * 16, -(-n // grain)))
    assert max_worker < threads


def test_a_range_of_one_chunk_stays_on_the_calling_thread(native, pool):
    before = native.pool_stats()[0]
    visits, ranges, max_worker = native.parallel_for_check(1000, 1000, 2)
    assert (set(visits), ranges, max_worker) == ({1}, 1, 0)
    assert native.pool_stats()[0] == before


def test_regions_from_several_threads_at_once_each_run_every_index_once(native, pool):
    results, errors = [], []

    def body(i):
        try:
            for _ in range(20):
                results.append(native.parallel_for_check(3000 + i, 1 + i % 3, 2 + i % 3))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 80
    assert all(set(v) == {1} for v, _, _ in results)


def test_a_region_splits_into_several_chunks_per_thread_and_workers_take_part(native, pool):
    before = native.pool_stats()
    for _ in range(50):
        native.parallel_for_check(20000, 1, 2)
    after = native.pool_stats()
    rounds, chunks = after[0] - before[0], after[1] - before[1]
    alone = after[5] - before[5]  # after a stalled team region (a busy machine): one piece each
    assert rounds == 50
    assert chunks == (50 - alone) * 32 + alone  # 16 chunks per thread
    on_team = after[3] - before[3]
    if pool == "own":
        assert on_team == alone == 0
    else:
        assert on_team + alone == 50


@pytest.fixture
def two_threads():
    """torch (and so every kernel built meanwhile) on 2 threads, restored after."""
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


def rms_norm(rows, n):
    """A bfloat16 RMSNorm kernel and its inputs, [rows, n]."""
    x, w = torch.randn(rows, n, dtype=torch.bfloat16), torch.randn(n, dtype=torch.bfloat16)
    return b.build_rms_norm(spec(x), spec(w), normalized_shape=(n,), eps=1e-6), x, w


def test_decode_sized_calls_do_not_open_a_parallel_region(native, two_threads):
    kernel, x, w = rms_norm(1, 4096)
    before = native.pool_stats()[0]
    for _ in range(10):
        kernel(x, w)
    assert native.pool_stats()[0] == before


def test_kernels_agree_on_both_pools(native, two_threads):
    kernel, x, w = rms_norm(512, 1024)
    outs = []
    try:
        for use in (False, True):
            native.set_use_openmp(use)
            outs.append(kernel(x, w))
    finally:
        native.set_use_openmp(True)
    assert torch.equal(outs[0], outs[1])


def test_by_default_every_region_runs_on_torchs_team_or_on_the_caller(native, two_threads):
    """The default (README, Threads): torch's OpenMP team, or the calling thread alone for a
    while after a stalled team region; never our own pool."""
    import os

    if os.environ.get("TILEOPS_NATIVE_CPU_POOL"):
        pytest.skip("TILEOPS_NATIVE_CPU_POOL is set")
    if not native.openmp_available():
        pytest.skip("no OpenMP runtime loaded in this process")
    kernel, x, w = rms_norm(512, 1024)
    rounds, _, _, on_team, _, alone = native.pool_stats()
    for _ in range(50):
        torch.testing.assert_close(kernel(x, w), kernel(x, w))
    rounds2, _, _, on_team2, _, alone2 = native.pool_stats()
    assert rounds2 - rounds == 100
    assert (on_team2 - on_team) + (alone2 - alone) == 100
