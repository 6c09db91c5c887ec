"""What a builder refuses, and how it says so.

The op layer checks every call against the op's manifest before a builder runs, but a
builder is also called directly (tests, benchmarks, ``tileops check --device``), and a
kernel must never be handed what it cannot compute. So each builder checks what its kernel
relies on and refuses anything else: a ``TypeError`` for a dtype, a ``ValueError`` for
anything else, each naming what was expected, what arrived and what to do.
"""

from __future__ import annotations

from typing import Any

import torch

TARGET = "torch_cpu"

HALVES = (torch.float16, torch.bfloat16)
FLOATS = (torch.float16, torch.bfloat16, torch.float32)
ALL_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, *FLOATS)
# The default advice: the op's manifest entry is the contract a builder enforces.
_SEE_MANIFEST = "call the op as its manifest entry (src/tileops/manifest/*.yaml) describes"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def shape_of(spec: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in spec.shape)


def refuse(op: str, expected: str, got: str, fix: str = _SEE_MANIFEST) -> ValueError:
    return ValueError(f"{TARGET} {op}: expected {expected}; got {got}; {fix}")


def on_cpu(op: str, **specs: Any) -> None:
    """Every given tensor on the CPU: the only device this target's detector claims."""
    for name, spec in specs.items():
        if spec is not None and torch.device(spec.device).type != "cpu":
            raise refuse(
                op,
                "every tensor on the CPU",
                f"{name} on {spec.device}",
                f"{TARGET} serves CPU devices only: pass target= a backend that serves "
                f"{torch.device(spec.device).type}",
            )


def check_tensors(op: str, dtypes: tuple[torch.dtype, ...], **specs: Any) -> torch.dtype:
    """The data inputs: on the CPU, the first one's dtype among ``dtypes`` and the others
    of that dtype (the manifest's ``same_as``); None is an absent optional input. Returns
    the dtype."""
    on_cpu(op, **specs)
    (first, spec), *others = [(n, s) for n, s in specs.items() if s is not None]
    if spec.dtype not in dtypes:
        raise TypeError(
            f"{TARGET} {op}: expected {first} of {' | '.join(map(_name, dtypes))}; got "
            f"{_name(spec.dtype)}; cast it to one of those"
        )
    for name, other in others:
        if other.dtype != spec.dtype:
            raise TypeError(
                f"{TARGET} {op}: expected {name} of {first}'s dtype {_name(spec.dtype)}; got "
                f"{_name(other.dtype)}; cast the inputs to one dtype"
            )
    return spec.dtype


def check_dtype(op: str, dtypes: tuple[torch.dtype, ...], **specs: Any) -> None:
    """Inputs with a dtype of their own (offsets, page tables, position ids, float32
    logits and scales), each among ``dtypes``; None is an absent optional input."""
    on_cpu(op, **specs)
    for name, spec in specs.items():
        if spec is not None and spec.dtype not in dtypes:
            raise TypeError(
                f"{TARGET} {op}: expected {name} of {' | '.join(map(_name, dtypes))}; got "
                f"{_name(spec.dtype)}; cast it to one of those"
            )
