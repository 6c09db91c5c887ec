"""output_meta: the outputs' dtypes and shapes, against what the references return and against
torch's broadcasting and reduction rules."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tileops import manifest
from tileops.backend.types import TensorSpec
from tileops.manifest import OpEntry, _load_from
from tileops.manifest._expr import broadcast_shapes, reduced_shape
from tileops.testing.references import reference

from ._common import BF16, CPU, F16, F32, OPS, TOY, make_inputs, specs, write

# --- output_meta, against the references ------------------------------------------------


def _cheapest_case(e: OpEntry) -> tuple:
    return min(e.workload_cases("cpu"), key=lambda c: e.roofline(specs(e, c[1], c[3]), c[2]))


@pytest.mark.parametrize("op", OPS)
def test_output_meta_matches_what_the_reference_returns_on_real_tensors(op: str) -> None:
    e = manifest.entry(op)
    _, shapes, params, dtype = _cheapest_case(e)
    inputs = make_inputs(e, shapes, dtype, params)
    s = [None if t is None else TensorSpec(t.device, t.dtype, tuple(t.shape)) for t in inputs]
    e.check_inputs(s, params)
    result = reference(op)(*inputs, **e.call_params(s, params))
    outputs = result if isinstance(result, tuple) else (result,)
    assert [(t.dtype, tuple(t.shape)) for t in outputs] == e.output_meta(s, params)


@pytest.mark.parametrize(
    ("op", "shapes", "dtype", "given"),
    [
        ("SumFwdOp", {"x": (2, 3, 4)}, F32, {"dim": [0, 2], "keepdim": True}),
        ("AmaxFwdOp", {"x": (2, 3, 4)}, BF16, {"dim": -2}),
        ("MeanFwdOp", {"x": ()}, F16, {}),
        ("GemmFwdOp", {"a": (8, 4), "b": (8, 6)}, F16, {"trans_a": True, "trans_b": False}),
        ("AddFwdOp", {"input": (3, 1, 5), "other": (4, 1)}, torch.int16, {"alpha": 3}),
        ("MulFwdOp", {"input": (5,), "other": (2, 1)}, torch.bool, {}),
        ("ClampFwdOp", {"input": (3, 1), "max": (4,)}, F32, {}),
        (
            "GroupNormFwdOp",
            {"x": (2, 6, 3, 3), "weight": (6,), "bias": (6,)},
            BF16,
            {"num_groups": 3},
        ),
        ("RopeNeoxFwdOp", {"x": (1, 6, 2, 8)}, F32, {"layout": "2d", "base": 500.0}),
    ],
)
def test_output_meta_matches_the_reference_off_the_workload_path(
    op: str, shapes: dict, dtype: torch.dtype, given: dict
) -> None:
    e = manifest.entry(op)
    params = e.init_params(given)
    inputs = make_inputs(e, shapes, dtype, params)
    s = specs(e, shapes, dtype, CPU)
    e.check_inputs(s, params)
    out = reference(op)(*inputs, **e.call_params(s, params))
    assert [(out.dtype, tuple(out.shape))] == e.output_meta(s, params)


def test_an_output_of_a_fixed_dtype_keeps_it_whatever_the_inputs_dtype(tmp_path: Path) -> None:
    data = copy.deepcopy(TOY)
    data["ToyOp"]["signature"]["outputs"] = {
        "output": {"dtype": "same_as(x)", "shape": "x.shape"},
        "ids": {"dtype": "int32", "shape": "(x.shape[0], 2)"},
        "scores": {"dtype": "float32", "shape": "x.shape[:1]"},
    }
    entry = _load_from([write(tmp_path, data)])["ToyOp"]
    assert [(o.dtype_from, o.dtype) for o in entry.outputs] == [
        ("x", None),
        (None, torch.int32),
        (None, F32),
    ]
    for dtype in (F16, BF16):
        meta = entry.output_meta(specs(entry, {"x": (4, 8), "weight": (8,)}, dtype), {"eps": 1e-6})
        assert meta == [(dtype, (4, 8)), (torch.int32, (4, 2)), (F32, (4,))]


# --- helpers, against torch -------------------------------------------------------------

_shape = st.lists(st.integers(1, 4), min_size=0, max_size=4).map(tuple)


@settings(max_examples=150, deadline=None)
@given(_shape, _shape)
def test_broadcast_shapes_agrees_with_torch(a: tuple, b: tuple) -> None:
    try:
        expected = tuple(torch.broadcast_shapes(a, b))
    except RuntimeError:
        with pytest.raises(ValueError):
            broadcast_shapes(a, b)
    else:
        assert broadcast_shapes(a, b) == expected


@settings(max_examples=150, deadline=None)
@given(_shape, st.data(), st.booleans())
def test_reduced_shape_agrees_with_torch_sum(shape: tuple, data: st.DataObject, keepdim: bool) -> None:
    ndim = max(len(shape), 1)
    dim = data.draw(
        st.none()
        | st.integers(-ndim, ndim - 1)
        | st.lists(st.integers(-ndim, ndim - 1), max_size=ndim, unique_by=lambda d: d % ndim)
    )
    x = torch.zeros(shape)
    expected = (
        tuple(x.sum(dim=dim, keepdim=keepdim).shape)
        if dim is not None
        else (tuple(x.sum().shape) if not keepdim else (1,) * len(shape))
    )
    assert reduced_shape(shape, dim, keepdim) == expected
