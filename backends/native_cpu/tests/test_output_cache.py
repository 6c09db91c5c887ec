"""The warm-output cache (csrc/output_cache.h): outputs of 4 MiB and more come from blocks
the package keeps and reuses once torch frees them. A reused block must never show an
earlier result, a block must never back two live tensors, views keep their block alive,
and tensors may be freed on any thread."""

import threading

import pytest
import torch

from conftest import spec
from tileops_native_cpu import builders as b

ROWS, N = 512, 4096  # float32 [512, 4096]: 8 MiB, above the cache's 4 MiB floor


@pytest.fixture
def relu(native):
    assert native.uses_exchange_api(), "this torch has no DLPack exchange API: the cache is not used"
    x = torch.empty(ROWS, N)
    return b.build_relu(spec(x), inplace=False)


def stats(native):
    hits, misses, idle, budget = native.output_cache_stats()
    return hits, misses


def test_a_large_output_is_served_warm_the_second_time(native, relu):
    x = torch.randn(ROWS, N)
    hits0, misses0 = stats(native)
    y = relu(x)
    torch.testing.assert_close(y, x.relu())
    del y
    y = relu(x)
    hits1, misses1 = stats(native)
    assert hits1 - hits0 >= 1, "the freed block was not reused"
    assert misses1 - misses0 <= 1
    torch.testing.assert_close(y, x.relu())


def test_a_reused_block_holds_the_new_result_not_the_old(native, relu):
    a, c = torch.randn(ROWS, N), torch.randn(ROWS, N)
    y = relu(a)
    del y
    y = relu(c)
    torch.testing.assert_close(y, c.relu())


def test_live_outputs_never_share_a_block(native, relu):
    xs = [torch.randn(ROWS, N) for _ in range(3)]
    ys = [relu(x) for x in xs]
    assert len({y.data_ptr() for y in ys}) == 3
    for x, y in zip(xs, ys):
        torch.testing.assert_close(y, x.relu())


def test_a_view_keeps_its_block_alive(native, relu):
    x = torch.randn(ROWS, N)
    view = relu(x)[1:3]
    expected = x.relu()[1:3].clone()
    for _ in range(3):
        relu(torch.randn(ROWS, N))  # would land in the view's block if it had been given back
    torch.testing.assert_close(view, expected)


def test_outputs_freed_on_other_threads(native, relu):
    x = torch.randn(ROWS, N)
    ys = [relu(x) for _ in range(8)]
    threads = [threading.Thread(target=ys.pop) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not ys
    torch.testing.assert_close(relu(x), x.relu())


def test_budget_zero_turns_it_off_and_trims_what_is_idle(native, relu):
    x = torch.randn(ROWS, N)
    relu(x)  # freed at once: leaves an idle block behind
    assert native.output_cache_stats()[2] > 0
    previous = native.set_output_cache_budget(0)
    try:
        assert native.output_cache_stats()[2] == 0, "idle blocks over the budget were not released"
        before = stats(native)
        torch.testing.assert_close(relu(x), x.relu())
        assert stats(native) == before
    finally:
        native.set_output_cache_budget(previous)


def test_small_outputs_and_the_fallback_bridge_do_not_use_it(native):
    x = torch.randn(4, 1024)  # 16 KiB
    small = b.build_relu(spec(x), inplace=False)
    before = stats(native)
    torch.testing.assert_close(small(x), x.relu())
    assert stats(native) == before
    big = torch.randn(ROWS, N)
    relu = b.build_relu(spec(big), inplace=False)
    native.force_fallback(True)
    try:
        torch.testing.assert_close(relu(big), big.relu())
        assert stats(native) == before
    finally:
        native.force_fallback(False)


def test_a_forked_child_gets_warm_outputs_too(native, relu):
    import os

    x = torch.randn(ROWS, N)
    relu(x)  # the parent holds an idle block when it forks
    pid = os.fork()
    if pid == 0:  # the child: one thread (an OpenMP team does not survive a fork)
        code = 1
        try:
            torch.set_num_threads(1)
            one = b.build_relu(spec(x), inplace=False)
            hits = stats(native)[0]
            for _ in range(4):
                if not torch.equal(one(x), x.relu()):
                    break
            else:
                code = 0 if stats(native)[0] - hits >= 3 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
