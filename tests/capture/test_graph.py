"""tileops.capture.Graph: op launches captured once and replayed from C++ on what their input
tensors hold now, into the outputs made while capturing, for any target; what a replay
could not redo fails the capture, and a replayed launch is checked as a call is."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

from tileops.backend import register_detector, register_kernel_builder
from tileops.capture import CaptureError, Graph
from tileops.ops import AddFwdOp, GemmFwdOp, RMSNormFwdOp, RopeNeoxPositionIdsFwdOp

BF = torch.bfloat16
TARGET = "fake"


@pytest.fixture
def built():
    """A target whose kernels are torch functions making fresh outputs (a backend written
    in PyTorch): its builds are counted."""
    builds: list[str] = []

    def builder(op, kernel):
        def build(*specs, **params):
            builds.append(op)
            return kernel(**params)

        register_kernel_builder(op, TARGET, build)

    register_detector(TARGET, lambda device: device.type == "cpu")
    builder("GemmFwdOp", lambda trans_a, trans_b: lambda a, b: a @ (b.t() if trans_b else b))
    builder("RMSNormFwdOp", lambda normalized_shape, eps: lambda x, w: F.rms_norm(x, tuple(normalized_shape), w, eps))
    builder("AddFwdOp", lambda alpha: lambda x, y: torch.add(x, y, alpha=alpha))
    return builds


def _chain():
    """A GEMM, then an RMSNorm of its output (the second launch reads the first's output)."""
    gemm, norm = GemmFwdOp(False, True, target=TARGET), RMSNormFwdOp([32], target=TARGET)
    return lambda a, w, g: norm(gemm(a, w), g)


def _inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(3, 64, generator=gen, dtype=BF),
        torch.randn(32, 64, generator=gen, dtype=BF),
        torch.rand(32, dtype=BF),
    )


def test_a_replay_recomputes_the_launches_from_inputs_updated_in_place_into_the_captured_outputs(built):
    a, w, g = _inputs()
    chain = _chain()
    chain(a, w, g)  # builds outside the capture, as before a CUDA graph capture
    graph = Graph()
    with graph.capture():
        out = chain(a, w, g)
    assert len(graph) == 2 and graph.descriptions() == [
        "GemmFwdOp: [3, 64], [32, 64] -> [3, 32]",
        "RMSNormFwdOp: [3, 32], [32] -> [3, 32]",
    ]
    a.copy_(torch.randn(3, 64, dtype=BF))
    g.copy_(torch.rand(32, dtype=BF))
    want = chain(a, w, g)
    assert not torch.equal(out, want)  # the captured output holds the old values until the replay
    builds = len(built)
    graph.replay()
    assert torch.equal(out, want) and len(built) == builds  # nothing built, nothing dispatched anew
    seconds = graph.replay_timed()
    assert torch.equal(out, want) and len(seconds) == 2 and all(0 <= s < 10 for s in seconds)


def test_a_kernel_built_during_the_capture_fails_it_after_the_stretch_ran(built):
    a, w, g = _inputs()
    chain, graph = _chain(), Graph()
    with pytest.raises(
        CaptureError, match="GemmFwdOp: its kernel for this input signature was built during the capture"
    ) as failed:
        with graph.capture():
            out = chain(a, w, g)
    assert failed.value.kernels_built and len(graph) == 0
    assert torch.equal(out, _chain()(a, w, g))  # the stretch ran as usual
    with graph.capture():  # the kernels exist now: the graph captures
        chain(a, w, g)
    assert len(graph) == 2


def test_torch_computing_between_the_launches_fails_the_capture_naming_the_operator(built):
    a, w, g = _inputs()
    chain = _chain()
    chain(a, w, g)
    graph = Graph()
    with pytest.raises(
        CaptureError, match=r"torch computed between the captured launches .*aten\.mul\.Tensor"
    ) as failed:
        with graph.capture():
            chain(a * 2, w, g)
    assert not failed.value.kernels_built and len(graph) == 0
    with graph.capture():  # views and allocations are no computation; a kernel's own torch work is its launch
        chain(a.view(3, 64), w, g)
    assert len(graph) == 2


def test_a_strided_input_fails_the_capture(built):
    add = AddFwdOp(target=TARGET)
    x = torch.randn(4, 8, dtype=BF)
    add(x.t().contiguous(), x.t().contiguous())
    graph = Graph()
    with pytest.raises(CaptureError, match="AddFwdOp: an input is strided"):
        with graph.capture():
            add(x.t(), x.t().contiguous())


def test_captures_do_not_nest_and_a_graph_holds_one_capture(built):
    graph = Graph()
    with graph.capture():
        with pytest.raises(ValueError, match="already in progress"), Graph().capture():
            pass
    with pytest.raises(ValueError, match="holds a capture already"), graph.capture():
        pass
    graph.reset()
    with graph.capture():
        pass


def test_a_replayed_launch_is_checked_as_a_call_is():
    """The op's value rules run on each replayed launch: a position past the RoPE tables is
    refused at the replay, not read out of bounds."""
    register_detector(TARGET, lambda device: device.type == "cpu")
    register_kernel_builder("RopeNeoxPositionIdsFwdOp", TARGET, lambda x, pos, **p: lambda x, pos: x.clone())
    rope = RopeNeoxPositionIdsFwdOp(16, 10000.0, rotary_dim=8, target=TARGET)
    x, pos = torch.randn(2, 2, 8, dtype=BF), torch.tensor([0, 5])
    rope(x, pos)
    graph = Graph()
    with graph.capture():
        rope(x, pos)
    pos[1] = 16
    with pytest.raises(ValueError, match="position_ids"):
        graph.replay()


def test_threads_capture_and_replay_their_own_graphs(built):
    chain = _chain()
    results: dict[int, bool] = {}
    start = threading.Barrier(2)

    def run(seed: int) -> None:
        a, w, g = _inputs(seed)
        chain(a, w, g)
        start.wait()
        graph = Graph()
        with graph.capture():
            out = chain(a, w, g)
        for step in range(5):
            a.copy_(torch.randn(3, 64, generator=torch.Generator().manual_seed(100 * seed + step), dtype=BF))
            graph.replay()
            results[seed] = results.get(seed, True) and torch.equal(out, chain(a, w, g)) and len(graph) == 2

    threads = [threading.Thread(target=run, args=(seed,)) for seed in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {1: True, 2: True}


def test_a_device_graph_captures_around_the_stretch_and_replays_instead_of_the_launches(built):
    """Where a CUDA backend plugs torch.cuda.CUDAGraph in: capture_begin/capture_end around
    the capture, and replay() replays the device graph (here a stand-in that counts)."""

    class DeviceGraph:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def capture_begin(self) -> None:
            self.calls.append("begin")

        def capture_end(self) -> None:
            self.calls.append("end")

        def replay(self) -> None:
            self.calls.append("replay")

    a, w, g = _inputs()
    chain = _chain()
    chain(a, w, g)
    device = DeviceGraph()
    graph = Graph(device_graph=device)
    with graph.capture():
        out = chain(a, w, g)
    before = out.clone()
    a.copy_(torch.randn(3, 64, dtype=BF))
    graph.replay()
    assert device.calls == ["begin", "end", "replay"] and len(graph) == 2
    assert torch.equal(out, before)  # the device graph replayed; no launch ran again
