"""Decode steps replayed from a captured graph of op launches (``tileops.capture``).

A decode step of the fused loop (``fused/model.py``) is about ten op calls per layer
around one token per sequence. Each call is microseconds of Python (the loop, the op
layer, the kernel's argument checks) around a kernel that, but for the GEMVs, computes
less than that.

The op layer captures a stretch of op launches and replays them from C++
(``tileops.capture.Graph``, torch.cuda.CUDAGraph's contract), for any target: the same
kernels on the same input tensors, each launch checked as a call is (value rules:
lengths against pages, positions against the RoPE tables), into the outputs made while
capturing. So a decode step here is:

- a step at a new batch, cache or pool runs the loop as usual (its kernels are built);
- the next step runs the loop while the graph captures, on inputs this integration owns:
  copies of the step's embeddings (or of its token ids, where the model's embedding is a
  served op: ``FusedModel.step_embeds``, the lookup then captured too) and positions; the
  cache updates its lengths and block table in place (``TileopsCache._begin``);
- every later step copies its embeddings or ids and positions into those, does the cache's
  bookkeeping (``begin_forward``, ``layers_ran``) and replays the graph, whose last norm
  writes the step's output (returned as a copy: the next replay overwrites it); or, for a
  causal LM's step served whole (``FusedModel.decode_logits``), whose LM head's GEMM
  writes the step's logits. Each thread keeps one graph of each kind.

A graph serves while what it captured holds: the same cache, pools (a pool that grows is
new memory), block table and lengths tensors, and batch. Otherwise the step captures
anew. Each thread captures and replays its own (``Recording``): threads that decode on one
model at once, each on its own cache, do not share inputs or outputs. A capture that
fails (``CaptureError``: a torch operator computed between the launches, a strided
input) leaves the step's result as computed; after three such failures at a batch size
the model stops trying at that size and says why in ``DecodeReplay.refused``. (A
batch's decode step runs its q/k/v projections one by one, ``attention_rows``, so that
no copy of a strided view runs between the launches.)

The results are the same bits as the loop's: the same kernels on the same values.
``TILEOPS_DECODE_REPLAY=0`` at enable turns replay off.
"""

from __future__ import annotations

import collections
import os
import threading
import time
import weakref
from typing import Any

import torch
from torch import nn

from tileops.capture import CaptureError, Graph

from ..cache import TileopsCache
from ..fused.forwards import embedding_rows, linear_rows

__all__ = ["DecodeReplay", "Recording", "replay_wanted"]

ATTEMPTS = 3  # failed captures before a model stops capturing at a batch size


def replay_wanted() -> bool:
    return os.environ.get("TILEOPS_DECODE_REPLAY", "1") != "0"


class Recording:
    """One thread's captured decode step and what it reads and writes."""

    def __init__(
        self, graph: Graph, inputs: tuple[torch.Tensor, torch.Tensor], output: torch.Tensor, key: tuple, cache: Any
    ) -> None:
        self.graph, self.inputs, self.output, self.key = (
            graph,
            inputs,
            output,
            key,
        )  # inputs: (embeddings rows [B, hidden] or token ids [B], positions)
        self.cache = weakref.ref(cache, self._cache_gone)  # the graph holds its pools: let them go with it

    def serves(self, cache: Any, key: tuple) -> bool:
        return self.graph is not None and self.cache() is cache and all(a is b for a, b in zip(key, self.key))

    def _cache_gone(self, _: weakref.ref) -> None:
        self.graph = self.inputs = self.output = None
        self.key = ()


class DecodeReplay:
    """The captured graphs of one fused model's decode step: one per thread and kind
    (threads decoding at once each replay their own, on their own outputs)."""

    def __init__(self, fused: Any) -> None:
        self.fused = fused
        # .recordings: this thread's Recording per kind of step (with the head or without);
        # .last: the one it used last
        self._local = threading.local()
        self.failed: collections.Counter[int] = collections.Counter()  # failed captures per batch size
        self.refused: dict[int, str] = {}  # batch size -> why its decode steps are not replayed
        self.replays = 0  # steps replayed (for tests and benchmarks)
        self.searched = 0  # of which by greedy search's loop in C++ (decode/generate.py)
        self.replay_seconds = 0.0  # the last replay's wall time (for benchmarks: hf_profile.py)

    @property
    def recording(self) -> Recording | None:
        """This thread's recording of its last step, where that step was replayed or captured
        (None where it ran the loop without a graph)."""
        return getattr(self._local, "last", None)

    def recording_with(self, cache: Any, head: nn.Linear) -> Recording | None:
        """``recording`` where this thread's last step ran through a graph ending with
        ``head``'s GEMM on ``cache``, reading the cache's current step tensors (what
        ``tileops.capture.decode_greedy`` goes on from: ``decode/generate.py``); None otherwise."""
        rec, step = self.recording, getattr(cache, "step", None)
        if rec is None or rec.key[-1] is not head or rec.cache() is not cache or step is None:
            return None
        return rec if rec.key[2] is step.block_table and rec.key[3] is step.cache_seqlens else None

    def step(
        self, cache: Any, rows: torch.Tensor, pos: torch.Tensor, masks: list, batch: int, head: nn.Linear | None = None
    ) -> torch.Tensor:
        """One decode step: rows ``[B, hidden]`` (embeddings; or ids ``[B]`` where the model's
        embedding is served), pos ``[B]`` -> ``[B, hidden]``;
        with ``head`` (the causal LM's served output projection, ``planning/enable.py``), its logits
        ``[B, vocab]``, the head's GEMM captured with the layers."""
        self._local.last = None  # until this step runs through a graph
        if (
            batch in self.refused
            or not isinstance(cache, TileopsCache)
            or cache.paged is None
            or rows.device.type != "cpu"
        ):
            return self._forward(rows.contiguous(), pos, masks, cache, batch, head)
        step = cache.begin_forward(batch, 1, masks[0])
        key = (
            cache.paged,
            cache.paged.num_pages,
            step.block_table,
            step.cache_seqlens,
            step.cu_seqlens_q,
            rows.dtype,
            batch,
            head,
        )
        recordings = self._recordings()
        mine = recordings.get(head is not None)
        if mine is not None and mine.serves(cache, key):
            h, p = mine.inputs
            h.copy_(rows)
            p.copy_(pos)
            cache.layers_ran(1)
            start = time.perf_counter()
            mine.graph.replay()
            self.replay_seconds = time.perf_counter() - start
            self.replays += 1
            self._local.last = mine
            return mine.output.clone()
        return self._record(cache, rows, pos, masks, batch, key, head)

    def _recordings(self) -> dict[bool, Recording]:
        if not hasattr(self._local, "recordings"):
            self._local.recordings = {}
        return self._local.recordings

    def _forward(
        self, rows: torch.Tensor, pos: torch.Tensor, masks: list, cache: Any, batch: int, head: nn.Linear | None
    ) -> torch.Tensor:
        if rows.ndim == 1:  # token ids: the served embedding's lookup is part of the step
            rows = embedding_rows(self.fused.base.embed_tokens, rows)
        x = self.fused.layers_forward(rows, pos, masks, cache, batch, 1)
        return x if head is None else linear_rows(head, x)

    def _record(
        self,
        cache: Any,
        rows: torch.Tensor,
        pos: torch.Tensor,
        masks: list,
        batch: int,
        key: tuple,
        head: nn.Linear | None,
    ) -> torch.Tensor:
        recordings = self._recordings()
        old = recordings.pop(head is not None, None)  # the old graph's tensors go now, not after this one is made
        if self.recording is old:
            self._local.last = None
        del old
        h, p = rows.clone(), pos.clone()
        graph = Graph()
        try:
            with graph.capture():
                x = self._forward(h, p, masks, cache, batch, head)
        except CaptureError as error:  # the step ran as usual: its result stands
            if not error.kernels_built:  # built kernels: a first step at this shape; the next one captures
                self.failed[batch] += 1
                if self.failed[batch] >= ATTEMPTS:
                    self.refused[batch] = str(error)
            return x.clone()
        recordings[head is not None] = self._local.last = Recording(graph, (h, p), x, key, cache)
        return x.clone()
