"""Capture and replay of op launches, for any target: the op layer's CPU-side analogue of
``torch.cuda.CUDAGraph``.

    graph = tileops.capture.Graph()
    with graph.capture():             # the ops run as usual, and each launch is recorded
        y = step(x)                   # x: a static input, y: an output made while capturing
    x.copy_(new_x)                    # update the inputs in place
    graph.replay()                    # the same launches from C++, no Python between them: y holds the result

The contract is CUDAGraph's:

- a capture records each op launch on this thread: the kernel and its input tensors;
- a replay runs the recorded launches again on the same input tensors, whatever they hold
  now (the caller updates them in place), into the outputs made while capturing;
- anything a replay could not redo fails the capture (``CaptureError`` at the end of the
  ``with`` block, the stretch having run as usual): a kernel built during the capture (a
  new input signature: run the stretch once first, as before a CUDA graph capture), a
  strided input (the launch copies it first), or a torch operator that computed between
  the launches (it is not a launch: a replay would skip it; views and allocations are
  allowed).

Each replayed launch is checked as a call is (the op's value rules; the kernel's own
checks). A kernel that allocates its outputs through the capture ABI (C++ kernels:
``include_dir()``'s ``tileops/capture_abi.h``) writes the captured outputs in place on
replay; any other kernel's fresh results are copied into them, so every backend replays
correctly and C++ backends copy nothing.

A CUDA backend's kernels launch on torch's current stream, so a CUDA graph captures them
as they are: pass ``Graph(device_graph=torch.cuda.CUDAGraph())`` and the capture runs
inside the device graph's capture (``capture_begin`` / ``capture_end``), and ``replay``
replays the device graph instead of relaunching (its launches are kept for
``descriptions``).

``decode_greedy`` runs a greedy decoding loop on a captured decode step: the per-step
work of a greedy search (the next token, its embedding row, positions and lengths, end of
sequence) in the op layer's C++, between replays.
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tileops import _C

__all__ = ["CaptureError", "Graph", "decode_greedy", "include_dir"]

_ALLOCATIONS = {torch.ops.aten.empty, torch.ops.aten.empty_strided}


class CaptureError(RuntimeError):
    """What a replay could not redo happened during a capture (the message says what).
    ``kernels_built``: a kernel was built in it (the stretch had not run at these input
    signatures before: run it once, then capture again)."""

    def __init__(self, message: str, kernels_built: bool = False) -> None:
        super().__init__(message)
        self.kernels_built = kernels_built


class _WatchComputation(TorchDispatchMode):
    """Notes every torch operator that computes (not a view, not an allocation) outside
    the launches: a kernel's own torch operators (a backend written in PyTorch) are part
    of its launch. The op layer's dispatcher runs tileops ops under it as in eager (they
    are launches, not traced)."""

    def __init__(self) -> None:
        super().__init__()
        self.computed: list[str] = []

    def __enter__(self) -> _WatchComputation:
        entered = super().__enter__()
        _C.set_watching_modes(1)
        return entered

    def __exit__(self, *exc: object) -> None:
        _C.set_watching_modes(0)
        super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.overloadpacket not in _ALLOCATIONS and not _C.in_launch():
            self.computed.append(str(func))
        return func(*args, **(kwargs or {}))


class Graph:
    """Op launches captured on one thread (``capture()``) and replayed (``replay()``)."""

    def __init__(self, device_graph: Any = None) -> None:
        self._graph = _C.Graph()
        self._device_graph = device_graph

    @contextlib.contextmanager
    def capture(self) -> Iterator[Graph]:
        """Records this thread's op launches in the ``with`` block; raises ``CaptureError``
        at its end when something in it cannot be replayed (the block has run as usual)."""
        watch = _WatchComputation()
        self._graph.begin()
        failure, built = "", False
        try:
            if self._device_graph is not None:
                self._device_graph.capture_begin()
            try:
                with watch:
                    yield self
            finally:
                if self._device_graph is not None:
                    self._device_graph.capture_end()
        finally:
            failure, built = self._graph.end()
        if not failure and watch.computed:
            self._graph.reset()
            failure = (
                "torch computed between the captured launches (a replay would skip it): "
                f"{', '.join(sorted(set(watch.computed)))}"
            )
        if failure:
            raise CaptureError(f"the capture cannot be replayed: {failure}", built)

    def replay(self) -> None:
        """Runs the captured launches again, in order, into the outputs made while capturing."""
        if self._device_graph is not None:
            self._device_graph.replay()
        else:
            self._graph.replay()

    def replay_timed(self) -> list[float]:
        """``replay()``, returning each launch's wall time in seconds (as ``descriptions()``)."""
        return self._graph.replay_timed()

    def reset(self) -> None:
        """Drops the capture (the graph can capture again)."""
        self._graph.reset()

    def descriptions(self) -> list[str]:
        """Each captured launch: its op, its inputs' shapes and its result's shapes."""
        return self._graph.descriptions()

    def __len__(self) -> int:
        return len(self._graph)


def decode_greedy(
    graph: Graph,
    steps: int,
    *,
    logits: torch.Tensor,
    table: torch.Tensor,
    rows: torch.Tensor | None = None,
    ids: torch.Tensor | None = None,
    positions: torch.Tensor,
    lengths: torch.Tensor,
    last: torch.Tensor,
    tokens: torch.Tensor,
    unfinished: torch.Tensor,
    eos: list[int],
    pad: int,
    kept_logits: torch.Tensor | None = None,
) -> int:
    """Greedy decoding on ``graph``, a captured decode step whose last launch writes
    ``logits`` [B, V]: up to ``steps`` times, each sequence's token in ``last`` [B] (int64)
    has its row of the embedding ``table`` copied into ``rows`` [B, H] (the step's input)
    or, for a step that embeds its tokens itself, goes to ``ids`` [B] (int64; ``table``
    then only bounds the ids: a table in any layout, [V, ...]); ``positions`` [B] (int64)
    and ``lengths`` [B] (int32, the cache's) move on by one, the
    graph replays, and each row's first largest logit (``torch.argmax``'s pick) becomes its
    next token, in ``last`` and column s of ``tokens`` [B, >= steps]. With ``eos`` ids, a
    finished sequence (``unfinished`` [B], int64 0/1) gets ``pad`` and a token in ``eos``
    finishes its sequence; the loop ends once none is unfinished. With ``kept_logits``
    (float32 [>= steps, B, V]), step s's logits go to ``kept_logits[s]``. Host tensors,
    contiguous. Returns the steps run."""
    return _C.decode_greedy(
        graph._graph,
        steps,
        logits,
        table,
        rows,
        ids,
        positions,
        lengths,
        last,
        tokens,
        unfinished,
        list(eos),
        pad,
        kept_logits,
    )


def include_dir() -> str:
    """The directory holding ``tileops/capture_abi.h`` (for a backend's C or C++ build)."""
    return str(pathlib.Path(__file__).parent / "include")
