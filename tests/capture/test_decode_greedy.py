"""tileops.capture.decode_greedy: a greedy search's per-step work between replays of a
captured decode step, in the op layer's C++: the next token is each row's first largest
logit as torch.argmax picks it; its embedding row becomes the step's input; positions and
lengths move on; end-of-sequence ids finish sequences and pad them."""

from __future__ import annotations

import re

import pytest
import torch

from tileops.backend import register_detector, register_kernel_builder
from tileops.capture import Graph, decode_greedy
from tileops.ops import AddFwdOp, EmbeddingGgufFwdOp

BF = torch.bfloat16
TARGET = "fake"


@pytest.fixture(autouse=True)
def _adds():
    register_detector(TARGET, lambda device: device.type == "cpu")
    register_kernel_builder("AddFwdOp", TARGET, lambda x, y, *, alpha: lambda x, y: torch.add(x, y, alpha=alpha))


def _walk(table: torch.Tensor, first: list[int]) -> dict:
    """A captured step whose logits are its input rows (rows + 0, one AddFwdOp): the next
    token is then the first largest entry of the embedding table's row for the last one."""
    add = AddFwdOp(target=TARGET)
    rows = table[first].clone()
    zeros = torch.zeros_like(rows)
    add(rows, zeros)  # built outside the capture
    graph = Graph()
    with graph.capture():
        logits = add(rows, zeros)
    positions = torch.tensor([5 * b for b in range(len(first))])
    return dict(
        graph=graph,
        logits=logits,
        table=table,
        rows=rows,
        positions=positions,
        lengths=positions.to(torch.int32),
        last=torch.tensor(first),
    )


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


def _decode(walk: dict, steps: int, tokens: torch.Tensor, unfinished: torch.Tensor, eos=(), pad=-1) -> int:
    graph = walk.pop("graph")
    return decode_greedy(graph, steps, **walk, tokens=tokens, unfinished=unfinished, eos=list(eos), pad=pad)


def test_it_follows_the_first_largest_logit_as_torch_argmax_picks_it():
    gen = torch.Generator().manual_seed(3)
    vocab = 24
    table = torch.randn(vocab, vocab, generator=gen).to(BF)
    table[:, 7] = table[:, 2] = table.max() + 1  # a tie in every row: the first index wins
    table[5, 11] = float("nan")  # NaN is largest, as in torch.argmax
    table[9, 3] = table[9, 4] = float("nan")
    table[2, 5] = table[2, 7] + 1  # the walk goes 2 -> 5 -> 11 (the NaN) ...
    table[11, 9] = table[11, 2] + 1  # ... -> 9 -> 3 (the first NaN) -> 2 ...
    table[3, 2] = table[3, 7]
    walk = _walk(table, [2, 9])
    positions, lengths, last, rows = walk["positions"], walk["lengths"], walk["last"], walk["rows"]
    tokens = torch.full((2, 10), -1)
    assert _decode(walk, 8, tokens, torch.ones(2, dtype=torch.long)) == 8
    assert tokens[0, :8].tolist() == _walked(table, 2, 8) and tokens[0, :8].tolist()[:5] == [5, 11, 9, 3, 2]
    assert tokens[1, :8].tolist() == _walked(table, 9, 8)
    assert (tokens[:, 8:] == -1).all()  # columns past the steps run are left alone
    assert last.tolist() == tokens[:, 7].tolist()
    assert positions.tolist() == [8, 13] and lengths.tolist() == [8, 13]  # one more per step
    assert torch.equal(rows, table[tokens[:, 6]])  # the input of the last step run


@pytest.mark.parametrize("dtype", [BF, torch.float16, torch.float32])
def test_it_picks_as_torch_argmax_across_blocks_signed_zeros_and_infinities(dtype):
    gen = torch.Generator().manual_seed(5)
    vocab = 700  # several of the search's blocks of 256 logits
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
    tokens = torch.full((len(first), 3), -1)
    assert _decode(_walk(table, first), 3, tokens, torch.ones(len(first), dtype=torch.long)) == 3
    assert [row[0] for row in tokens.tolist()] == [300, 400, 260, 690, 0, 699, 5]
    for b, f in enumerate(first):
        assert tokens[b].tolist() == _walked(table, f, 3)


def test_it_keeps_each_steps_logits_as_float32():
    table = torch.randn(16, 16).to(torch.float16)
    table[3, 4] = 2.0**-20  # a float16 subnormal
    walk = _walk(table, [1, 3])
    kept = torch.full((4, 2, 16), float("nan"))
    tokens = torch.empty(2, 3, dtype=torch.long)
    assert (
        decode_greedy(
            walk.pop("graph"),
            3,
            **walk,
            tokens=tokens,
            unfinished=torch.ones(2, dtype=torch.long),
            eos=[],
            pad=0,
            kept_logits=kept,
        )
        == 3
    )
    inputs = [torch.tensor([1, 3])] + [tokens[:, s] for s in range(2)]
    for s in range(3):
        assert torch.equal(kept[s], table[inputs[s]].float())
    assert kept[3].isnan().all()


def test_it_pads_a_finished_sequence_and_stops_once_all_have_finished():
    gen = torch.Generator().manual_seed(4)
    vocab = 16
    table = torch.randn(vocab, vocab, generator=gen).to(BF)
    for a, b in ((1, 2), (2, 3), (3, 4), (4, 1), (6, 7), (7, 8), (8, 9), (9, 10), (10, 11), (11, 6)):
        table[a, b] = 10  # two cycles: 1 2 3 4 and 6 ... 11
    eos, pad = [3, 9], 0
    walk = _walk(table, [1, 6])
    positions = walk["positions"]
    tokens = torch.full((2, 12), -1)
    unfinished = torch.ones(2, dtype=torch.long)
    assert _decode(walk, 12, tokens, unfinished, eos, pad) == 3  # 0 meets 3 at its second token, 1 meets 9 at its third
    assert (
        tokens[:, :3].tolist()
        == [[2, 3, pad], [7, 8, 9]]
        == [_walked(table, 1, 3, eos, pad), _walked(table, 6, 3, eos, pad)]
    )
    assert unfinished.tolist() == [0, 0] and positions.tolist() == [3, 8]
    tokens = torch.full((2, 4), -1)  # a sequence that came in finished gets the pad token from its first step
    assert _decode(_walk(table, [1, 6]), 4, tokens, torch.tensor([0, 1]), [9], pad) == 3
    assert tokens[:, :3].tolist() == [[pad, pad, pad], [7, 8, 9]]


def test_a_step_that_embeds_its_tokens_itself_gets_their_ids():
    """ids= instead of rows=: the token goes into the step's input ids, and the table (here
    the F32 blocks the step looks rows up in) only bounds the ids."""
    register_kernel_builder(
        "EmbeddingGgufFwdOp",
        TARGET,
        lambda ids, weight, *, ggml_type, out_dtype: lambda ids, weight: weight.view(torch.float32)[ids].to(BF),
    )
    gen = torch.Generator().manual_seed(6)
    vocab = 40
    dense = torch.randn(vocab, vocab, generator=gen)
    blocks = dense.view(torch.uint8)  # F32 rows of 4-byte blocks
    lookup = EmbeddingGgufFwdOp("F32", "bfloat16", target=TARGET)
    ids = torch.tensor([4, 17])
    lookup(ids, blocks)  # built outside the capture
    graph = Graph()
    with graph.capture():
        logits = lookup(ids, blocks)
    positions = torch.tensor([3, 9])
    tokens = torch.full((2, 6), -1)
    args = dict(logits=logits, table=blocks, positions=positions, lengths=positions.to(torch.int32), eos=[], pad=0)
    steps = decode_greedy(
        graph, 6, **args, ids=ids, last=torch.tensor([4, 17]), tokens=tokens, unfinished=torch.ones(2, dtype=torch.long)
    )
    assert steps == 6
    table = dense.to(BF)
    assert tokens.tolist() == [_walked(table, 4, 6), _walked(table, 17, 6)]
    assert ids.tolist() == tokens[:, 4].tolist()  # the input of the last step run
    assert positions.tolist() == [9, 15]
    with pytest.raises(ValueError, match="give the step's input rows or its input ids, one of the two"):
        decode_greedy(
            graph,
            1,
            **args,
            ids=ids,
            rows=torch.zeros(2, vocab, dtype=BF),
            last=torch.tensor([1, 2]),
            tokens=tokens,
            unfinished=torch.ones(2, dtype=torch.long),
        )
    with pytest.raises(ValueError, match=re.escape("ids must be int64 [2], got torch.int32 [2]")):
        decode_greedy(
            graph,
            1,
            **args,
            ids=ids.int(),
            last=torch.tensor([1, 2]),
            tokens=tokens,
            unfinished=torch.ones(2, dtype=torch.long),
        )


def test_it_refuses_what_it_cannot_read_naming_it():
    table = torch.randn(16, 16).to(BF)
    walk = _walk(table, [1, 2])
    graph = walk.pop("graph")
    args = dict(
        walk, tokens=torch.empty(2, 4, dtype=torch.long), unfinished=torch.ones(2, dtype=torch.long), eos=[], pad=-1
    )
    for name, bad, message in [
        ("positions", walk["positions"].to(torch.int32), "positions must be int64 [2], got torch.int32 [2]"),
        ("lengths", walk["lengths"][:1], "lengths must be int32 [2], got torch.int32 [1]"),
        ("rows", walk["rows"].float(), "rows must be torch.bfloat16 [2, 16], got torch.float32 [2, 16]"),
        ("tokens", args["tokens"].int(), "tokens must be int64 [2, *], got torch.int32 [2, 4]"),
        (
            "logits",
            walk["logits"].to(torch.int64),
            "logits must be float32, bfloat16 or float16 [B, V], got torch.int64",
        ),
        ("table", table[:8], "16 logits per row but the embedding table has 8 rows"),
        ("last", torch.tensor([1, 16]), "token 16 of sequence 1 is not a row of the embedding table"),
        ("eos", [3], "pad id -1 is not a row of the embedding table (16 rows)"),
        ("positions", torch.zeros(4, dtype=torch.long)[::2], "positions must be contiguous"),
        ("logits", torch.zeros(2, 16, device="meta"), "logits must be a CPU tensor"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            decode_greedy(graph, 2, **{**args, name: bad})
    with pytest.raises(ValueError, match="steps must be >= 0"):
        decode_greedy(graph, -1, **args)
    assert decode_greedy(graph, 0, **args) == 0
