"""The kernel tape (csrc/bind/tape.h): calls recorded once, replayed on what their argument
tensors hold now, into the outputs they made while recording."""

from __future__ import annotations

import pytest
import torch

from tileops import ops
from conftest import spec
from tileops_native_cpu import builders, kernel_tape

BF = torch.bfloat16
TARGET = "native_cpu"


def _chain():
    """A GEMM, then an RMSNorm of its output (the second call reads the first's output)."""
    gemm = ops.GemmFwdOp(False, True, target=TARGET)
    norm = ops.RMSNormFwdOp([32], target=TARGET)
    return lambda a, w, g: norm(gemm(a, w), g)


def test_replay_recomputes_the_chain_from_inputs_updated_in_place():
    gen = torch.Generator().manual_seed(0)
    a, w, g = torch.randn(3, 64, generator=gen, dtype=BF), torch.randn(32, 64, generator=gen, dtype=BF), torch.rand(32, dtype=BF)
    chain = _chain()
    chain(a, w, g)  # built outside the recording
    tape = kernel_tape()
    with tape:
        out = chain(a, w, g)
    assert len(tape) == 2 and "GemmFwdOp" in tape.descriptions()[0] and "RMSNorm" in tape.descriptions()[1]
    a.copy_(torch.randn(3, 64, generator=gen, dtype=BF))
    g.copy_(torch.rand(32, dtype=BF))
    want = chain(a, w, g)
    assert not torch.equal(out, want)  # the recording's output holds the old values until the replay
    tape.replay()
    assert torch.equal(out, want)


def test_a_timed_replay_recomputes_and_times_each_call():
    gen = torch.Generator().manual_seed(1)
    a, w, g = torch.randn(3, 64, generator=gen, dtype=BF), torch.randn(32, 64, generator=gen, dtype=BF), torch.rand(32, dtype=BF)
    chain = _chain()
    chain(a, w, g)
    tape = kernel_tape()
    with tape:
        out = chain(a, w, g)
    assert [d.split(": ", 1)[1] for d in tape.descriptions()] == ["[3, 64], [32, 64] -> [3, 32]", "[3, 32], [32] -> [3, 32]"]
    a.copy_(torch.randn(3, 64, generator=gen, dtype=BF))
    want = chain(a, w, g)
    seconds = tape.replay_timed()
    assert torch.equal(out, want)
    assert len(seconds) == len(tape) and all(isinstance(s, float) and 0 <= s < 10 for s in seconds)


def test_a_replay_whose_input_changed_shape_is_refused():
    a, w = torch.randn(2, 64, dtype=BF), torch.randn(32, 64, dtype=BF)
    gemm = ops.GemmFwdOp(False, True, target=TARGET)
    tape = kernel_tape()
    with tape:
        gemm(a, w)
    a.resize_(4, 64)
    with pytest.raises(ValueError, match="asked for an output the recording did not make"):
        tape.replay()


def test_a_failed_call_is_not_recorded_and_recordings_do_not_nest():
    a, w = torch.randn(2, 64, dtype=BF), torch.randn(32, 64, dtype=BF)
    kernel = builders.build_gemm(spec(a), spec(w), trans_a=False, trans_b=True)  # the native kernel object
    tape = kernel_tape()
    with tape:
        with pytest.raises(ValueError, match="same K"):
            kernel(a, torch.randn(32, 48, dtype=BF))  # refused by the kernel
        kernel(a, w)
        with pytest.raises(ValueError, match="already recording"), kernel_tape():
            pass
    assert len(tape) == 1
    with pytest.raises(ValueError, match="already holds a recording"), tape:
        pass
