"""One ``build_kernel`` per op for the ``native_cpu`` target.

This module does not import tileops: a builder only reads ``.device``, ``.dtype`` and
``.shape`` of each spec (``TensorSpec`` is duck-typed), so the builders can be tested and
benchmarked without the op layer.

Each builder validates what its kernel cannot serve (raising, never degrading), fixes the
compile-time values (dtype, hidden size, head dim, group size, transposes, axes) and returns
a C++ kernel object whose ``__call__`` is a C++ type slot. Row counts, batch and sequence
lengths are read from the tensors at call time, so every builder also keeps its own cache
of specialisations keyed by the compile-time values only: the op layer calls a builder once
per input shape (every decode step is a new shape), and a new row count must not cost a new
kernel.

Threads: a kernel is sized to ``torch.get_num_threads()`` as read when it is built (the
value is part of the specialisation key), and runs on this package's own small pool with
the calling thread as one of them, so native_cpu and torch never use more cores together
than torch alone is configured for. There is no OpenMP runtime in this package.
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

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_HALVES = (torch.float16, torch.bfloat16)
_DTYPE_CODE = {
    torch.float32: 0,
    torch.float16: 1,
    torch.bfloat16: 2,
    torch.bool: 3,
    torch.uint8: 4,
    torch.int8: 5,
    torch.int16: 6,
    torch.int32: 7,
    torch.int64: 8,
}
_INTEGRAL = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)

_native_module: Any = None
_native_lock = threading.Lock()


def native() -> Any:
    """The compiled extension, with its torch bridge set up (first build only)."""
    global _native_module
    if _native_module is None:
        with _native_lock:
            if _native_module is None:
                from . import _C

                capsule = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
                dtypes = sorted(_DTYPE_CODE, key=_DTYPE_CODE.__getitem__)
                _C.init_bridge(capsule, torch.empty, dtypes)
                if os.environ.get("TILEOPS_NATIVE_CPU_FALLBACK") == "1":
                    _C.force_fallback(True)
                _native_module = _C
    return _native_module


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
# validation helpers: every message names the unmet item and the value received


def _fail(op: str, what: str, got: str) -> ValueError:
    return ValueError(f"{TARGET} {op}: {what}; got {got}")


def _check_cpu(op: str, **specs: Any) -> None:
    for name, spec in specs.items():
        if spec is not None and torch.device(spec.device).type != "cpu":
            raise _fail(op, "runs on CPU tensors only", f"{name} on {spec.device}")


def _check_dtype(op: str, name: str, spec: Any, allowed: Sequence[torch.dtype]) -> int:
    if spec.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(f"{TARGET} {op}: dtype {spec.dtype} has no kernel (supported: {names}); got {name} of {spec.dtype}")
    return _DTYPE_CODE[spec.dtype]


def _same_dtype(op: str, first: Any, **others: Any) -> None:
    for name, spec in others.items():
        if spec is not None and spec.dtype != first.dtype:
            raise TypeError(f"{TARGET} {op}: every input must have x's dtype {first.dtype}; got {name} of {spec.dtype}")


def _threads() -> int:
    return max(1, torch.get_num_threads())


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _kernel(key: tuple, make: Callable[[], Any]) -> Any:
    return specialisations.get(key + (_threads(),), make)


# ---------------------------------------------------------------------------------------
# normalisation


def _row_norm(op: str, kind: int, x: Any, n: int, eps: float, what: str) -> Any:
    code = _check_dtype(op, "x", x, _FLOATS)
    threads = _threads()
    desc = f"{TARGET} {op}({_dt(x.dtype)}, {what}, eps={eps})"
    return _kernel((op, code, n, float(eps)), lambda: native().row_norm(kind, code, n, float(eps), threads, desc))


def _normalized(op: str, x: Any, normalized_shape: Sequence[int]) -> int:
    ns = tuple(int(s) for s in normalized_shape)
    if not ns or math.prod(ns) == 0:
        raise _fail(op, "hidden size 0 is not supported", f"normalized_shape={ns}")
    if tuple(x.shape[len(x.shape) - len(ns) :]) != ns:
        raise _fail(op, f"x must end in normalized_shape={ns}", f"x of shape {tuple(x.shape)}")
    return math.prod(ns)


def build_rms_norm(x: Any, weight: Any, *, normalized_shape: Sequence[int], eps: float) -> Any:
    op = "RMSNormFwdOp"
    _check_cpu(op, x=x, weight=weight)
    _same_dtype(op, x, weight=weight)
    n = _normalized(op, x, normalized_shape)
    return _row_norm(op, 0, x, n, eps, f"hidden={n}")


def build_fused_add_rms_norm(x: Any, residual: Any, weight: Any, *, eps: float) -> Any:
    op = "FusedAddRMSNormFwdOp"
    _check_cpu(op, x=x, residual=residual, weight=weight)
    _same_dtype(op, x, residual=residual, weight=weight)
    if len(x.shape) == 0 or x.shape[-1] == 0:
        raise _fail(op, "hidden size 0 is not supported", f"x of shape {tuple(x.shape)}")
    n = int(x.shape[-1])
    return _row_norm(op, 1, x, n, eps, f"hidden={n}")


def build_layer_norm(x: Any, weight: Any, bias: Any, *, normalized_shape: Sequence[int], eps: float) -> Any:
    op = "LayerNormFwdOp"
    _check_cpu(op, x=x, weight=weight, bias=bias)
    _same_dtype(op, x, weight=weight, bias=bias)
    n = _normalized(op, x, normalized_shape)
    return _row_norm(op, 2, x, n, eps, f"hidden={n}")


def build_group_norm(x: Any, weight: Any, bias: Any, *, num_groups: int, eps: float) -> Any:
    op = "GroupNormFwdOp"
    _check_cpu(op, x=x, weight=weight, bias=bias)
    _same_dtype(op, x, weight=weight, bias=bias)
    code = _check_dtype(op, "x", x, _FLOATS)
    if (weight is None) != (bias is None):
        raise _fail(op, "weight and bias are given together or not at all",
                    f"weight={'None' if weight is None else 'given'}, bias={'None' if bias is None else 'given'}")
    if len(x.shape) < 2:
        raise _fail(op, "x must be [N, C, *spatial]", f"x of shape {tuple(x.shape)}")
    if num_groups <= 0 or x.shape[1] % num_groups != 0:
        raise _fail(op, "channels must split evenly into num_groups", f"C={x.shape[1]}, num_groups={num_groups}")
    affine = weight is not None
    threads = _threads()
    desc = f"{TARGET} {op}({_dt(x.dtype)}, groups={num_groups}, affine={affine}, eps={eps})"
    return _kernel((op, code, int(num_groups), float(eps), affine),
                   lambda: native().group_norm(code, int(num_groups), float(eps), affine, threads, desc))


# ---------------------------------------------------------------------------------------
# softmax and reductions


def _softmax(op: str, x: Any, dim: int | None, log: bool) -> Any:
    _check_cpu(op, x=x)
    code = _check_dtype(op, "x", x, _FLOATS)
    ndim = len(x.shape)
    if dim is None:
        dim = 0 if ndim in (0, 1, 3) else 1
    rank = max(ndim, 1)
    if not -rank <= dim < rank:
        raise _fail(op, f"dim must lie in [{-rank}, {rank})", f"dim={dim} for x of shape {tuple(x.shape)}")
    dim = dim % rank
    threads = _threads()
    desc = f"{TARGET} {op}({_dt(x.dtype)}, dim={dim})"
    return _kernel((op, code, dim), lambda: native().softmax(code, dim, log, threads, desc))


def build_softmax(x: Any, *, dim: int | None) -> Any:
    return _softmax("SoftmaxFwdOp", x, dim, False)


def build_log_softmax(x: Any, *, dim: int | None) -> Any:
    return _softmax("LogSoftmaxFwdOp", x, dim, True)


def _reduce(op: str, code_op: int, x: Any, dim: Any, keepdim: bool) -> Any:
    _check_cpu(op, x=x)
    code = _check_dtype(op, "x", x, _FLOATS)
    ndim = len(x.shape)
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        axes = set(range(ndim))
    else:
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        rank = max(ndim, 1)
        for d in dims:
            if not -rank <= d < rank:
                raise _fail(op, f"every dim must lie in [{-rank}, {rank})", f"dim={dim} for x of shape {tuple(x.shape)}")
        axes = {d % rank for d in dims}
        if ndim == 0:
            axes = set()
    if ndim > 16:
        raise _fail(op, "at most 16 dims are supported", f"x of shape {tuple(x.shape)}")
    if code_op == 2 and any(x.shape[a] == 0 for a in axes):
        raise _fail(op, "amax over an empty axis has no value", f"x of shape {tuple(x.shape)}, dim={dim}")
    mask = [a in axes for a in range(ndim)]
    threads = _threads()
    desc = f"{TARGET} {op}({_dt(x.dtype)}, dim={sorted(axes)}, keepdim={bool(keepdim)})"
    return _kernel((op, code, tuple(mask), bool(keepdim)),
                   lambda: native().reduce(code, mask, bool(keepdim), code_op, threads, desc))


def build_sum(x: Any, *, dim: Any, keepdim: bool) -> Any:
    return _reduce("SumFwdOp", 0, x, dim, keepdim)


def build_mean(x: Any, *, dim: Any, keepdim: bool) -> Any:
    return _reduce("MeanFwdOp", 1, x, dim, keepdim)


def build_amax(x: Any, *, dim: Any, keepdim: bool) -> Any:
    return _reduce("AmaxFwdOp", 2, x, dim, keepdim)


# ---------------------------------------------------------------------------------------
# GEMM


def build_gemm(a: Any, b: Any, *, trans_a: bool, trans_b: bool) -> Any:
    op = "GemmFwdOp"
    _check_cpu(op, a=a, b=b)
    _same_dtype(op, a, b=b)
    code = _check_dtype(op, "a", a, _FLOATS)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise _fail(op, "a and b must be 2-D", f"a of shape {tuple(a.shape)}, b of shape {tuple(b.shape)}")
    k_a = a.shape[0] if trans_a else a.shape[1]
    k_b = b.shape[1] if trans_b else b.shape[0]
    if k_a != k_b:
        raise _fail(op, "a and b must share K", f"K={k_a} from a {tuple(a.shape)} (trans_a={trans_a}) "
                    f"and K={k_b} from b {tuple(b.shape)} (trans_b={trans_b})")
    threads = _threads()
    desc = f"{TARGET} {op}({_dt(a.dtype)}, trans_a={bool(trans_a)}, trans_b={bool(trans_b)})"
    return _kernel((op, code, bool(trans_a), bool(trans_b)),
                   lambda: native().gemm(code, False, bool(trans_a), bool(trans_b), threads, desc))


def build_bmm(a: Any, b: Any) -> Any:
    op = "BmmFwdOp"
    _check_cpu(op, a=a, b=b)
    _same_dtype(op, a, b=b)
    code = _check_dtype(op, "a", a, _FLOATS)
    if len(a.shape) != 3 or len(b.shape) != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise _fail(op, "a must be [B, M, K] and b [B, K, N]", f"a of shape {tuple(a.shape)}, b of shape {tuple(b.shape)}")
    threads = _threads()
    desc = f"{TARGET} {op}({_dt(a.dtype)})"
    return _kernel((op, code), lambda: native().gemm(code, True, False, False, threads, desc))


# ---------------------------------------------------------------------------------------
# elementwise


def _binary(op: str, code_op: int, x: Any, y: Any, alpha: float) -> Any:
    _check_cpu(op, input=x, other=y)
    _same_dtype(op, x, other=y)
    code = _check_dtype(op, "input", x, tuple(_DTYPE_CODE))
    if x.dtype in _INTEGRAL and float(alpha) != int(alpha):
        raise _fail(op, f"alpha must be an integer for {_dt(x.dtype)} tensors", f"alpha={alpha!r}")
    try:
        torch.broadcast_shapes(tuple(x.shape), tuple(y.shape))
    except RuntimeError:
        raise _fail(op, "input and other must broadcast", f"{tuple(x.shape)} and {tuple(y.shape)}") from None
    threads = _threads()
    desc = f"{TARGET} {op}({_dt(x.dtype)}" + (f", alpha={alpha})" if code_op == 0 else ")")
    return _kernel((op, code, float(alpha)), lambda: native().binary(code, code_op, float(alpha), threads, desc))


def build_add(input: Any, other: Any, *, alpha: float = 1) -> Any:  # noqa: A002 (manifest name)
    return _binary("AddFwdOp", 0, input, other, alpha)


def build_mul(input: Any, other: Any) -> Any:  # noqa: A002
    return _binary("MulFwdOp", 1, input, other, 1.0)


def _unary(op: str, code_op: int, x: Any, inplace: bool) -> Any:
    _check_cpu(op, input=x)
    code = _check_dtype(op, "input", x, _FLOATS)
    threads = _threads()
    desc = f"{TARGET} {op}({_dt(x.dtype)}, inplace={bool(inplace)})"
    return _kernel((op, code, code_op, bool(inplace)),
                   lambda: native().unary(code, code_op, bool(inplace), threads, desc))


def build_silu(input: Any, *, inplace: bool = False) -> Any:  # noqa: A002
    return _unary("SiluFwdOp", 0, input, inplace)


def build_gelu(input: Any, *, approximate: str = "none") -> Any:  # noqa: A002
    if approximate not in ("none", "tanh"):
        raise _fail("GeluFwdOp", "approximate must be 'none' or 'tanh'", f"approximate={approximate!r}")
    return _unary("GeluFwdOp", 1 if approximate == "none" else 2, input, False)


def build_relu(input: Any, *, inplace: bool = False) -> Any:  # noqa: A002
    return _unary("ReluFwdOp", 3, input, inplace)


def build_silu_and_mul(x: Any) -> Any:
    op = "SiluAndMulFwdOp"
    _check_cpu(op, x=x)
    code = _check_dtype(op, "x", x, _FLOATS)
    if len(x.shape) < 1 or x.shape[-1] % 2 != 0:
        raise _fail(op, "the last dim of x must be even ([gate | value])", f"x of shape {tuple(x.shape)}")
    threads = _threads()
    desc = f"{TARGET} {op}({_dt(x.dtype)})"
    return _kernel((op, code), lambda: native().silu_and_mul(code, threads, desc))


def build_clamp(input: Any, min: Any, max: Any) -> Any:  # noqa: A002
    op = "ClampFwdOp"
    _check_cpu(op, input=input, min=min, max=max)
    _same_dtype(op, input, min=min, max=max)
    code = _check_dtype(op, "input", input, _FLOATS)
    if min is None and max is None:
        raise _fail(op, "at least one of min and max must be given", "min=None, max=None")
    shapes = [tuple(s.shape) for s in (input, min, max) if s is not None]
    try:
        torch.broadcast_shapes(*shapes)
    except RuntimeError:
        raise _fail(op, "input, min and max must broadcast", " and ".join(map(str, shapes))) from None
    has_min, has_max = min is not None, max is not None
    threads = _threads()
    desc = f"{TARGET} {op}({_dt(input.dtype)}, min={'tensor' if has_min else None}, max={'tensor' if has_max else None})"
    return _kernel((op, code, has_min, has_max), lambda: native().clamp(code, has_min, has_max, threads, desc))


# ---------------------------------------------------------------------------------------
# RoPE


def _rope_tables(positions: int, rotary_dim: int, base: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos/sin [positions, rotary_dim/2], rounded through x's dtype like the op's tables."""
    half = rotary_dim // 2
    freqs = 1.0 / (base ** (torch.arange(half, dtype=torch.float32) / half))
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), freqs)
    return (angles.cos().to(dtype).float().contiguous(), angles.sin().to(dtype).float().contiguous())


def build_rope_neox(x: Any, *, layout: str = "1d", base: float = 10000.0) -> Any:
    op = "RopeNeoxFwdOp"
    _check_cpu(op, x=x)
    code = _check_dtype(op, "x", x, _FLOATS)
    want = {"1d": 2, "2d": 4}
    if layout not in want:
        raise _fail(op, "layout must be '1d' ([S, D]) or '2d' ([B, S, H, D])", f"layout={layout!r}")
    if len(x.shape) != want[layout]:
        raise _fail(op, f"layout {layout!r} needs a {want[layout]}-D x", f"x of shape {tuple(x.shape)}")
    head_dim = int(x.shape[-1])
    if head_dim <= 0 or head_dim % 2:
        raise _fail(op, "head_dim must be positive and even", f"head_dim={head_dim}")
    seq = int(x.shape[0] if layout == "1d" else x.shape[1])
    threads = _threads()
    desc = f"{TARGET} {op}({_dt(x.dtype)}, layout={layout}, head_dim={head_dim}, base={base})"
    kernel = _kernel((op, code, layout, head_dim, float(base)),
                     lambda: native().rope(code, False, layout == "2d", head_dim, head_dim, threads, desc))
    # The tables are prefixes of one another (positions 0..S-1): keep the longest so far.
    with _native_lock:
        have = native().rope_positions(kernel)
        if have < seq:
            native().set_rope_tables(kernel, *_rope_tables(max(seq, 2 * have), head_dim, float(base), x.dtype))
    return kernel


def build_rope_neox_position_ids(x: Any, position_ids: Any, *, max_position: int, base: float = 10000.0,
                                 rotary_dim: int | None = None) -> Any:
    op = "RopeNeoxPositionIdsFwdOp"
    _check_cpu(op, x=x, position_ids=position_ids)
    code = _check_dtype(op, "x", x, _FLOATS)
    _check_dtype(op, "position_ids", position_ids, (torch.int32, torch.int64))
    if len(x.shape) != 3:
        raise _fail(op, "x must be [num_tokens, heads, head_dim]", f"x of shape {tuple(x.shape)}")
    head_dim = int(x.shape[-1])
    rot = head_dim if rotary_dim is None else int(rotary_dim)
    if rot <= 0 or rot % 2 or rot > head_dim:
        raise _fail(op, "rotary_dim must be positive, even and at most head_dim", f"rotary_dim={rot}, head_dim={head_dim}")
    if max_position <= 0:
        raise _fail(op, "max_position must be positive", f"max_position={max_position}")
    threads = _threads()
    desc = f"{TARGET} {op}({_dt(x.dtype)}, head_dim={head_dim}, rotary_dim={rot}, max_position={max_position})"

    def make() -> Any:
        kernel = native().rope(code, True, False, head_dim, rot, threads, desc)
        native().set_rope_tables(kernel, *_rope_tables(int(max_position), rot, float(base), x.dtype))
        return kernel

    return _kernel((op, code, head_dim, rot, int(max_position), float(base)), make)


# ---------------------------------------------------------------------------------------
# attention


def _attention(op: str, q: Any, k: Any, v: Any, causal: bool, decode: bool) -> Any:
    _check_cpu(op, q=q, k=k, v=v)
    _same_dtype(op, q, k=k, v=v)
    code = _check_dtype(op, "q", q, _FLOATS)
    want_q = 3 if decode else 4
    if len(q.shape) != want_q or len(k.shape) != 4 or tuple(k.shape) != tuple(v.shape):
        layout = "q [B, H, D], k/v [B, N_kv, H_kv, D]" if decode else "q [B, S, H, D], k/v [B, S, H_kv, D]"
        raise _fail(op, f"expected {layout}", f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    heads, head_dim = int(q.shape[-2]), int(q.shape[-1])
    heads_kv = int(k.shape[2])
    if heads_kv == 0 or heads % heads_kv:
        raise _fail(op, "heads must be a multiple of kv heads", f"H={heads}, H_kv={heads_kv}")
    if head_dim <= 0 or head_dim > 1024 or k.shape[3] != head_dim:
        raise _fail(op, "head_dim must be in [1, 1024] and equal for q, k and v", f"q head_dim={head_dim}, k head_dim={k.shape[3]}")
    group = heads // heads_kv
    if decode and group > 64:
        raise _fail(op, "at most 64 query heads per kv head", f"H/H_kv={group}")
    threads = _threads()
    desc = f"{TARGET} {op}({_dt(q.dtype)}, head_dim={head_dim}, group={group}" + ("" if decode else f", causal={causal}") + ")"
    return _kernel((op, code, head_dim, group, bool(causal)),
                   lambda: native().attention(code, decode, bool(causal), head_dim, group, threads, desc))


def build_gqa(q: Any, k: Any, v: Any, *, is_causal: bool = True) -> Any:
    return _attention("GroupedQueryAttentionFwdOp", q, k, v, bool(is_causal), False)


def build_gqa_decode(q: Any, k: Any, v: Any) -> Any:
    return _attention("GroupedQueryAttentionDecodeWithKVCacheFwdOp", q, k, v, False, True)


BUILDERS: dict[str, Callable[..., Any]] = {
    "RMSNormFwdOp": build_rms_norm,
    "FusedAddRMSNormFwdOp": build_fused_add_rms_norm,
    "LayerNormFwdOp": build_layer_norm,
    "GroupNormFwdOp": build_group_norm,
    "SoftmaxFwdOp": build_softmax,
    "LogSoftmaxFwdOp": build_log_softmax,
    "SumFwdOp": build_sum,
    "MeanFwdOp": build_mean,
    "AmaxFwdOp": build_amax,
    "GemmFwdOp": build_gemm,
    "BmmFwdOp": build_bmm,
    "AddFwdOp": build_add,
    "MulFwdOp": build_mul,
    "SiluFwdOp": build_silu,
    "GeluFwdOp": build_gelu,
    "ReluFwdOp": build_relu,
    "SiluAndMulFwdOp": build_silu_and_mul,
    "ClampFwdOp": build_clamp,
    "RopeNeoxFwdOp": build_rope_neox,
    "RopeNeoxPositionIdsFwdOp": build_rope_neox_position_ids,
    "GroupedQueryAttentionFwdOp": build_gqa,
    "GroupedQueryAttentionDecodeWithKVCacheFwdOp": build_gqa_decode,
}


def detect(device: torch.device) -> bool:
    return device.type == "cpu"
