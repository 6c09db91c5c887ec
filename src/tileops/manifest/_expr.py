"""Manifest expressions: checked and compiled once at load, evaluated in a tiny namespace.

Expressions are trusted source (they ship inside the package); the restricted namespace
keeps them honest (no imports, no builtins beyond the helpers) rather than sandboxing them.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import CodeType
from typing import Any

import torch


@dataclass(frozen=True, slots=True)
class TensorView:
    """What an expression sees of an input: metadata only, read-only."""

    shape: tuple[int, ...]
    ndim: int
    dtype: torch.dtype
    numel: int

    def __repr__(self) -> str:
        return f"tensor(shape={self.shape}, dtype={self.dtype})"


def view_of(spec: Any) -> TensorView:
    # A traced tensor's symbolic sizes stay symbolic: int() on one would specialise a
    # dimension the tracer was told is dynamic (vLLM marks the token count so).
    shape = tuple(d if isinstance(d, torch.SymInt) else int(d) for d in spec.shape)
    return TensorView(shape, len(shape), spec.dtype, math.prod(shape))


# --- helpers visible to expressions ---------------------------------------------------


def prod(values: Iterable[int]) -> int:
    """Product of integers; the empty product is 1 (a 0-d tensor has one element)."""
    return math.prod(values)


def broadcast_shapes(*shapes: Iterable[int]) -> tuple[int, ...]:
    """PyTorch broadcasting, in plain Python (no torch call on the validation path)."""
    tuples = [tuple(s) for s in shapes]
    ndim = max((len(s) for s in tuples), default=0)
    out = [1] * ndim
    for s in tuples:
        for i, size in enumerate(s, start=ndim - len(s)):
            if size == out[i] or size == 1:
                continue
            if out[i] == 1:
                out[i] = size
            else:
                raise ValueError(f"shapes {tuple(tuples)} do not broadcast")
    return tuple(out)


def broadcastable(*shapes: Iterable[int]) -> bool:
    try:
        broadcast_shapes(*shapes)
    except ValueError:
        return False
    return True


def reduced_shape(shape: Iterable[int], dim: int | Iterable[int] | None, keepdim: bool) -> tuple[int, ...]:
    """Shape after reducing ``dim`` (None or empty = every axis), as torch.sum does."""
    shape = tuple(shape)
    ndim = len(shape)
    if dim is None:
        axes = set(range(ndim))
    else:
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        if not dims:
            axes = set(range(ndim))
        else:
            wrap = max(ndim, 1)  # a 0-d tensor accepts dim 0 and -1, like PyTorch
            axes = set()
            for d in dims:
                if not -wrap <= d < wrap:
                    raise IndexError(f"dim {d} out of range for {ndim} dims")
                if d % wrap in axes:
                    raise ValueError(f"dim {d % wrap} appears more than once")
                axes.add(d % wrap)
    if keepdim:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def representable(value: int | float, dtype: Any) -> bool:
    """Whether a Python number converts to ``dtype`` without overflow (bool takes any)."""
    import torch  # local: the expression helpers stay importable without torch loaded

    if dtype == torch.bool:
        return True
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return info.min <= value <= info.max


# GGML block formats (tileops.quant.ggml_blocks), for the ops over GGUF weights: a type is
# named by its GGUF name ("Q4_K"); sizes are in weights (block) and bytes (type, row).


def _ggml(name: object) -> Any:
    from tileops.quant.ggml_blocks import ggml_type  # noqa: PLC0415 - loaded by the ops that use it

    return ggml_type(name)


def ggml_known(name: object) -> bool:
    """Whether ``name`` is a GGML type tileops serves."""
    try:
        _ggml(name)
    except (TypeError, ValueError):
        return False
    return True


def ggml_block_size(name: object) -> int:
    return _ggml(name).block_size


def ggml_type_size(name: object) -> int:
    return _ggml(name).type_size


def ggml_row_bytes(name: object, k: int) -> int:
    """The bytes of a row of ``k`` weights (``k`` a multiple of the block size)."""
    t = _ggml(name)
    return k // t.block_size * t.type_size


def ggml_row_dim(name: object, row_bytes: int) -> int:
    """The weights in a row of ``row_bytes`` bytes (a whole number of blocks)."""
    t = _ggml(name)
    return row_bytes // t.type_size * t.block_size


HELPERS: dict[str, Any] = {
    "ggml_known": ggml_known,
    "ggml_block_size": ggml_block_size,
    "ggml_type_size": ggml_type_size,
    "ggml_row_bytes": ggml_row_bytes,
    "ggml_row_dim": ggml_row_dim,
    "prod": prod,
    "broadcast_shapes": broadcast_shapes,
    "broadcastable": broadcastable,
    "representable": representable,
    "reduced_shape": reduced_shape,
    "len": len,
    "tuple": tuple,
    "list": list,
    "range": range,
    "all": all,
    "any": any,
    "min": min,
    "max": max,
    "abs": abs,
    "int": int,
    "isinstance": isinstance,
    "set": set,
    "sorted": sorted,
    "sum": sum,
    "isfinite": math.isfinite,
}

# An empty __builtins__ stops eval from inserting the real builtins module.
_BASE_NAMESPACE: dict[str, Any] = {"__builtins__": {}, **HELPERS}


def namespace(bindings: Mapping[str, Any]) -> dict[str, Any]:
    """A fresh globals dict. Bindings go in globals (not locals) so that names stay
    visible inside comprehensions, which get their own scope."""
    ns = dict(_BASE_NAMESPACE)
    ns.update(bindings)
    return ns


# --- compilation ----------------------------------------------------------------------


class ExprError(Exception):
    """An expression that does not compile or uses a name it may not see."""


_FORBIDDEN_NODES = (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)


@dataclass(frozen=True)
class Expr:
    """One compiled expression, plus what it reads (for error messages)."""

    source: str
    code: CodeType
    # (name, attribute or None) in order of first appearance: "weight.shape", "eps", ...
    reads: tuple[tuple[str, str | None], ...]

    def __call__(self, ns: dict[str, Any]) -> Any:
        # Compiled from the package's own manifests, checked for names at load.
        return eval(self.code, ns)

    def describe(self, ns: Mapping[str, Any]) -> str:
        """``weight.shape=(32,), normalized_shape=(64,)`` for the names this expression reads."""
        parts = []
        for name, attr in self.reads:
            value = ns.get(name)
            if attr is None:
                parts.append(f"{name}={value!r}")
            elif value is None:
                parts.append(f"{name}=None")
            else:
                parts.append(f"{name}.{attr}={getattr(value, attr, '?')!r}")
        return ", ".join(parts) if parts else "(reads no input or param)"

    def __repr__(self) -> str:
        return f"Expr({self.source!r})"


def compile_expr(source: object, filename: str, allowed: set[str], reported: set[str]) -> Expr:
    """Compile ``source``; every free name must be in ``allowed``.

    ``reported`` are the names (inputs, params) whose values an error message quotes.
    """
    if not isinstance(source, str) or not source.strip():
        raise ExprError(f"expected an expression string, got {source!r}")
    text = source.strip()
    try:
        tree = ast.parse(text, filename=filename, mode="eval")
        code = compile(tree, filename, "eval")
    except SyntaxError as exc:
        raise ExprError(f"syntax error in `{text}`: {exc.msg}") from None

    # Names bound inside the expression itself (comprehension targets, lambda arguments).
    local: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.comprehension):
            local.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Lambda):
            local.update(a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg))

    reads: list[tuple[int, int, str, str | None]] = []
    attr_names: set[int] = set()  # Name nodes already reported through an attribute
    for node in ast.walk(tree):
        if isinstance(node, _FORBIDDEN_NODES):
            raise ExprError(f"`{text}` uses {type(node).__name__}, which manifests may not")
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                raise ExprError(f"`{text}` reads the private attribute {node.attr!r}")
            if isinstance(node.value, ast.Name) and node.value.id in reported:
                attr_names.add(id(node.value))
                reads.append((node.lineno, node.col_offset, node.value.id, node.attr))
        elif (
            isinstance(node, ast.Name)
            and isinstance(node.ctx, ast.Load)
            and node.id not in allowed
            and node.id not in local
        ):
            raise ExprError(f"`{text}` reads unknown name {node.id!r}; it may read {sorted(allowed)}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in reported and node.id not in local and id(node) not in attr_names:
            reads.append((node.lineno, node.col_offset, node.id, None))

    seen: set[tuple[str, str | None]] = set()
    ordered: list[tuple[str, str | None]] = []
    for _, _, name, attr in sorted(reads, key=lambda r: (r[0], r[1])):
        if (name, attr) not in seen:
            seen.add((name, attr))
            ordered.append((name, attr))
    return Expr(text, code, tuple(ordered))
