"""An entry's params: init_params (types, defaults, param rules at construction) and
call_params (what a call resolves: eps, softmax's dim, reduction dims)."""

from __future__ import annotations

import pytest
import torch

from tileops import manifest

from ._common import specs

# --- init_params ------------------------------------------------------------------------


def test_init_params_fills_defaults_in_declared_order_and_makes_lists_tuples() -> None:
    e = manifest.entry("RMSNormFwdOp")
    got = e.init_params({"eps": None, "normalized_shape": [4096]})
    assert list(got.items()) == [("normalized_shape", (4096,)), ("eps", None)]
    assert manifest.entry("GemmFwdOp").init_params({}) == {"trans_a": False, "trans_b": True}
    assert manifest.entry("BmmFwdOp").init_params({}) == {}


def test_init_params_rejects_a_value_of_the_wrong_type_with_the_declared_type_in_the_message() -> None:
    with pytest.raises(TypeError) as info:
        manifest.entry("RMSNormFwdOp").init_params({"normalized_shape": [8], "eps": "abc"})
    assert str(info.value) == "RMSNormFwdOp: param 'eps' expects float | None, got 'abc' (str)"


def test_init_params_accepts_an_int_for_a_float_and_converts_it() -> None:
    got = manifest.entry("RMSNormFwdOp").init_params({"normalized_shape": (8,), "eps": 1})
    assert got["eps"] == 1.0 and type(got["eps"]) is float
    alpha = manifest.entry("AddFwdOp").init_params({"alpha": 2})["alpha"]
    assert alpha == 2 and type(alpha) is int  # int | float keeps an int an int


@pytest.mark.parametrize(
    ("op", "given"),
    [
        ("RMSNormFwdOp", {"normalized_shape": [8], "eps": True}),
        ("GroupNormFwdOp", {"num_groups": True}),
        ("AddFwdOp", {"alpha": False}),
        ("RMSNormFwdOp", {"normalized_shape": [True]}),
        ("RMSNormFwdOp", {"normalized_shape": [8.0]}),
        ("SumFwdOp", {"dim": "0"}),
        ("GemmFwdOp", {"trans_b": 1}),
        ("FusedAddRMSNormFwdOp", {"eps": None}),
    ],
)
def test_init_params_refuses_bool_as_a_number_and_other_mismatches(op: str, given: dict) -> None:
    with pytest.raises(TypeError, match=f"^{op}: param '"):
        manifest.entry(op).init_params(given)


def test_init_params_rejects_unknown_and_missing_required_names() -> None:
    e = manifest.entry("RMSNormFwdOp")
    with pytest.raises(TypeError, match="unknown param 'epsilon'.*normalized_shape"):
        e.init_params({"normalized_shape": [8], "epsilon": 1e-5})
    with pytest.raises(TypeError, match="missing required param 'normalized_shape'"):
        e.init_params({})
    with pytest.raises(TypeError, match="'max_position', 'rotary_dim'"):
        manifest.entry("RopeNeoxPositionIdsFwdOp").init_params({})


@pytest.mark.parametrize(
    ("op", "given", "words"),
    [
        (
            "GeluFwdOp",
            {"approximate": "fast"},
            "`approximate in ('none', 'tanh')` does not hold: approximate='fast'",
        ),
        ("RopeNeoxFwdOp", {"layout": "3d"}, "layout='3d'"),
        ("GroupNormFwdOp", {"num_groups": 0}, "num_groups=0"),
        ("RopeNeoxPositionIdsFwdOp", {"max_position": 64, "rotary_dim": 63}, "rotary_dim=63"),
    ],
)
def test_param_rules_reject_bad_values_at_construction(op: str, given: dict, words: str) -> None:
    with pytest.raises(ValueError, match=f"^{op}: param rule") as info:
        manifest.entry(op).init_params(given)
    assert words in str(info.value)


# --- call_params ------------------------------------------------------------------------


def test_call_params_resolves_eps_none_to_the_documented_default() -> None:
    rms = manifest.entry("RMSNormFwdOp")
    s = specs(rms, {"x": (2, 8), "weight": (8,)})
    assert rms.call_params(s, rms.init_params({"normalized_shape": [8]}))["eps"] == 1e-6
    assert rms.call_params(s, rms.init_params({"normalized_shape": [8], "eps": 1e-3}))["eps"] == 1e-3
    ln = manifest.entry("LayerNormFwdOp")
    s = specs(ln, {"x": (2, 8), "weight": (8,), "bias": (8,)})
    assert ln.call_params(s, ln.init_params({"normalized_shape": [8]}))["eps"] == 1e-5


@pytest.mark.parametrize(
    ("shape", "dim", "resolved"),
    [
        ((), None, 0),
        ((5,), None, 0),
        ((2, 5), None, 1),
        ((2, 3, 5), None, 0),
        ((2, 3, 4, 5), None, 1),
        ((2, 3, 5), -1, 2),
        ((2, 3, 5), 1, 1),
        ((), -1, 0),
    ],
)
def test_softmax_dim_resolves_by_pytorchs_legacy_rule_and_to_a_non_negative_axis(
    shape: tuple, dim: int | None, resolved: int
) -> None:
    for op in ("SoftmaxFwdOp", "LogSoftmaxFwdOp"):
        e = manifest.entry(op)
        params = e.init_params({"dim": dim})
        e.check_inputs(specs(e, {"x": shape}), params)
        assert e.call_params(specs(e, {"x": shape}), params) == {"dim": resolved}
        if dim is None and shape:  # torch agrees about the implicit dim
            x = torch.randn(shape)
            with pytest.warns(UserWarning):
                expected = torch.nn.functional.softmax(x)  # the implicit-dim call
            assert torch.allclose(torch.nn.functional.softmax(x, dim=resolved), expected)


@pytest.mark.parametrize(
    ("shape", "dim", "resolved"),
    [
        ((2, 3, 4), None, (0, 1, 2)),
        ((2, 3, 4), [], (0, 1, 2)),
        ((2, 3, 4), -1, (2,)),
        ((2, 3, 4), [2, -3], (0, 2)),
        ((2, 3, 4), (1,), (1,)),
        ((), None, ()),
        ((), 0, ()),
    ],
)
def test_reduction_dims_resolve_to_a_sorted_tuple_of_non_negative_axes(
    shape: tuple, dim: object, resolved: tuple
) -> None:
    for op in ("SumFwdOp", "MeanFwdOp", "AmaxFwdOp"):
        e = manifest.entry(op)
        params = e.init_params({"dim": dim, "keepdim": True})
        s = specs(e, {"x": shape})
        e.check_inputs(s, params)
        got = e.call_params(s, params)
        assert got == {"dim": resolved, "keepdim": True}
        assert e.call_params(s, got) == got  # resolving twice changes nothing


def test_call_params_of_every_workload_case_are_concrete() -> None:
    for e in manifest.all_entries().values():
        for _, shapes, params, dtype in e.workload_cases("cpu"):
            got = e.call_params(specs(e, shapes, dtype), params)
            assert list(got) == list(e.param_names())
            assert None not in got.values(), (e.name, got)
