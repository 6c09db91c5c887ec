"""The ``build_kernel`` of every op for the ``native_cpu`` target: the table ``BUILDERS``.

This module does not import tileops: a builder only reads ``.device``, ``.dtype`` and
``.shape`` of each spec (``TensorSpec`` is duck-typed), so the builders can be tested and
benchmarked without the op layer.

A builder accepts exactly what the op's manifest (``src/tileops/manifest/*.yaml``) accepts:
it refuses anything else with an error naming what was expected and what arrived (the op
layer checks the manifest first, but tests and benchmarks call builders directly). It then
fixes the compile-time values (dtype, hidden size, head dim, group size, transposes, axes)
and returns a C++ kernel object whose ``__call__`` is a C++ type slot. Row counts, batch and
sequence lengths are read from the tensors at call time, so kernels are kept in one LRU of
specialisations keyed by the compile-time values only: the op layer calls a builder once
per input shape (every decode step is a new shape), and a new row count must not cost a new
kernel.

Dtypes and kinds cross into C++ as the extension's enums (``_C.DType``, ``_C.RowNorm``,
``_C.ReduceOp``, ``_C.BinaryOp``, ``_C.Activation``, ``_C.RopeLayout``). The table names
kinds by their member names, because importing this module must load nothing.

Threads: a kernel is sized to ``torch.get_num_threads()`` as read when it is built (the
value is part of the specialisation key).

A new op with a native kernel is one line in ``_TABLE`` (op name -> a family's builder
factory below); see the README for the C++ side.
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

TARGET = "native_cpu"

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
HALVES = (torch.float16, torch.bfloat16)
INTEGRAL = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
ALL_DTYPES = FLOATS + INTEGRAL
MAX_DIMS = 16  # what the kernels' tensor views hold (kMaxDims in csrc/dtypes.h)

Builder = Callable[..., Any]
Factory = Callable[[str], Builder]  # op name -> the op's build_kernel

_native_module: Any = None
_native_dtypes: dict[torch.dtype, Any] = {}
_native_lock = threading.Lock()


def native() -> Any:
    """The compiled extension, with its torch bridge set up (first build only)."""
    global _native_module
    if _native_module is None:
        with _native_lock:
            if _native_module is None:
                from . import _C

                # _C.DType's members are named as torch names its dtypes
                _native_dtypes.update({getattr(torch, member.name): member for member in _C.DType})
                capsule = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
                _C.init_bridge(capsule, torch.empty, {m: t for t, m in _native_dtypes.items()})
                if os.environ.get("TILEOPS_NATIVE_CPU_FALLBACK") == "1":
                    _C.force_fallback(True)
                _native_module = _C
    return _native_module


def native_dtype(dtype: torch.dtype) -> Any:
    """The ``_C.DType`` member of a torch dtype."""
    native()
    return _native_dtypes[dtype]


class _Specialisations:
    """Bounded LRU of kernels keyed by compile-time values only."""

    def __init__(self, capacity: int = 512) -> None:
        self._items: OrderedDict[tuple, Any] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()
        self.builds = 0

    def get(self, key: tuple, make: Callable[[], Any]) -> Any:
        with self._lock:
            kernel = self._items.get(key)
            if kernel is not None:
                self._items.move_to_end(key)
                return kernel
            kernel = make()
            self.builds += 1
            self._items[key] = kernel
            if len(self._items) > self._capacity:
                self._items.popitem(last=False)
            return kernel

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


specialisations = _Specialisations()


# ---------------------------------------------------------------------------------------
# checks shared by every builder: each message names the unmet item and the value received


def _fail(op: str, what: str, got: str) -> ValueError:
    return ValueError(f"{TARGET} {op}: {what}; got {got}")


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _shape(spec: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in spec.shape)


def _inputs(op: str, dtypes: Sequence[torch.dtype], **specs: Any) -> torch.dtype:
    """Checks the inputs as every manifest does: on the CPU, at most MAX_DIMS dims (what the
    kernels hold), the first one's dtype among ``dtypes``, the others (``same_as`` it) of
    that dtype. Absent optional inputs are None. Returns the dtype."""
    for name, spec in specs.items():
        if spec is None:
            continue
        if torch.device(spec.device).type != "cpu":
            raise _fail(op, "runs on CPU tensors only", f"{name} on {spec.device}")
        if len(spec.shape) > MAX_DIMS:
            raise _fail(op, f"at most {MAX_DIMS} dims are supported", f"{name} of shape {_shape(spec)}")
    (first_name, first), *others = specs.items()
    if first.dtype not in dtypes:
        names = ", ".join(_dt(d) for d in dtypes)
        raise TypeError(f"{TARGET} {op}: dtype {_dt(first.dtype)} has no kernel (supported: {names}); "
                        f"got {first_name} of {_dt(first.dtype)}")
    for name, spec in others:
        if spec is not None and spec.dtype != first.dtype:
            raise TypeError(f"{TARGET} {op}: every input must have {first_name}'s dtype {_dt(first.dtype)}; "
                            f"got {name} of {_dt(spec.dtype)}")
    return first.dtype


def _threads() -> int:
    return max(1, torch.get_num_threads())


def _kernel(op: str, key: tuple, describe: str, make: Callable[[Any, int, str], Any]) -> Any:
    """The specialisation of ``op`` for ``key``; ``make(_C, threads, description)`` builds it."""
    threads = _threads()
    description = f"{TARGET} {op}({describe})"
    return specialisations.get((op,) + key + (threads,), lambda: make(native(), threads, description))


def _broadcast(op: str, what: str, *specs: Any) -> None:
    shapes = [_shape(s) for s in specs if s is not None]
    try:
        torch.broadcast_shapes(*shapes)
    except RuntimeError:
        raise _fail(op, f"{what} must broadcast", " and ".join(map(str, shapes))) from None


# ---------------------------------------------------------------------------------------
# norm family (csrc/kernels/norm.h)


def _normalized(op: str, x: Any, normalized_shape: Sequence[int], **affine: Any) -> int:
    """The hidden size; x must end in normalized_shape, and each of ``affine`` be shaped so."""
    ns = tuple(int(s) for s in normalized_shape)
    if not ns:
        raise _fail(op, "normalized_shape must not be empty", f"normalized_shape={ns}")
    if _shape(x)[len(x.shape) - len(ns) :] != ns:
        raise _fail(op, f"x must end in normalized_shape={ns}", f"x of shape {_shape(x)}")
    for name, spec in affine.items():
        if _shape(spec) != ns:
            raise _fail(op, f"{name} must have shape normalized_shape={ns}", f"{name} of shape {_shape(spec)}")
    return math.prod(ns)


def _row_norm(op: str, kind: str, x: Any, n: int, eps: float) -> Any:
    eps = float(eps)
    return _kernel(op, (x.dtype, n, eps), f"{_dt(x.dtype)}, hidden={n}, eps={eps}",
                   lambda C, threads, d: C.row_norm(C.RowNorm[kind], native_dtype(x.dtype), n, eps, threads, d))


def rms_norm(dtypes: Sequence[torch.dtype]) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, weight: Any, *, normalized_shape: Sequence[int], eps: float) -> Any:
            _inputs(op, dtypes, x=x, weight=weight)
            return _row_norm(op, "rms", x, _normalized(op, x, normalized_shape, weight=weight), eps)

        return build

    return factory


def fused_add_rms_norm(dtypes: Sequence[torch.dtype]) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, residual: Any, weight: Any, *, eps: float) -> Any:
            _inputs(op, dtypes, x=x, residual=residual, weight=weight)
            if len(x.shape) < 1:
                raise _fail(op, "x must have at least 1 dim", f"x of shape {_shape(x)}")
            if _shape(residual) != _shape(x):
                raise _fail(op, f"residual must have x's shape {_shape(x)}", f"residual of shape {_shape(residual)}")
            n = int(x.shape[-1])
            if _shape(weight) != (n,):
                raise _fail(op, f"weight must have shape ({n},)", f"weight of shape {_shape(weight)}")
            return _row_norm(op, "fused_add_rms", x, n, eps)

        return build

    return factory


def layer_norm(dtypes: Sequence[torch.dtype]) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, weight: Any, bias: Any, *, normalized_shape: Sequence[int], eps: float) -> Any:
            _inputs(op, dtypes, x=x, weight=weight, bias=bias)
            return _row_norm(op, "layer", x, _normalized(op, x, normalized_shape, weight=weight, bias=bias), eps)

        return build

    return factory


def group_norm(dtypes: Sequence[torch.dtype]) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, weight: Any, bias: Any, *, num_groups: int, eps: float) -> Any:
            _inputs(op, dtypes, x=x, weight=weight, bias=bias)
            if (weight is None) != (bias is None):
                raise _fail(op, "weight and bias are given together or not at all",
                            f"weight={'None' if weight is None else 'given'}, bias={'None' if bias is None else 'given'}")
            if len(x.shape) < 2:
                raise _fail(op, "x must be [N, C, *spatial]", f"x of shape {_shape(x)}")
            c = int(x.shape[1])
            for name, spec in (("weight", weight), ("bias", bias)):
                if spec is not None and _shape(spec) != (c,):
                    raise _fail(op, f"{name} must have shape (C,) = ({c},)", f"{name} of shape {_shape(spec)}")
            if num_groups <= 0 or c % num_groups != 0:
                raise _fail(op, "channels must split evenly into num_groups", f"C={c}, num_groups={num_groups}")
            if x.shape[0] * (c // num_groups) * math.prod(x.shape[2:]) == 1:
                raise _fail(op, "a group must not hold exactly one value (N * C / num_groups * prod(spatial) != 1)",
                            f"x of shape {_shape(x)}, num_groups={num_groups}")
            affine, groups, eps_ = weight is not None, int(num_groups), float(eps)
            return _kernel(op, (x.dtype, groups, eps_, affine),
                           f"{_dt(x.dtype)}, groups={groups}, affine={affine}, eps={eps_}",
                           lambda C, threads, d: C.group_norm(native_dtype(x.dtype), groups, eps_, affine, threads, d))

        return build

    return factory


# ---------------------------------------------------------------------------------------
# softmax family (csrc/kernels/softmax.h)


def softmax(*, log: bool, dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, *, dim: int | None) -> Any:
            _inputs(op, dtypes, x=x)
            ndim = len(x.shape)
            axis = (0 if ndim in (0, 1, 3) else 1) if dim is None else dim
            rank = max(ndim, 1)
            if not -rank <= axis < rank:
                raise _fail(op, f"dim must lie in [{-rank}, {rank})", f"dim={dim} for x of shape {_shape(x)}")
            axis %= rank
            return _kernel(op, (x.dtype, axis), f"{_dt(x.dtype)}, dim={axis}",
                           lambda C, threads, d: C.softmax(native_dtype(x.dtype), axis, log, threads, d))

        return build

    return factory


# ---------------------------------------------------------------------------------------
# reduction family (csrc/kernels/reduction.h)


def reduction(kind: str, dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    def factory(op: str) -> Builder:
        def build(x: Any, *, dim: int | Sequence[int] | None, keepdim: bool) -> Any:
            _inputs(op, dtypes, x=x)
            ndim, rank = len(x.shape), max(len(x.shape), 1)
            dims = () if dim is None else (dim,) if isinstance(dim, int) else tuple(dim)
            for d in dims:
                if not -rank <= d < rank:
                    raise _fail(op, f"every dim must lie in [{-rank}, {rank})", f"dim={dim} for x of shape {_shape(x)}")
            if len({d % rank for d in dims}) != len(dims):
                raise _fail(op, "dims must not repeat", f"dim={dim} for x of shape {_shape(x)}")
            axes = set(range(ndim)) if not dims else {d % rank for d in dims} if ndim else set()
            if kind == "amax" and any(x.shape[a] == 0 for a in axes):
                raise _fail(op, "amax over an empty axis has no value", f"x of shape {_shape(x)}, dim={dim}")
            mask = [a in axes for a in range(ndim)]
            keep = bool(keepdim)
            return _kernel(op, (x.dtype, tuple(mask), keep), f"{_dt(x.dtype)}, dim={sorted(axes)}, keepdim={keep}",
                           lambda C, threads, d: C.reduce(C.ReduceOp[kind], native_dtype(x.dtype), mask, keep, threads, d))

        return build

    return factory


# ---------------------------------------------------------------------------------------
# gemm family (csrc/kernels/gemm*.h)


def _gemm_kernel(op: str, dtype: torch.dtype, batched: bool, trans_a: bool, trans_b: bool) -> Any:
    describe = _dt(dtype) + ("" if batched else f", trans_a={trans_a}, trans_b={trans_b}")
    return _kernel(op, (dtype, trans_a, trans_b), describe,
                   lambda C, threads, d: C.gemm(native_dtype(dtype), batched, trans_a, trans_b, threads, d))


def gemm(dtypes: Sequence[torch.dtype]) -> Factory:
    def factory(op: str) -> Builder:
        def build(a: Any, b: Any, *, trans_a: bool, trans_b: bool) -> Any:
            dtype = _inputs(op, dtypes, a=a, b=b)
            if len(a.shape) != 2 or len(b.shape) != 2:
                raise _fail(op, "a and b must be 2-D", f"a of shape {_shape(a)}, b of shape {_shape(b)}")
            k_a = a.shape[0] if trans_a else a.shape[1]
            k_b = b.shape[1] if trans_b else b.shape[0]
            if k_a != k_b:
                raise _fail(op, "a and b must share K", f"K={k_a} from a {_shape(a)} (trans_a={trans_a}) "
                            f"and K={k_b} from b {_shape(b)} (trans_b={trans_b})")
            return _gemm_kernel(op, dtype, False, bool(trans_a), bool(trans_b))

        return build

    return factory


def bmm(dtypes: Sequence[torch.dtype], *, k_multiple: int = 1) -> Factory:
    def factory(op: str) -> Builder:
        def build(a: Any, b: Any) -> Any:
            dtype = _inputs(op, dtypes, a=a, b=b)
            if len(a.shape) != 3 or len(b.shape) != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
                raise _fail(op, "a must be [B, M, K] and b [B, K, N]", f"a of shape {_shape(a)}, b of shape {_shape(b)}")
            if a.shape[2] % k_multiple:
                raise _fail(op, f"K must be a multiple of {k_multiple}", f"K={a.shape[2]} from a of shape {_shape(a)}")
            return _gemm_kernel(op, dtype, True, False, False)

        return build

    return factory


# ---------------------------------------------------------------------------------------
# elementwise family (csrc/kernels/elementwise.h)


def _representable(value: int | float, dtype: torch.dtype) -> bool:
    if dtype == torch.bool:
        return True
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return info.min <= value <= info.max


def binary(kind: str, dtypes: Sequence[torch.dtype] = ALL_DTYPES) -> Factory:
    """``kind`` a member of _C.BinaryOp; ``add`` takes ``alpha`` (out = input + alpha * other)."""

    def make(op: str, x: Any, y: Any, alpha: int | float) -> Any:
        dtype = _inputs(op, dtypes, input=x, other=y)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
            raise _fail(op, "alpha must be an int or a float", f"alpha={alpha!r}")
        if not dtype.is_floating_point and not isinstance(alpha, int):
            raise _fail(op, f"alpha must be an int for {_dt(dtype)} tensors", f"alpha={alpha!r}")
        if not _representable(alpha, dtype):
            raise _fail(op, f"alpha must be representable in {_dt(dtype)}", f"alpha={alpha!r}")
        _broadcast(op, "input and other", x, y)
        a = float(alpha)
        return _kernel(op, (dtype, a), f"{_dt(dtype)}" + (f", alpha={alpha}" if kind == "add" else ""),
                       lambda C, threads, d: C.binary(C.BinaryOp[kind], native_dtype(dtype), a, threads, d))

    def factory(op: str) -> Builder:
        if kind == "add":

            def build_add(input: Any, other: Any, *, alpha: int | float = 1) -> Any:  # noqa: A002 (manifest name)
                return make(op, input, other, alpha)

            return build_add

        def build(input: Any, other: Any) -> Any:  # noqa: A002
            return make(op, input, other, 1)

        return build

    return factory


def _unary_kernel(op: str, activation: str, x: Any, inplace: bool) -> Any:
    return _kernel(op, (x.dtype, activation, inplace), f"{_dt(x.dtype)}, inplace={inplace}",
                   lambda C, threads, d: C.unary(C.Activation[activation], native_dtype(x.dtype), inplace, threads, d))


def activation(kind: str, dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    """``kind`` a member of _C.Activation; the op takes ``inplace`` (writes ``input``)."""

    def factory(op: str) -> Builder:
        def build(input: Any, *, inplace: bool = False) -> Any:  # noqa: A002
            _inputs(op, dtypes, input=input)
            return _unary_kernel(op, kind, input, bool(inplace))

        return build

    return factory


def activation_by_approximate(kinds: dict[str, str], dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    """An op whose ``approximate`` param picks the _C.Activation (GeluFwdOp)."""

    def factory(op: str) -> Builder:
        def build(input: Any, *, approximate: str = "none") -> Any:  # noqa: A002
            _inputs(op, dtypes, input=input)
            if approximate not in kinds:
                raise _fail(op, f"approximate must be one of {sorted(kinds)}", f"approximate={approximate!r}")
            return _unary_kernel(op, kinds[approximate], input, False)

        return build

    return factory


def gated(kind: str, dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    """act(x[:, :N]) * x[:, N:] for x [M, 2N], ``kind`` a member of _C.Activation that the
    gated kernel is compiled for (``GatedActivations`` in csrc/kernels/elementwise.h)."""

    def factory(op: str) -> Builder:
        def build(x: Any) -> Any:
            _inputs(op, dtypes, x=x)
            if len(x.shape) != 2 or x.shape[1] % 2 != 0:
                raise _fail(op, "x must be [M, 2N] ([gate | value], 2-D with an even last dim)", f"x of shape {_shape(x)}")
            return _kernel(op, (x.dtype,), _dt(x.dtype),
                           lambda C, threads, d: C.gated(C.Activation[kind], native_dtype(x.dtype), threads, d))

        return build

    return factory


def clamp(dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    def factory(op: str) -> Builder:
        def build(input: Any, min: Any, max: Any) -> Any:  # noqa: A002
            dtype = _inputs(op, dtypes, input=input, min=min, max=max)
            if min is None and max is None:
                raise _fail(op, "at least one of min and max must be given", "min=None, max=None")
            _broadcast(op, "input, min and max", input, min, max)
            has_min, has_max = min is not None, max is not None
            return _kernel(op, (dtype, has_min, has_max),
                           f"{_dt(dtype)}, min={'tensor' if has_min else None}, max={'tensor' if has_max else None}",
                           lambda C, threads, d: C.clamp(native_dtype(dtype), has_min, has_max, threads, d))

        return build

    return factory


# ---------------------------------------------------------------------------------------
# rope family (csrc/kernels/rope.h)


def _rope_tables(positions: int, rotary_dim: int, base: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos/sin [positions, rotary_dim/2], rounded through x's dtype like the op's tables."""
    half = rotary_dim // 2
    freqs = 1.0 / (base ** (torch.arange(half, dtype=torch.float32) / half))
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), freqs)
    return (angles.cos().to(dtype).float().contiguous(), angles.sin().to(dtype).float().contiguous())


def rope_neox(dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    """x [S, D] (layout '1d') or [B, S, H, D] ('2d'), positions 0..S-1."""
    layouts = {"1d": ("sd", 2), "2d": ("bshd", 4)}

    def factory(op: str) -> Builder:
        def build(x: Any, *, layout: str = "1d", base: float = 10000.0) -> Any:
            _inputs(op, dtypes, x=x)
            if layout not in layouts:
                raise _fail(op, "layout must be '1d' ([S, D]) or '2d' ([B, S, H, D])", f"layout={layout!r}")
            member, ndim = layouts[layout]
            if len(x.shape) != ndim:
                raise _fail(op, f"layout {layout!r} needs a {ndim}-D x", f"x of shape {_shape(x)}")
            head_dim = int(x.shape[-1])
            if head_dim <= 0 or head_dim % 2:
                raise _fail(op, "head_dim must be positive and even", f"head_dim={head_dim}")
            seq, base_ = int(x.shape[0] if layout == "1d" else x.shape[1]), float(base)
            kernel = _kernel(
                op, (x.dtype, layout, head_dim, base_), f"{_dt(x.dtype)}, layout={layout}, head_dim={head_dim}, base={base}",
                lambda C, threads, d: C.rope(C.RopeLayout[member], native_dtype(x.dtype), head_dim, head_dim, threads, d))
            # The tables are prefixes of one another (positions 0..S-1): keep the longest so far.
            with _native_lock:
                have = native().rope_positions(kernel)
                if have < seq:
                    native().set_rope_tables(kernel, *_rope_tables(max(seq, 2 * have), head_dim, base_, x.dtype))
            return kernel

        return build

    return factory


def rope_neox_position_ids(dtypes: Sequence[torch.dtype] = FLOATS) -> Factory:
    """x [T, H, D] and position_ids [T] (int32 or int64); the first rotary_dim of D rotate."""

    def factory(op: str) -> Builder:
        def build(x: Any, position_ids: Any, *, max_position: int, base: float = 10000.0, rotary_dim: int) -> Any:
            _inputs(op, dtypes, x=x)
            _inputs(op, (torch.int32, torch.int64), position_ids=position_ids)
            if len(x.shape) != 3:
                raise _fail(op, "x must be [num_tokens, heads, head_dim]", f"x of shape {_shape(x)}")
            if _shape(position_ids) != (int(x.shape[0]),):
                raise _fail(op, f"position_ids must have shape ({x.shape[0]},), one per token of x",
                            f"position_ids of shape {_shape(position_ids)}")
            head_dim, rot, positions, base_ = int(x.shape[-1]), int(rotary_dim), int(max_position), float(base)
            if rot <= 0 or rot % 2 or rot > head_dim:
                raise _fail(op, "rotary_dim must be positive, even and at most head_dim",
                            f"rotary_dim={rot}, head_dim={head_dim}")
            if positions <= 0:
                raise _fail(op, "max_position must be positive", f"max_position={max_position}")

            def make(C: Any, threads: int, d: str) -> Any:
                kernel = C.rope(C.RopeLayout.thd_position_ids, native_dtype(x.dtype), head_dim, rot, threads, d)
                C.set_rope_tables(kernel, *_rope_tables(positions, rot, base_, x.dtype))
                return kernel

            return _kernel(op, (x.dtype, head_dim, rot, positions, base_),
                           f"{_dt(x.dtype)}, head_dim={head_dim}, rotary_dim={rot}, max_position={positions}", make)

        return build

    return factory


# ---------------------------------------------------------------------------------------
# attention family (csrc/kernels/attention*.h)


def attention(dtypes: Sequence[torch.dtype], *, decode: bool) -> Factory:
    """Prefill: q [B, S, H, D], k and v [B, S, Hkv, D] (``is_causal``); decode: q [B, H, D]
    against a cache k and v [B, N, Hkv, D] with N > 0. H must be a multiple of Hkv."""

    def make(op: str, q: Any, k: Any, v: Any, causal: bool) -> Any:
        dtype = _inputs(op, dtypes, q=q, k=k, v=v)
        want_q = 3 if decode else 4
        if len(q.shape) != want_q or len(k.shape) != 4 or _shape(k) != _shape(v) or k.shape[0] != q.shape[0]:
            layout = "q [B, H, D], k and v [B, N_kv, H_kv, D]" if decode else "q [B, S, H, D], k and v [B, S, H_kv, D]"
            raise _fail(op, f"expected {layout}", f"q {_shape(q)}, k {_shape(k)}, v {_shape(v)}")
        heads, head_dim, heads_kv = int(q.shape[-2]), int(q.shape[-1]), int(k.shape[2])
        if k.shape[3] != head_dim:
            raise _fail(op, "q, k and v must share head_dim", f"q head_dim={head_dim}, k head_dim={k.shape[3]}")
        if decode and k.shape[1] == 0:
            raise _fail(op, "the cache must hold at least one position", f"k of shape {_shape(k)}")
        if not decode and k.shape[1] != q.shape[1]:
            raise _fail(op, "k and v must have q's sequence length", f"q {_shape(q)}, k {_shape(k)}")
        if heads_kv == 0 or heads % heads_kv:
            raise _fail(op, "heads must be a multiple of kv heads", f"H={heads}, H_kv={heads_kv}")
        group = heads // heads_kv
        return _kernel(op, (dtype, head_dim, group, causal),
                       f"{_dt(dtype)}, head_dim={head_dim}, group={group}" + ("" if decode else f", causal={causal}"),
                       lambda C, threads, d: C.attention(native_dtype(dtype), decode, causal, head_dim, group, threads, d))

    def factory(op: str) -> Builder:
        if decode:

            def build_decode(q: Any, k: Any, v: Any) -> Any:
                return make(op, q, k, v, False)

            return build_decode

        def build(q: Any, k: Any, v: Any, *, is_causal: bool = True) -> Any:
            return make(op, q, k, v, bool(is_causal))

        return build

    return factory


# ---------------------------------------------------------------------------------------
# the table: one line per op (its manifest's name -> a family's factory and what it fixes)

_TABLE: dict[str, Factory] = {
    "RMSNormFwdOp": rms_norm(HALVES),
    "FusedAddRMSNormFwdOp": fused_add_rms_norm(HALVES),
    "LayerNormFwdOp": layer_norm(FLOATS),
    "GroupNormFwdOp": group_norm(FLOATS),
    "SoftmaxFwdOp": softmax(log=False),
    "LogSoftmaxFwdOp": softmax(log=True),
    "SumFwdOp": reduction("sum"),
    "MeanFwdOp": reduction("mean"),
    "AmaxFwdOp": reduction("amax"),
    "GemmFwdOp": gemm(HALVES),
    "BmmFwdOp": bmm(HALVES, k_multiple=16),
    "AddFwdOp": binary("add"),
    "MulFwdOp": binary("mul"),
    "SiluFwdOp": activation("silu"),
    "GeluFwdOp": activation_by_approximate({"none": "gelu", "tanh": "gelu_tanh"}),
    "ReluFwdOp": activation("relu"),
    "SiluAndMulFwdOp": gated("silu"),
    "ClampFwdOp": clamp(),
    "RopeNeoxFwdOp": rope_neox(),
    "RopeNeoxPositionIdsFwdOp": rope_neox_position_ids(),
    "GroupedQueryAttentionFwdOp": attention(HALVES, decode=False),
    "GroupedQueryAttentionDecodeWithKVCacheFwdOp": attention(HALVES, decode=True),
}



def _builder(op: str, factory: Factory) -> Builder:
    build = factory(op)
    build.__name__ = build.__qualname__ = f"BUILDERS[{op!r}]"  # what registry messages name
    return build


BUILDERS: dict[str, Builder] = {op: _builder(op, factory) for op, factory in _TABLE.items()}


def detect(device: torch.device) -> bool:
    return device.type == "cpu"


# The names tests and benchmarks/native_cpu.py call builders by.
build_rms_norm = BUILDERS["RMSNormFwdOp"]
build_fused_add_rms_norm = BUILDERS["FusedAddRMSNormFwdOp"]
build_layer_norm = BUILDERS["LayerNormFwdOp"]
build_group_norm = BUILDERS["GroupNormFwdOp"]
build_softmax = BUILDERS["SoftmaxFwdOp"]
build_log_softmax = BUILDERS["LogSoftmaxFwdOp"]
build_sum = BUILDERS["SumFwdOp"]
build_mean = BUILDERS["MeanFwdOp"]
build_amax = BUILDERS["AmaxFwdOp"]
build_gemm = BUILDERS["GemmFwdOp"]
build_bmm = BUILDERS["BmmFwdOp"]
build_add = BUILDERS["AddFwdOp"]
build_mul = BUILDERS["MulFwdOp"]
build_silu = BUILDERS["SiluFwdOp"]
build_gelu = BUILDERS["GeluFwdOp"]
build_relu = BUILDERS["ReluFwdOp"]
build_silu_and_mul = BUILDERS["SiluAndMulFwdOp"]
build_clamp = BUILDERS["ClampFwdOp"]
build_rope_neox = BUILDERS["RopeNeoxFwdOp"]
build_rope_neox_position_ids = BUILDERS["RopeNeoxPositionIdsFwdOp"]
build_gqa = BUILDERS["GroupedQueryAttentionFwdOp"]
build_gqa_decode = BUILDERS["GroupedQueryAttentionDecodeWithKVCacheFwdOp"]
