"""check_inputs: the dtype, device, arity and shape rules every call passes, the value rules
parsed from the manifest, and a cost small enough for every memo miss."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
import torch

from tileops import manifest
from tileops.backend.types import TensorSpec
from tileops.manifest import ManifestError, _load_from

from ._common import BF16, CPU, F16, F32, META, TOY, specs, write


def test_check_inputs_accepts_valid_specs_tensors_and_absent_optional_inputs() -> None:
    e = manifest.entry("RMSNormFwdOp")
    params = e.init_params({"normalized_shape": [64]})
    e.check_inputs(specs(e, {"x": (2, 3, 64), "weight": (64,)}, BF16), params)
    e.check_inputs([torch.ones(2, 64, dtype=F16), torch.ones(64, dtype=F16)], params)
    g = manifest.entry("GroupNormFwdOp")
    g.check_inputs(specs(g, {"x": (2, 8, 5)}, F32), g.init_params({"num_groups": 4}))
    c = manifest.entry("ClampFwdOp")
    c.check_inputs(specs(c, {"input": (4, 4), "max": (4,)}), {})


def test_rmsnorm_rejects_a_weight_whose_shape_differs_from_normalized_shape() -> None:
    e = manifest.entry("RMSNormFwdOp")
    with pytest.raises(ValueError) as info:
        e.check_inputs(specs(e, {"x": (4, 64), "weight": (32,)}), e.init_params({"normalized_shape": [64]}))
    assert str(info.value) == (
        "RMSNormFwdOp: shape rule `weight.shape == tuple(normalized_shape)` does not hold: "
        "weight.shape=(32,), normalized_shape=(64,)"
    )


def test_a_required_input_given_as_none_is_a_type_error() -> None:
    e = manifest.entry("RMSNormFwdOp")
    with pytest.raises(TypeError) as info:
        e.check_inputs([TensorSpec(META, F16, (2, 8)), None], e.init_params({"normalized_shape": [8]}))
    assert str(info.value) == "RMSNormFwdOp: input 'weight' is required, got None"


def test_a_dtype_outside_the_rule_is_rejected_naming_the_rule_and_the_dtype() -> None:
    e = manifest.entry("RMSNormFwdOp")
    with pytest.raises(ValueError) as info:
        e.check_inputs(specs(e, {"x": (2, 8), "weight": (8,)}, F32), e.init_params({"normalized_shape": [8]}))
    assert str(info.value) == ("RMSNormFwdOp: input 'x' expects dtype float16 | bfloat16, got torch.float32")


def test_a_same_as_violation_names_both_inputs_and_both_dtypes() -> None:
    e = manifest.entry("GemmFwdOp")
    with pytest.raises(ValueError) as info:
        e.check_inputs(
            [TensorSpec(META, F16, (4, 8)), TensorSpec(META, BF16, (2, 8))],
            {"trans_a": False, "trans_b": True},
        )
    text = str(info.value)
    assert "'b'" in text and "'a'" in text and "torch.float16" in text and "torch.bfloat16" in text


def test_inputs_on_two_devices_are_rejected() -> None:
    e = manifest.entry("AddFwdOp")
    with pytest.raises(ValueError, match="one device.*'input' is on meta.*'other' is on cpu"):
        e.check_inputs([TensorSpec(META, F16, (4,)), TensorSpec(CPU, F16, (4,))], {"alpha": 1})


def test_a_non_tensor_or_the_wrong_number_of_inputs_is_a_type_error() -> None:
    e = manifest.entry("SiluFwdOp")
    with pytest.raises(TypeError, match="input 'input' expects a tensor, got int: 3"):
        e.check_inputs([3], {"inplace": False})
    with pytest.raises(TypeError, match="expects 1 inputs"):
        e.check_inputs([], {"inplace": False})


def test_a_rule_that_raises_on_a_0d_tensor_is_reported_as_a_failed_rule() -> None:
    e = manifest.entry("FusedAddRMSNormFwdOp")
    with pytest.raises(ValueError) as info:
        e.check_inputs(specs(e, {"x": (), "residual": (), "weight": (1,)}), {"eps": 1e-6})
    assert "`x.ndim >= 1` does not hold" in str(info.value)
    r = manifest.entry("RopeNeoxFwdOp")
    with pytest.raises(ValueError) as info:
        r.check_inputs(specs(r, {"x": ()}), r.init_params({}))
    assert "x.ndim=0" in str(info.value)


def test_a_rule_that_raises_while_evaluating_is_a_value_error_quoting_the_exception(
    tmp_path: Path,
) -> None:
    data = copy.deepcopy(TOY)  # ToyOp's only rule indexes x.shape[-1], with no ndim guard
    data["ToyOp"]["signature"]["inputs"]["weight"]["optional"] = True
    data["ToyOp"]["workloads"][0].pop("weight")
    data["ToyOp"]["signature"]["shape_rules"] = ["weight is None or weight.shape == (x.shape[-1],)"]
    e = _load_from([write(tmp_path, data)])["ToyOp"]
    with pytest.raises(ValueError) as info:
        e.check_inputs([TensorSpec(META, F16, ()), TensorSpec(META, F16, (1,))], {"eps": 1e-6})
    text = str(info.value)
    assert text.startswith("ToyOp: shape rule `weight is None or weight.shape == (x.shape[-1],)`")
    assert "IndexError" in text and "x.shape=()" in text and "weight.shape=(1,)" in text


REJECTIONS = [
    # (op, shapes, dtype, given params, words in the message)
    (
        "LayerNormFwdOp",
        {"x": (2, 8), "weight": (8,), "bias": (4,)},
        F32,
        {"normalized_shape": [8]},
        "bias.shape=(4,)",
    ),
    (
        "LayerNormFwdOp",
        {"x": (2, 8), "weight": (8,), "bias": (8,)},
        F32,
        {"normalized_shape": []},
        "`len(normalized_shape) > 0`",
    ),
    (
        "GroupNormFwdOp",
        {"x": (2, 8, 4), "weight": (8,)},
        F16,
        {"num_groups": 2},
        (
            "`(weight is None) == (bias is None)` does not hold: "
            "weight=tensor(shape=(8,), dtype=torch.float16), bias=None"
        ),
    ),
    ("GroupNormFwdOp", {"x": (2, 6, 4)}, F16, {"num_groups": 4}, "x.shape=(2, 6, 4), num_groups=4"),
    ("ClampFwdOp", {"input": (4, 4)}, F16, {}, "`min is not None or max is not None`"),
    (
        "ClampFwdOp",
        {"input": (4, 4), "min": (3,)},
        F16,
        {},
        "input.shape=(4, 4), min=tensor(shape=(3,), dtype=torch.float16), max=None",
    ),
    ("SoftmaxFwdOp", {"x": (2, 3)}, F16, {"dim": 2}, "dim=2"),
    ("SumFwdOp", {"x": (2, 3)}, F16, {"dim": [0, -2]}, "dim=(0, -2)"),
    ("SumFwdOp", {"x": (2, 3)}, F16, {"dim": [5]}, "dim=(5,)"),
    (
        "GemmFwdOp",
        {"a": (4, 8), "b": (16, 6)},
        F16,
        {},
        "a.shape=(4, 8), trans_a=False, b.shape=(16, 6), trans_b=True",
    ),
    ("GemmFwdOp", {"a": (2, 4, 8), "b": (16, 8)}, F16, {}, "`a.ndim == 2`"),
    ("BmmFwdOp", {"a": (2, 4, 8), "b": (2, 8, 4)}, F16, {}, "`a.shape[2] % 16 == 0`"),
    ("BmmFwdOp", {"a": (2, 4, 16), "b": (3, 16, 4)}, F16, {}, "`a.shape[0] == b.shape[0]`"),
    ("AddFwdOp", {"input": (2, 3), "other": (4,)}, F16, {}, "broadcastable"),
    ("AddFwdOp", {"input": (2, 3), "other": (3,)}, torch.int32, {"alpha": 0.5}, "alpha=0.5"),
    ("SiluAndMulFwdOp", {"x": (4, 7)}, F16, {}, "`x.shape[1] % 2 == 0`"),
    ("RopeNeoxFwdOp", {"x": (2, 8, 4, 16)}, F16, {}, "layout='1d'"),
    ("RopeNeoxFwdOp", {"x": (8, 15)}, F16, {}, "`x.shape[-1] % 2 == 0`"),
    (
        "RopeNeoxPositionIdsFwdOp",
        {"x": (4, 2, 16), "position_ids": (5,)},
        F16,
        {"max_position": 64, "rotary_dim": 16},
        "position_ids.shape=(5,)",
    ),
    (
        "RopeNeoxPositionIdsFwdOp",
        {"x": (4, 2, 16), "position_ids": (4,)},
        F16,
        {"max_position": 64, "rotary_dim": 32},
        "rotary_dim=32",
    ),
    (
        "GroupedQueryAttentionFwdOp",
        {"q": (1, 8, 6, 16), "k": (1, 8, 4, 16), "v": (1, 8, 4, 16)},
        F16,
        {},
        "k.shape=(1, 8, 4, 16), q.shape=(1, 8, 6, 16)",
    ),
    (
        "GroupedQueryAttentionFwdOp",
        {"q": (1, 8, 8, 16), "k": (1, 4, 4, 16), "v": (1, 4, 4, 16)},
        F16,
        {},
        "`k.shape[1] == q.shape[1]`",
    ),
    (
        "GroupedQueryAttentionDecodeWithKVCacheFwdOp",
        {"q": (2, 8, 16), "k": (2, 32, 4, 16), "v": (2, 32, 4, 8)},
        F16,
        {},
        "v.shape=(2, 32, 4, 8)",
    ),
    (
        "GroupedQueryAttentionDecodeWithKVCacheFwdOp",
        {"q": (2, 8, 16), "k": (2, 0, 4, 16), "v": (2, 0, 4, 16)},
        F16,
        {},
        "`k.shape[1] > 0`",
    ),
]


@pytest.mark.parametrize(
    ("op", "shapes", "dtype", "given", "words"),
    REJECTIONS,
    ids=[f"{r[0]}-{i}" for i, r in enumerate(REJECTIONS)],
)
def test_each_shape_rule_rejects_a_violating_call_quoting_rule_and_values(
    op: str, shapes: dict, dtype: torch.dtype, given: dict, words: str
) -> None:
    e = manifest.entry(op)
    with pytest.raises(ValueError) as info:
        e.check_inputs(specs(e, shapes, dtype), e.init_params(given))
    text = str(info.value)
    assert text.startswith(f"{op}: shape rule `"), text
    assert words in text, text


def test_value_rules_parse_into_checks_whose_scalars_come_from_shapes_and_params(tmp_path: Path) -> None:
    data = copy.deepcopy(TOY)
    sig = data["ToyOp"]["signature"]
    sig["inputs"]["cu"] = {"dtype": "int32"}
    sig["params"]["limit"] = {"type": "int", "default": 3}
    sig["value_rules"] = ["offsets(cu, x.shape[0] * 2 - 1)", "spans_at_most(cu, limit // 2)"]
    data["ToyOp"]["workloads"][0]["cu"] = [3]
    (entry,) = _load_from([write(tmp_path, data)]).values()
    offsets, spans = entry.value_rules
    assert (offsets.kind, offsets.tensors, spans.kind) == ("offsets", ("cu",), "spans_at_most")
    assert offsets.scalar_values({"x": (4, 8)}, {"limit": 3}) == [7]
    assert spans.scalar_values({"x": (4, 8)}, {"limit": 3}) == [1]
    kind, text, slots, programs = offsets.compiled({"limit": 3}, {"x": 0, "weight": 1, "cu": 2})
    assert (kind, text, slots) == (0, "offsets(cu, x.shape[0] * 2 - 1)", [2])
    with pytest.raises(TypeError, match="needs param 'limit' as an int"):
        spans.compiled({"limit": None}, {"x": 0, "weight": 1, "cu": 2})
    sig["value_rules"] = ["offsets(cu, x.numel)"]
    with pytest.raises(ManifestError, match="a scalar is an int, an int param, x.shape"):
        _load_from([write(tmp_path, data)])


def test_checks_are_cheap_enough_for_every_memo_miss() -> None:
    e = manifest.entry("RMSNormFwdOp")
    params = e.init_params({"normalized_shape": [4096]})
    s = [TensorSpec(CPU, F16, (2048, 4096)), TensorSpec(CPU, F16, (4096,))]
    start = time.perf_counter()
    for _ in range(500):
        e.check_inputs(s, params)
        e.call_params(s, params)
        e.output_meta(s, params)
        e.roofline(s, params)
    per_call = (time.perf_counter() - start) / 500
    assert per_call < 1e-3, f"{per_call * 1e6:.0f} us per miss"
