"""native_cpu under tileops.capture: its kernels take their outputs from the capture ABI
(tileops/capture_abi.h), so a replay writes the outputs made while capturing in place and
copies nothing; a replayed launch asking for an output its capture did not make is refused."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tileops import ops
from tileops.capture import Graph

BF = torch.bfloat16
TARGET = "native_cpu"


class _Copies(TorchDispatchMode):
    """Counts the torch copies made while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.copies += func.overloadpacket is torch.ops.aten.copy_
        return func(*args, **(kwargs or {}))


def test_a_replay_writes_the_captured_outputs_in_place_without_a_copy():
    gen = torch.Generator().manual_seed(0)
    a, w, g = (
        torch.randn(3, 64, generator=gen, dtype=BF),
        torch.randn(32, 64, generator=gen, dtype=BF),
        torch.rand(32, dtype=BF),
    )
    gemm, norm = ops.GemmFwdOp(False, True, target=TARGET), ops.RMSNormFwdOp([32], target=TARGET)
    norm(gemm(a, w), g)
    graph = Graph()
    with graph.capture():
        out = norm(gemm(a, w), g)
    a.copy_(torch.randn(3, 64, generator=gen, dtype=BF))
    want = norm(gemm(a, w), g)
    pointer = out.data_ptr()
    with _Copies() as watch:
        graph.replay()
    assert torch.equal(out, want) and out.data_ptr() == pointer and watch.copies == 0


def test_a_replayed_launch_asking_for_an_output_its_capture_did_not_make_is_refused():
    a, w = torch.randn(2, 64, dtype=BF), torch.randn(32, 64, dtype=BF)
    gemm = ops.GemmFwdOp(False, True, target=TARGET)
    gemm(a, w)
    graph = Graph()
    with graph.capture():
        gemm(a, w)
    a.resize_(4, 64)
    with pytest.raises(ValueError, match="GemmFwdOp asked for an output its capture did not make"):
        graph.replay()
