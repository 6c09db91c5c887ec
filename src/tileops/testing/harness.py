"""The numeric conformance harness: any target's kernels against the manifest's reference.

For a target, every op it registers is run over the manifest's workloads (scaled down
for CPU by default) and edge cases, through the public op API with ``target=``, and
compared with ``tileops.testing.references`` at a tolerance chosen per dtype. A backend
reuses it from its own tests::

    import pytest
    from tileops.testing import harness

    @pytest.mark.parametrize("case", harness.cases("acme", device="acme:0"), ids=str)
    def test_acme_matches_the_references(case):
        harness.check(case)

``harness.measure(case)`` runs the same and returns an ``Outcome`` (passed, the largest
absolute error, what failed) instead of raising: ``tileops check`` is built on it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from .. import manifest
from ..backend import registered_targets
from . import references

_GQA_FWD = "GroupedQueryAttentionFwdOp"
_GQA_DECODE = "GroupedQueryAttentionDecodeWithKVCacheFwdOp"


@dataclasses.dataclass(frozen=True)
class Case:
    """One op call to check: which op, on which shapes, params and dtype."""

    op: str
    workload: str
    shapes: dict[str, tuple[int, ...] | None]
    params: dict[str, Any]
    dtype: torch.dtype
    target: str | None
    device: str
    strided: bool = False  # hand the op transposed-then-contiguous-in-the-other-order inputs

    def __str__(self) -> str:
        dims = ",".join(f"{k}{list(v)}" for k, v in self.shapes.items() if v is not None)
        extra = "-strided" if self.strided else ""
        return f"{self.op}-{self.workload}-{str(self.dtype).removeprefix('torch.')}-{dims}{extra}"


def cases(
    target: str | None,
    *,
    device: str = "cpu",
    scale: str = "cpu",
    ops: Iterable[str] | None = None,
    edge_cases: bool = True,
) -> list[Case]:
    """Every workload case of every op ``target`` registers (or ``ops``), plus edge cases,
    less those whose shapes leave no valid index inputs (``writes_fit``)."""
    names = list(ops) if ops is not None else _ops_of(target)
    out: list[Case] = []
    for name in names:
        entry = manifest.entry(name)
        for workload, shapes, params, dtype in entry.workload_cases(scale):
            out.append(Case(name, workload, dict(shapes), dict(params), dtype, target, device))
        if edge_cases:
            out.extend(_edge_cases(entry, target, device))
    return [c for c in out if writes_fit(manifest.entry(c.op), c.shapes, c.params)]


def _ops_of(target: str | None) -> list[str]:
    if target is None:
        return sorted(manifest.all_entries())
    return sorted(op for op in manifest.all_entries() if target in registered_targets(op))


def _edge_cases(entry: manifest.OpEntry, target: str | None, device: str) -> list[Case]:
    """One row, odd sizes not a multiple of any vector width, and strided inputs."""
    base = entry.workload_cases("cpu")
    if not base:
        return []
    _, shapes, params, dtype = base[0]
    out = []
    for label, shrink in (("one-row", _one_row), ("odd", _odd)):
        smaller = shrink(entry, shapes, params)
        if smaller is not None:
            out.append(Case(entry.name, label, smaller[0], smaller[1], dtype, target, device))
    out.append(Case(entry.name, "strided", dict(shapes), dict(params), dtype, target, device, True))
    return out


def _valid(entry: manifest.OpEntry, shapes: dict, params: dict, dtype: torch.dtype) -> bool:
    specs = [_spec(entry, d, shapes, dtype) for d in entry.inputs]
    try:
        entry.check_inputs(specs, entry.init_params(dict(params)))
    except (TypeError, ValueError):
        return False
    return True


def _spec(entry: manifest.OpEntry, decl: Any, shapes: dict, dtype: torch.dtype) -> Any:
    shape = shapes.get(decl.name)
    if shape is None:
        return None
    return _Spec(torch.device("meta"), _input_dtype(decl, dtype), tuple(shape))


@dataclasses.dataclass(frozen=True)
class _Spec:
    device: torch.device
    dtype: torch.dtype
    shape: tuple[int, ...]


def _one_row(entry: manifest.OpEntry, shapes: dict, params: dict):
    first = entry.inputs[0].name
    shape = shapes.get(first)
    if not shape or len(shape) < 2:
        return None
    candidate = dict(shapes)
    for name, s in shapes.items():
        if s is not None and len(s) == len(shape) and s[0] == shape[0]:
            candidate[name] = (1, *s[1:])
    if entry.name in (_GQA_FWD, _GQA_DECODE):
        return None  # their constructor fixes the batch; covered by workloads
    return (candidate, params) if _valid(entry, candidate, params, torch.float32) else None


def _odd(entry: manifest.OpEntry, shapes: dict, params: dict):
    """Shrink every dim that can become odd (e.g. 4096 -> 37) while the rules still hold."""
    candidate = {k: (None if v is None else tuple(v)) for k, v in shapes.items()}
    changed = False
    for name in list(candidate):
        shape = candidate[name]
        if shape is None:
            continue
        for axis, size in enumerate(shape):
            if size <= 8:
                continue
            for odd in (37, 19, 9):
                trial = dict(candidate)
                trial[name] = shape[:axis] + (odd,) + shape[axis + 1 :]
                trial = _propagate(shapes, trial, size, odd)
                trial_params = _propagate_params(params, size, odd)
                if _valid(entry, trial, trial_params, torch.float32):
                    candidate, params, shape, changed = trial, trial_params, trial[name], True
                    break
    return (candidate, params) if changed else None


def _propagate(original: dict, trial: dict, old: int, new: int) -> dict:
    """Dims equal to the one changed change together (e.g. hidden size in x and weight)."""
    out = {}
    for name, shape in trial.items():
        if shape is None:
            out[name] = None
            continue
        out[name] = tuple(new if s == old else s for s in shape)
    return out


def _propagate_params(params: dict, old: int, new: int) -> dict:
    out = {}
    for key, value in params.items():
        if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
            out[key] = type(value)(new if v == old else v for v in value)
        else:
            out[key] = value
    return out


def _input_dtype(decl: Any, dtype: torch.dtype) -> torch.dtype:
    if decl.same_as is not None or decl.dtypes is None or dtype in decl.dtypes:
        return dtype
    return decl.dtypes[-1]  # e.g. position_ids: an integer dtype whatever the data dtype


def make_inputs(
    case: Case, generator: torch.Generator | None = None, *, full: bool = False
) -> list[torch.Tensor | None]:
    """Random inputs for ``case`` that respect each op's value domain. ``full``: index
    inputs as the manifest roofline assumes them (requests equally long, block tables
    full), for timing; otherwise they vary, to find edge cases."""
    entry = manifest.entry(case.op)
    gen = generator or torch.Generator().manual_seed(0)
    out: list[torch.Tensor | None] = []
    for decl in entry.inputs:
        shape = case.shapes.get(decl.name)
        if shape is None:
            out.append(None)
            continue
        dtype = _input_dtype(decl, case.dtype)
        if dtype.is_floating_point:
            t = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
        elif dtype == torch.bool:
            t = torch.randint(0, 2, shape, generator=gen).bool()
        else:
            high = case.params.get("max_position", 100) if decl.name == "position_ids" else 100
            low = 0 if decl.name == "position_ids" or dtype == torch.uint8 else -100
            t = torch.randint(low, high, shape, generator=gen, dtype=dtype)
        if case.op == "ClampFwdOp" and decl.name == "max" and out[1] is not None:
            t = torch.maximum(t, out[1])  # keep min <= max, as torch.clamp's docs assume
        quantized = _quantized_input(case, decl.name, shape, gen)
        if quantized is not None:
            t = quantized.to(dtype)
        if decl.name in ("w_gate_up", "w_down"):
            # an MoE expert's weights at a trained model's scale (1 / sqrt(fan-in)), so its
            # activations stay O(1): with unit weights they grow as sqrt(H * F), and
            # rounding an intermediate to float16/bfloat16 (as kernels do) would then be
            # judged against atol
            t = (t.float() / shape[-1] ** 0.5).to(dtype)
        out.append(t)
    if entry.value_rules:
        chosen = index_inputs(entry, case.shapes, case.params, gen, full=full)
        out = [chosen.get(d.name, t) for d, t in zip(entry.inputs, out)]
    if case.strided:
        out = [_strided(t) if t is not None and t.ndim >= 2 else t for t in out]
    return [None if t is None else t.to(case.device) for t in out]


def _quantized_input(case: Case, name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor | None:
    """Quantized weights as a model holds them (weights of about 0.02): valid GGML blocks
    for the GGUF ops, 4-bit groups with zero points in 0..15 for W4A16; None for any other
    input."""
    if name == "weight" and "ggml_type" in case.params:
        from tileops.quant import ggml_blocks  # noqa: PLC0415

        t = ggml_blocks.ggml_type(case.params["ggml_type"])
        k = shape[1] // t.type_size * t.block_size
        return ggml_blocks.random_blocks(t.name, shape[:1], k, gen)
    if case.op == "GemmW4A16FwdOp" and name == "weight_zero":
        return torch.randint(0, 16, shape, generator=gen, dtype=torch.uint8)
    if case.op == "GemmW4A16FwdOp" and name == "packed_weight":
        return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
    if case.op == "GemmW4A16FwdOp" and name == "weight_scale":
        return torch.rand(shape, generator=gen).mul(0.005).add(0.001)  # |(q - zero) * scale| up to about 0.02
    return None


def index_inputs(
    entry: manifest.OpEntry, shapes: dict, params: dict, gen: torch.Generator, *, full: bool = False
) -> dict[str, torch.Tensor]:
    """Values for the inputs an entry's value rules read, which every rule accepts: offsets
    split their total unevenly (empty requests included), lengths take part of what the
    page tables leave, and each request gets pages of its own, so no two write one row
    (ValueError where the cache is too small for that and the op writes to it).
    ``full``: offsets split evenly over every row and lengths take all the room (the
    shapes a roofline formula assumes)."""
    rules = entry.value_rules
    dtypes = {d.name: d.dtypes[-1] for d in entry.inputs if d.dtypes}
    out: dict[str, torch.Tensor] = {}
    limit = {r.tensors[0]: r.scalar_values(shapes, params)[0] for r in rules if r.kind == "spans_at_most"}
    writes = any(r.kind == "writes_apart" for r in rules)
    low = {r.tensors[0]: r.scalar_values(shapes, params)[0] for r in rules if r.kind == "at_least"}
    for rule in rules:
        if rule.kind in ("offsets", "offsets_within"):
            name = rule.tensors[0]
            (total,) = rule.scalar_values(shapes, params)
            if rule.kind == "offsets_within" and not full:
                total -= min(3, total // 4)  # a few trailing rows of padding
            count = shapes[name][0] - 1
            spans = _even_split(total, count) if full else _uneven_split(total, count, limit.get(name, total), gen)
            out[name] = torch.tensor([0, *itertools.accumulate(spans)], dtype=dtypes[name])
    for rule in rules:
        if rule.kind == "within" and rule.tensors[0] not in out:  # ids of rows, positions in a table
            name = rule.tensors[0]
            lo, hi = rule.scalar_values(shapes, params)
            out[name] = torch.randint(lo, max(hi, lo + 1), shapes[name], generator=gen, dtype=dtypes[name])
    for rule in rules:
        if rule.kind != "pages":
            continue
        table, *lengths = rule.tensors
        page_size, num_pages = rule.scalar_values(shapes, params)
        batch, width = shapes[table]
        fixed = [0] * batch
        free = [n for n in lengths if n not in out]
        for n in lengths:
            if n in out:
                values = out[n].tolist()
                spans = [b - a for a, b in zip(values[:-1], values[1:])] if len(values) == batch + 1 else values
                fixed = [f + s for f, s in zip(fixed, spans)]
        share = _request_share(batch, width, page_size, num_pages)
        for n in free:
            floor = max(low.get(n, 0), 0)
            room = [max(share - f, floor) for f in fixed]
            values = room if full else [int(torch.randint(floor, r + 1, (1,), generator=gen)) for r in room]
            out[n] = torch.tensor(values, dtype=dtypes[n])
            fixed = [f + x for f, x in zip(fixed, values)]
        used = [min(-(-tokens // page_size), width) for tokens in fixed]
        if writes and sum(used) > num_pages:
            raise ValueError(
                f"{entry.name}: its requests need {sum(used)} pages of {page_size} tokens, and the "
                f"cache holds {num_pages}: no block table keeps their writes apart at these shapes"
            )
        pages = torch.randperm(num_pages, generator=gen).tolist()
        rows = torch.randint(0, max(num_pages, 1), (batch, width), generator=gen)  # unused entries: valid pages
        at = 0
        for b, n in enumerate(used):  # where pages run out (reads only), requests share them
            rows[b, :n] = torch.tensor([pages[(at + i) % num_pages] for i in range(n)], dtype=rows.dtype)
            at += n
        out[table] = rows.to(dtypes[table])
    return out


def writes_fit(entry: manifest.OpEntry, shapes: dict, params: dict) -> bool:
    """Whether ``index_inputs`` can keep the requests' writes apart (``writes_apart``) at
    these shapes, whatever its random split: it can when no request's chunk exceeds its
    share of the pages. (Shrunk to a few hundred elements, a cache of one page cannot hold
    four requests' chunks apart.)"""
    rules = {r.kind: r for r in entry.value_rules}
    if "writes_apart" not in rules:
        return True
    page_size, num_pages = rules["pages"].scalar_values(shapes, params)
    batch, width = shapes[rules["pages"].tensors[0]]
    offsets = rules["writes_apart"].tensors[2]
    # the longest chunk: the offsets' total, or their span limit
    longest = min(
        r.scalar_values(shapes, params)[0]
        for r in entry.value_rules
        if r.tensors[0] == offsets and r.kind in ("offsets", "offsets_within", "spans_at_most")
    )
    return longest <= _request_share(batch, width, page_size, num_pages)


def _request_share(batch: int, width: int, page_size: int, num_pages: int) -> int:
    """The tokens each request may hold when the cache's pages are split evenly among
    ``batch`` requests whose block table rows have ``width`` entries."""
    return min(width, num_pages // max(batch, 1)) * page_size


def _even_split(total: int, count: int) -> list[int]:
    """``count`` parts of ``total`` that differ by at most one (the smallest largest part)."""
    return [total // count + (1 if i < total % count else 0) for i in range(count)]


def _uneven_split(total: int, count: int, limit: int, gen: torch.Generator) -> list[int]:
    """``count`` non-negative parts of ``total``, each at most ``limit``, not all equal."""
    spans = _even_split(total, count)
    for _ in range(2 * count):
        a, b = torch.randint(0, count, (2,), generator=gen).tolist()
        move = min(spans[a], limit - spans[b])
        if a != b and move > 0:
            shift = int(torch.randint(0, move + 1, (1,), generator=gen))
            spans[a] -= shift
            spans[b] += shift
    return spans


def _strided(t: torch.Tensor) -> torch.Tensor:
    """Same values, non-contiguous layout."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def constructor_args(case: Case) -> dict[str, Any]:
    """Manifest params plus the shape arguments of ops whose own constructor takes them
    (the dense GQA ops: manifest ``upstream:`` dims without an ``init``)."""
    args = dict(case.params)
    entry = manifest.entry(case.op)
    if entry.upstream is not None and entry.upstream.init is None:
        args.update(entry.shape_args(entry.case_specs(case.shapes, case.dtype)))
    return args


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one case gave: whether it matched, and its largest absolute error (over both
    calls and every output; ``None`` when the op raised or an output had the wrong
    dtype or shape). ``message`` says what failed."""

    case: Case
    passed: bool
    max_abs_error: float | None
    message: str | None = None


def measure(case: Case) -> Outcome:
    """Runs ``case`` like ``check`` and reports instead of raising: an exception from the
    op, its builder or its kernel is a failed outcome whose message names it."""
    try:
        worst = _run(case)
    except AssertionError as failure:
        return Outcome(case, False, getattr(failure, "worst", None), str(failure))
    except Exception as error:  # noqa: BLE001 - the harness reports what the target raised
        return Outcome(case, False, None, f"{case}: {type(error).__name__}: {error}")
    return Outcome(case, True, worst)


def check(case: Case) -> None:
    """Runs ``case`` through the op with ``target=case.target`` and compares it with the
    reference; raises AssertionError naming the case and the largest error."""
    _run(case)


def _run(case: Case) -> float:
    from .. import ops as ops_module

    cls = getattr(ops_module, case.op)
    op = cls(**constructor_args(case), target=case.target)
    inputs = make_inputs(case)
    reference_inputs = [None if t is None else t.clone() for t in inputs]
    entry = manifest.entry(case.op)
    specs = [None if t is None else _Spec(t.device, t.dtype, tuple(t.shape)) for t in inputs]
    params = entry.call_params(specs, op.params)
    expected = references.reference(case.op)(*[_cpu(t) for t in reference_inputs], **params)
    actual = op(*_prepared(op, entry, inputs))
    worst = _compare(case, actual, expected)
    # Second call: a memo hit must give the same answer.
    again = op(*_prepared(op, entry, make_inputs(case)))
    return max(worst, _compare(case, again, expected))


def _prepared(op: Any, entry: manifest.OpEntry, inputs: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """The inputs in the layouts the op's target registered for them (weights, once where
    they are loaded: ``Op.prepare_weight``); the references read them as made."""
    return [t if t is None else op.prepare_weight(d.name, t) for d, t in zip(entry.inputs, inputs)]


def _cpu(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.cpu()


class _Mismatch(AssertionError):
    def __init__(self, message: str, worst: float | None) -> None:
        super().__init__(message)
        self.worst = worst


def _compare(case: Case, actual: Any, expected: Any) -> float:
    """The largest absolute error over the outputs; AssertionError when one is off."""
    actual_seq = actual if isinstance(actual, tuple) else (actual,)
    expected_seq = expected if isinstance(expected, tuple) else (expected,)
    assert len(actual_seq) == len(expected_seq), f"{case}: {len(actual_seq)} outputs"
    largest = 0.0
    for got, want in zip(actual_seq, expected_seq):
        got = got.cpu()
        assert got.dtype == want.dtype, f"{case}: dtype {got.dtype}, expected {want.dtype}"
        assert got.shape == want.shape, f"{case}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        rtol, atol = references.tolerance(got.dtype, case.op)
        g, w = got.double(), want.double()
        # equal values (infinities included) and a NaN where the reference has one agree
        # (equal_nan); any other NaN is an infinite error
        agree = (g == w) | (g.isnan() & w.isnan())
        diff = (g - w).abs().masked_fill(agree, 0).nan_to_num(nan=float("inf"))
        worst = diff.max().item() if diff.numel() else 0.0
        largest = max(largest, worst)
        if not torch.allclose(got.double(), want.double(), rtol=rtol, atol=atol, equal_nan=True):
            raise _Mismatch(f"{case}: max abs error {worst:.3g} > rtol {rtol}, atol {atol}", worst)
    return largest


def ids(case_list: Sequence[Case]) -> list[str]:
    return [str(c) for c in case_list]
