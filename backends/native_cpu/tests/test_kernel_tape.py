"""The kernel tape (csrc/bind/tape.h): calls recorded once, replayed on what their argument
tensors hold now, into the outputs they made while recording."""

from __future__ import annotations

import re

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


def _walk(table: torch.Tensor, first: list[int]):
    """A tape whose logits are its input rows (rows + 0, one AddFwdOp): replay_greedy's next
    token is then the first largest entry of the embedding table's row for the last one.
    Returns (tape, logits, rows, positions, seqlens, last)."""
    add = ops.AddFwdOp(target=TARGET)
    rows = table[first].clone()
    zeros = torch.zeros_like(rows)
    add(rows, zeros)  # built outside the recording
    tape = kernel_tape()
    with tape:
        logits = add(rows, zeros)
    positions = torch.tensor([5 * b for b in range(len(first))])
    seqlens = positions.to(torch.int32)
    return tape, logits, rows, positions, seqlens, torch.tensor(first)


def _walked(table: torch.Tensor, last: int, steps: int, eos=(), pad=-1, finished=False) -> list[int]:
    """The same walk in torch: argmax of the row as float (the first largest; NaN largest)."""
    out = []
    for _ in range(steps):
        t = int(table[last].float().argmax())
        if eos:
            t = pad if finished else t
            finished = finished or t in eos
        out.append(last := t)
    return out


def test_replay_greedy_follows_the_first_largest_logit_as_torch_argmax_picks_it():
    gen = torch.Generator().manual_seed(3)
    vocab = 24
    table = torch.randn(vocab, vocab, generator=gen).to(BF)
    table[:, 7] = table[:, 2] = table.max() + 1  # a tie in every row: the first index wins
    table[5, 11] = float("nan")  # NaN is largest, as in torch.argmax
    table[9, 3] = table[9, 4] = float("nan")
    table[2, 5] = table[2, 7] + 1  # the walk goes 2 -> 5 -> 11 (the NaN) ...
    table[11, 9] = table[11, 2] + 1  # ... -> 9 -> 3 (the first NaN) -> 2 ...
    table[3, 2] = table[3, 7]
    tape, logits, rows, positions, seqlens, last = _walk(table, [2, 9])
    tokens = torch.full((2, 10), -1)
    ran = tape.replay_greedy(8, logits, table, rows, positions, seqlens, last, tokens, torch.ones(2, dtype=torch.long), [], -1)
    assert ran == 8
    assert tokens[0, :8].tolist() == _walked(table, 2, 8) and tokens[0, :8].tolist()[:5] == [5, 11, 9, 3, 2]
    assert tokens[1, :8].tolist() == _walked(table, 9, 8)
    assert (tokens[:, 8:] == -1).all()  # columns past the steps run are left alone
    assert last.tolist() == tokens[:, 7].tolist()
    assert positions.tolist() == [8, 13] and seqlens.tolist() == [8, 13]  # one more per step
    assert torch.equal(rows, table[tokens[:, 6]])  # the input of the last step run


@pytest.mark.parametrize("dtype", [BF, torch.float16, torch.float32])
def test_replay_greedy_picks_as_torch_argmax_across_blocks_signed_zeros_and_infinities(dtype):
    # a vocabulary of several of the search's blocks of 256 logits
    gen = torch.Generator().manual_seed(5)
    vocab = 700
    table = torch.randn(vocab, vocab, generator=gen).to(dtype)
    table[0, 300] = table[0, 600] = 9  # a tie between two blocks: the first wins
    table[1] = -table[1].abs() - 1  # all negative but -0 before +0: the first zero wins
    table[1, 400], table[1, 500] = -0.0, 0.0
    table[2] = -table[2].abs() - 1
    table[2, 450], table[2, 260] = 0.0, -0.0
    table[3, 650], table[3, 690] = float("inf"), float("nan")  # NaN above +inf
    table[4] = float("-inf")  # nothing above -inf: the first index
    table[5, 699] = 9  # the maximum in the last, partial block
    table[6, 5] = float("nan")  # two NaNs: the first
    table[6, 300] = float("nan")
    first = [0, 1, 2, 3, 4, 5, 6]
    tape, logits, rows, positions, seqlens, last = _walk(table, first)
    tokens = torch.full((len(first), 3), -1)
    unfinished = torch.ones(len(first), dtype=torch.long)
    ran = tape.replay_greedy(3, logits, table, rows, positions, seqlens, last, tokens, unfinished, [], -1)
    assert ran == 3
    assert [row[0] for row in tokens.tolist()] == [300, 400, 260, 690, 0, 699, 5]
    for b, f in enumerate(first):
        assert tokens[b].tolist() == _walked(table, f, 3)


def test_replay_greedy_pads_a_finished_sequence_and_stops_once_all_have_finished():
    gen = torch.Generator().manual_seed(4)
    vocab = 16
    table = torch.randn(vocab, vocab, generator=gen).to(BF)
    for a, b in ((1, 2), (2, 3), (3, 4), (4, 1), (6, 7), (7, 8), (8, 9), (9, 10), (10, 11), (11, 6)):
        table[a, b] = 10  # two cycles: 1 2 3 4 and 6 ... 11
    eos, pad = [3, 9], 0
    tape, logits, rows, positions, seqlens, last = _walk(table, [1, 6])
    tokens = torch.full((2, 12), -1)
    unfinished = torch.ones(2, dtype=torch.long)
    ran = tape.replay_greedy(12, logits, table, rows, positions, seqlens, last, tokens, unfinished, eos, pad)
    assert ran == 3  # sequence 0 meets 3 at its second token, sequence 1 meets 9 at its third
    assert tokens[:, :3].tolist() == [[2, 3, pad], [7, 8, 9]] == [_walked(table, 1, 3, eos, pad),
                                                                  _walked(table, 6, 3, eos, pad)]
    assert unfinished.tolist() == [0, 0] and positions.tolist() == [3, 8]
    # a sequence that came in finished gets the pad token from its first step
    tape, logits, rows, positions, seqlens, last = _walk(table, [1, 6])
    tokens = torch.full((2, 4), -1)
    ran = tape.replay_greedy(4, logits, table, rows, positions, seqlens, last, tokens, torch.tensor([0, 1]), [9], pad)
    assert ran == 3 and tokens[:, :3].tolist() == [[pad, pad, pad], [7, 8, 9]]


def test_replay_greedy_refuses_what_it_cannot_read_naming_it():
    table = torch.randn(16, 16).to(BF)
    tape, logits, rows, positions, seqlens, last = _walk(table, [1, 2])
    tokens, unfinished = torch.empty(2, 4, dtype=torch.long), torch.ones(2, dtype=torch.long)
    args = dict(logits=logits, table=table, rows=rows, positions=positions, seqlens=seqlens, last=last, tokens=tokens,
                unfinished=unfinished, eos=[], pad=-1)
    for name, bad, message in [
        ("positions", positions.to(torch.int32), "positions must be int64 [2], got int32 [2]"),
        ("seqlens", seqlens[:1], "seqlens must be int32 [2], got int32 [1]"),
        ("rows", rows.float(), "rows must be bfloat16 [2, 16], got float32 [2, 16]"),
        ("tokens", tokens.int(), "tokens must be int64 [2, *], got int32 [2, 4]"),
        ("logits", logits.to(torch.int64), "logits must be float32, bfloat16 or float16 [B, V], got int64 [2, 16]"),
        ("table", table[:8], "16 logits per row but the embedding table has 8 rows"),
        ("last", torch.tensor([1, 16]), "token 16 of sequence 1 is not a row of the embedding table"),
        ("eos", [3], "pad id -1 is not a row of the embedding table (16 rows)"),
        ("positions", torch.zeros(4, dtype=torch.long)[::2], "positions"),  # not contiguous
    ]:
        with pytest.raises((ValueError, TypeError), match=re.escape(message)):
            tape.replay_greedy(2, **{**args, name: bad})
    with pytest.raises(ValueError, match="steps must be >= 0"):
        tape.replay_greedy(-1, **args)
    assert tape.replay_greedy(0, **args) == 0
