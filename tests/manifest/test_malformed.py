"""Malformed manifests: each mistake is a ManifestError naming the file, the entry and the
field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tileops.manifest import ManifestError, _load_from

from ._common import TOY, write


def _mutate(keys: tuple, value: object) -> dict:
    data = copy.deepcopy(TOY)
    node = data["ToyOp"]
    for k in keys[:-1]:
        node = node[k]
    if value is _DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return data


_DELETE = object()

MALFORMED = [
    # (keys under ToyOp, new value, field the error names, words it says)
    (("family",), _DELETE, None, "missing key 'family'"),
    (("module",), _DELETE, None, "missing key 'module'"),
    (("module",), "toy", "module", "under tileops.ops"),
    (("module",), "tileops.ops.norm._private", "module", "under tileops.ops"),
    (("module",), ["tileops.ops.a", "tileops.ops.a"], "module", "twice"),
    (("module",), [], "module", "non-empty list"),
    (("doc",), "", "doc", "non-empty string"),
    (("colour",), "red", None, "unknown key 'colour'"),
    (("signature", "inputs", "x", "dtype"), "float8", "signature.inputs.x.dtype", "float8"),
    (
        ("signature", "inputs", "weight", "dtype"),
        "same_as(y)",
        "signature.inputs.weight.dtype",
        "earlier input",
    ),
    (("signature", "inputs", "x", "optional"), True, "signature.inputs.x", "cannot be optional"),
    (("signature", "inputs", "x", "shape"), [1], "signature.inputs.x", "unknown key 'shape'"),
    (("signature", "params", "eps", "type"), "double", "signature.params.eps.type", "double"),
    (("signature", "params", "eps", "default"), "1e-6", "signature.params.eps.default", "1.0e-6"),
    (
        ("signature", "params", "eps", "kw_only"),
        "yes",
        "signature.params.eps.kw_only",
        "true or false",
    ),
    (("signature", "params", "2eps"), {"type": "float"}, "signature.params.2eps", "identifier"),
    (
        ("signature", "params", "n"),
        {"type": "int"},
        "signature.params.n",
        "required positional param",
    ),
    (("signature", "params", "x"), {"type": "int"}, "signature.params.x", "name of an input"),
    (
        ("signature", "outputs", "output", "dtype"),
        "float16 | float32",
        "signature.outputs.output.dtype",
        "same_as(<input>) or one dtype name",
    ),
    (
        ("signature", "outputs", "output", "dtype"),
        "float64",
        "signature.outputs.output.dtype",
        "unknown dtype 'float64'",
    ),
    (("signature", "shape_rules"), ["weight.shape =="], "signature.shape_rules[0]", "syntax"),
    (
        ("signature", "shape_rules"),
        ["wieght.shape == x.shape"],
        "signature.shape_rules[0]",
        "unknown name 'wieght'",
    ),
    (("signature", "param_rules"), ["x.ndim > 0"], "signature.param_rules[0]", "unknown name 'x'"),
    (("roofline", "flops"), "x.__class__", "roofline.flops", "private attribute"),
    (("roofline", "vars"), {"eb": "1"}, "roofline.vars.eb", "hide"),
    (("kernel_map",), {}, "kernel_map", "empty"),
    (("ref_api",), "torch.nn.functional.no_such", "ref_api", "no_such"),
    (
        ("workloads", 0, "weight"),
        [9],
        "workloads[0] (w) as float16",
        "`weight.shape == (x.shape[-1],)` does not hold: weight.shape=(9,), x.shape=(4, 8)",
    ),
    (("workloads", 0, "y"), [1], "workloads[0] (w)", "unknown key 'y'"),
    (("workloads", 0, "dtypes"), ["float32"], "workloads[0] (w) as float32", "float32"),
    (("workloads", 0, "params"), {"eps": "small"}, "workloads[0] (w).params", "'small'"),
    (
        ("signature", "params", "eb"),
        {"type": "int", "default": 1},
        "signature.params.eb",
        "reserved for the roofline",
    ),
    (("signature", "value_rules"), "offsets(x, 1)", "signature.value_rules", "list"),
    (("signature", "value_rules"), ["offset(x, 1)"], "signature.value_rules[0]", "unknown check 'offset'"),
    (("signature", "value_rules"), ["offsets(x, 1)"], "signature.value_rules[0]", "int32 or int64"),
    (("signature", "value_rules"), ["offsets(y, 1)"], "signature.value_rules[0]", "'y' is not an input"),
    (("signature", "value_rules"), ["offsets(x)"], "signature.value_rules[0]", "takes 2 to 2 arguments"),
    (("signature", "value_rules"), ["at_least(x, eps * 2)"], "signature.value_rules[0]", "int32 or int64"),
    # upstream TileOPs' constructor: every argument is said to be something
    (
        ("upstream",),
        {"init": "rows, colour=1", "dims": {"rows": "x.shape[0]"}},
        "upstream.init",
        "'colour' is no manifest param, dim, limit, dtype, knob",
    ),
    (("upstream",), {"init": "rows", "dims": {"rows": "y.shape[0]"}}, "upstream.dims.rows", "unknown name 'y'"),
    (
        ("upstream",),
        {"init": "eps=1.0e-6", "dims": {"rows": "x.shape[0]"}},
        "upstream",
        "'rows' is declared but is not in upstream's init",
    ),
    (
        ("upstream",),
        {"init": "eps=1.0e-6, backend='auto'", "knobs": {"backend": ["dense"]}},
        "upstream.knobs.backend",
        "upstream's default 'auto' must be served",
    ),
    (("upstream",), {"init": "eps, *rest"}, "upstream.init", "not supported"),
    (("upstream",), {"dtypes": {"dtype": "y"}}, "upstream.dtypes.dtype", "'y' is not an input"),
    (("upstream",), {"knobs": {"config": "any"}}, "upstream", "describe upstream's init"),
    (
        ("upstream",),
        {"init": "rows, eps=1.0e-6", "dims": {"rows": "x.shape[0]"}, "params": {"eps": "rows"}},
        "upstream.params.eps",
        "must be a manifest param that upstream's init lacks",
    ),
]


@pytest.mark.parametrize(
    ("keys", "value", "field", "words"),
    MALFORMED,
    ids=[".".join(map(str, m[0])) + "=" + repr(m[1])[:20] for m in MALFORMED],
)
def test_a_malformed_entry_raises_a_manifest_error_naming_file_entry_and_field(
    tmp_path: Path, keys: tuple, value: object, field: str | None, words: str
) -> None:
    path = write(tmp_path, _mutate(keys, value))
    with pytest.raises(ManifestError) as info:
        _load_from([path])
    err = info.value
    assert err.path == str(path) and str(path) in str(err)
    assert err.entry == "ToyOp" and "ToyOp" in str(err)
    assert err.field == field
    if field is not None:
        assert field in str(err)
    assert words in str(err)


def test_the_unmutated_toy_entry_loads(tmp_path: Path) -> None:
    entries = _load_from([write(tmp_path, TOY)])
    assert entries["ToyOp"].params[0].default == 1e-6


def test_yaml_that_does_not_parse_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "ToyOp: {family: norm\n  ref_api: [\n")
    with pytest.raises(ManifestError, match="YAML does not parse") as info:
        _load_from([path])
    assert str(path) in str(info.value)


def test_a_key_written_twice_is_an_error_not_a_silent_overwrite(tmp_path: Path) -> None:
    text = yaml.safe_dump(TOY, sort_keys=False)
    text = text.replace("  family: norm\n", "  family: norm\n  family: gemm\n")
    with pytest.raises(ManifestError, match="duplicate key 'family'"):
        _load_from([write(tmp_path, text)])


def test_an_op_declared_in_two_files_is_an_error_naming_both(tmp_path: Path) -> None:
    first = write(tmp_path, TOY, "a.yaml")
    second = write(tmp_path, TOY, "b.yaml")
    with pytest.raises(ManifestError) as info:
        _load_from([tmp_path])
    assert str(first) in str(info.value) and str(second) in str(info.value)
