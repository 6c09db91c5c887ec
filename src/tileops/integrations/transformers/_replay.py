"""Decode steps replayed from a tape of native_cpu kernel calls.

A decode step of the fused loop (``_fused_model.py``) is about ten op calls per layer
around one token per sequence. Each call is microseconds of Python (the loop, the op
layer, the kernel object's argument checks) around a kernel that, but for the GEMVs,
computes less than that: on hf_profile.py's model as deep but tiny, the Python was about
two thirds of a step.

native_cpu records the kernel calls of a stretch of Python on a tape and replays them
from C++ (``tileops_native_cpu.kernel_tape``; backends/native_cpu/csrc/bind/tape.h): the
same kernels on the same tensors, each call checked by its kernel as any call is
(lengths against pages, positions against the RoPE tables). So a decode step here is:

- the first decode step on a cache runs the loop while the tape records, on inputs the
  tape owns: copies of the step's embeddings and positions; the cache updates its lengths
  and block table in place (``TileopsCache._begin``);
- every later step copies its embeddings and positions into those, does the cache's
  bookkeeping (``begin_forward``, ``layers_ran``) and replays the tape, whose last norm
  writes the step's output (returned as a copy: the next replay overwrites it); or, for a
  causal LM's step served whole (``FusedModel.decode_logits``), whose LM head's GEMM
  writes the step's logits. Each thread keeps one tape of each kind.

A tape serves while what it recorded holds: the same cache, pools (a pool that grows is
new memory), block table and lengths tensors, and batch. Otherwise the step records anew.
Each thread records and replays its own (``Recording``): threads that decode on one model
at once, each on its own cache, do not share inputs or outputs.
It records only where that is safe:

- every op the loop calls runs on native_cpu (a tape holds native_cpu kernels only);
- nothing but those kernels computes in the recorded stretch: a torch dispatch mode
  watches it, and any torch operator but a view or an allocation (a copy that
  ``contiguous()`` made, say) discards the tape. The step itself was computed as usual
  either way; after three discarded recordings at a batch size the model stops trying at
  that size and says why in ``DecodeReplay.refused``. (A batch's decode step runs its
  q/k/v projections one by one, ``attention_rows``, so that no copy of a strided view runs
  between the kernels.)

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
from torch.utils._python_dispatch import TorchDispatchMode

from tileops import _C
from tileops.ops.op import Op

from ._cache import TileopsCache
from ._forwards import linear_rows

__all__ = ["DecodeReplay", "Recording", "replay_wanted"]

TARGET = "native_cpu"
ATTEMPTS = 3  # discarded recordings before a model stops recording
_ALLOCATIONS = {torch.ops.aten.empty, torch.ops.aten.empty_strided}


def replay_wanted() -> bool:
    return os.environ.get("TILEOPS_DECODE_REPLAY", "1") != "0"


class _OnlyViews(TorchDispatchMode):
    """Notes every torch operator that computes (not a view, not an allocation)."""

    def __init__(self) -> None:
        super().__init__()
        self.computed: list[str] = []

    def __enter__(self) -> _OnlyViews:
        entered = super().__enter__()
        _C.set_watching_modes(1)  # tileops ops under it run their kernels, as in eager: not traced
        return entered

    def __exit__(self, *exc: object) -> None:
        _C.set_watching_modes(0)
        super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.overloadpacket not in _ALLOCATIONS:
            self.computed.append(str(func))
        return func(*args, **(kwargs or {}))


class Recording:
    """One thread's tape of a decode step and what it reads and writes."""

    def __init__(self, tape: Any, inputs: tuple[torch.Tensor, torch.Tensor], output: torch.Tensor, key: tuple,
                 cache: Any) -> None:
        self.tape, self.inputs, self.output, self.key = tape, inputs, output, key  # inputs: (embeddings rows, positions)
        self.cache = weakref.ref(cache, self._cache_gone)  # the tape holds its pools: let them go with it

    def serves(self, cache: Any, key: tuple) -> bool:
        return self.tape is not None and self.cache() is cache and all(a is b for a, b in zip(key, self.key))

    def _cache_gone(self, _: weakref.ref) -> None:
        self.tape = self.inputs = self.output = None
        self.key = ()


class DecodeReplay:
    """The tapes of one fused model's decode step, recorded and replayed: one per thread
    (threads decoding at once each replay their own, on their own outputs)."""

    def __init__(self, fused: Any) -> None:
        self.fused = fused
        # .recordings: this thread's Recording per kind of step (with the head or without);
        # .last: the one it used last
        self._local = threading.local()
        self.discarded: collections.Counter[int] = collections.Counter()  # per batch size
        self.refused: dict[int, str] = {}  # batch size -> why its decode steps are not replayed
        self.replays = 0  # steps replayed (for tests and benchmarks)
        self.searched = 0  # of which by greedy search's loop in C++ (_generate.py)
        self.replay_seconds = 0.0  # the last replay's wall time (for benchmarks: hf_profile.py)

    @property
    def recording(self) -> Recording | None:
        """This thread's recording of its last step, where that step was replayed or recorded
        (None where it ran the loop without a tape)."""
        return getattr(self._local, "last", None)

    def recording_with(self, cache: Any, head: nn.Linear) -> Recording | None:
        """``recording`` where this thread's last step ran through a tape ending with
        ``head``'s GEMM on ``cache``, reading the cache's current step tensors (what a
        tape's ``replay_greedy`` goes on from: ``_generate.py``); None otherwise."""
        rec, step = self.recording, getattr(cache, "step", None)
        if rec is None or rec.key[-1] is not head or rec.cache() is not cache or step is None:
            return None
        return rec if rec.key[2] is step.block_table and rec.key[3] is step.cache_seqlens else None

    def step(self, cache: Any, rows: torch.Tensor, pos: torch.Tensor, masks: list, batch: int,
             head: nn.Linear | None = None) -> torch.Tensor:
        """One decode step: rows ``[B, hidden]`` (embeddings), pos ``[B]`` -> ``[B, hidden]``;
        with ``head`` (the causal LM's served output projection, ``_patch.py``), its logits
        ``[B, vocab]``, the head's GEMM on the tape with the layers."""
        self._local.last = None  # until this step runs through a tape
        if batch in self.refused or not isinstance(cache, TileopsCache) or cache.paged is None or rows.device.type != "cpu":
            return self._forward(rows.contiguous(), pos, masks, cache, batch, head)
        step = cache.begin_forward(batch, 1, masks[0])
        key = (cache.paged, cache.paged.num_pages, step.block_table, step.cache_seqlens, step.cu_seqlens_q, rows.dtype,
               batch, head)
        recordings = self._recordings()
        mine = recordings.get(head is not None)
        if mine is not None and mine.serves(cache, key):
            h, p = mine.inputs
            h.copy_(rows)
            p.copy_(pos)
            cache.layers_ran(1)
            start = time.perf_counter()
            mine.tape.replay()
            self.replay_seconds = time.perf_counter() - start
            self.replays += 1
            self._local.last = mine
            return mine.output.clone()
        return self._record(cache, rows, pos, masks, batch, key, head)

    def _recordings(self) -> dict[bool, Recording]:
        if not hasattr(self._local, "recordings"):
            self._local.recordings = {}
        return self._local.recordings

    def _forward(self, rows: torch.Tensor, pos: torch.Tensor, masks: list, cache: Any, batch: int,
                 head: nn.Linear | None) -> torch.Tensor:
        x = self.fused.layers_forward(rows, pos, masks, cache, batch, 1)
        return x if head is None else linear_rows(head, x)

    def _record(self, cache: Any, rows: torch.Tensor, pos: torch.Tensor, masks: list, batch: int,
                key: tuple, head: nn.Linear | None) -> torch.Tensor:
        try:
            from tileops_native_cpu import kernel_tape  # noqa: PLC0415 - only where native_cpu serves the model
        except ImportError:
            self.refused[batch] = f"{TARGET} (pip install tileops-native-cpu) is not installed"
            return self._forward(rows.contiguous(), pos, masks, cache, batch, head)
        recordings = self._recordings()
        old = recordings.pop(head is not None, None)  # the old tape's tensors go now, not after this one is made
        if self.recording is old:
            self._local.last = None
        del old
        h, p = rows.clone(), pos.clone()
        tape, watch = kernel_tape(), _OnlyViews()
        with watch, tape:
            x = self._forward(h, p, masks, cache, batch, head)
        elsewhere = sorted({f"{type(op).__name__} on {op.settled_target}" for op in self._ops(head)
                            if op.settled_target not in (None, TARGET)})
        if elsewhere:
            self.refused[batch] = f"ops run elsewhere than {TARGET}: {', '.join(elsewhere)}"
        elif watch.computed:
            self.discarded[batch] += 1
            if self.discarded[batch] >= ATTEMPTS:
                self.refused[batch] = f"torch computed between the kernels: {', '.join(sorted(set(watch.computed)))}"
        else:
            recordings[head is not None] = self._local.last = Recording(tape, (h, p), x, key, cache)
        return x.clone()

    def _ops(self, head: nn.Linear | None = None) -> list[Op]:
        """Every op the fused loop's modules hold (their states, stacked projections, the
        attention ops made per shape), the add-and-norm ops between the layers, and the
        head's."""
        found: list[Op] = []
        todo: list[Any] = [m.__dict__.get("_tileops") for m in [*self.fused.submodules, head] if m is not None]
        todo += self.fused.joins
        seen: set[int] = set()
        while todo:
            obj = todo.pop()
            if id(obj) in seen or isinstance(obj, (torch.Tensor, torch.nn.Module, type)):
                continue
            seen.add(id(obj))
            if isinstance(obj, Op):
                found.append(obj)
            elif isinstance(obj, dict):
                todo.extend(obj.values())
            elif isinstance(obj, (list, tuple)):
                todo.extend(obj)
            elif hasattr(obj, "__dict__"):  # a state, a stacked projection, an op-per-shape memo's function
                todo.extend(vars(obj).values())
        return found
