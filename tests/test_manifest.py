"""The op manifests and tileops.manifest: loading, validation, checks, numbers, references."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tileops import manifest
from tileops.backend.types import TensorSpec
from tileops.manifest import ManifestError, OpEntry, _index, _load_from
from tileops.manifest._expr import broadcast_shapes, reduced_shape
from tileops.testing.harness import index_inputs
from tileops.testing.references import reference, tolerance

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
CPU = torch.device("cpu")
META = torch.device("meta")
# Every shipped op: the manifests are the list (no hand copy to keep in step).
OPS = sorted(manifest.all_entries())


def specs(e: OpEntry, shapes: dict, dtype: torch.dtype = F16, device: torch.device = META) -> list:
    """TensorSpecs for ``shapes`` (input name -> shape; a missing name is an absent input)."""
    return [
        None if shapes.get(n) is None else TensorSpec(device, dt, tuple(shapes[n]))
        for n, dt in zip(e.input_names(), e.case_dtypes(dtype))
    ]


def make_inputs(e: OpEntry, shapes: dict, dtype: torch.dtype, params: dict) -> list:
    """Small real tensors for a case; position ids stay below max_position, and what value
    rules read (offsets, lengths, page tables) is what the harness makes valid."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for name, dt in zip(e.input_names(), e.case_dtypes(dtype)):
        shape = shapes.get(name)
        if shape is None:
            out.append(None)
        elif dt.is_floating_point:
            out.append(torch.randn(shape, generator=gen).to(dt))
        elif name == "position_ids":
            out.append(torch.randint(0, params["max_position"], shape, generator=gen).to(dt))
        else:
            out.append(torch.randint(0, 2 if dt == torch.bool else 100, shape, generator=gen).to(dt))
    if e.value_rules:
        chosen = index_inputs(e, shapes, params, gen)
        out = [chosen.get(name, t) for name, t in zip(e.input_names(), out)]
    return out


def workload(e: OpEntry, name: str, dtype: torch.dtype) -> tuple[dict, dict]:
    for n, shapes, params, dt in e.workload_cases("full"):
        if n == name and dt == dtype:
            return shapes, params
    raise AssertionError(f"{e.name} has no workload {name} in {dtype}")


# --- loading ----------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_each_entry_comes_from_the_shipped_folder_and_names_a_family_and_a_module(op: str) -> None:
    e = manifest.entry(op)
    assert e.source.parent == manifest.manifest_dir()
    assert e.family and e.modules and e.kernel_map
    assert e.input_names() and e.outputs


def test_defaults_keep_the_type_they_are_written_in() -> None:
    # alpha's 1 stays an int; 1.0e-6 is a float, not the string YAML makes of a bare 1e-6;
    # null stays None until the call resolves it.
    defaults = {(op, p.name): p.default for op in OPS for p in manifest.entry(op).params if not p.required}
    assert type(defaults[("AddFwdOp", "alpha")]) is int
    assert defaults[("FusedAddRMSNormFwdOp", "eps")] == 1e-6
    assert defaults[("RMSNormFwdOp", "eps")] is None
    for op in OPS:
        for p in manifest.entry(op).params:
            if "float" in p.type and not p.required and p.default is not None:
                assert isinstance(p.default, (int, float)), (op, p.name, p.default)


def test_entries_are_loaded_once_and_cached() -> None:
    assert manifest.entry("RMSNormFwdOp") is manifest.entry("RMSNormFwdOp")
    assert manifest.all_entries()["GemmFwdOp"] is manifest.entry("GemmFwdOp")
    assert manifest.all_entries() is not manifest.all_entries()  # callers get their own dict


def test_an_unknown_op_name_raises_a_lookup_error_listing_the_known_names() -> None:
    with pytest.raises(LookupError) as info:
        manifest.entry("GemmOp")
    text = str(info.value)
    assert "'GemmOp'" in text and "GemmFwdOp" in text and "RMSNormFwdOp" in text
    assert isinstance(info.value, KeyError)


def test_importing_the_manifest_module_reads_no_file() -> None:
    code = (
        "import sys, tileops.manifest as m\n"
        "assert m._by_file == {} and m._entries is None, 'loaded at import'\n"
        "assert 'tileops.manifest._load' not in sys.modules and 'yaml' not in sys.modules\n"
        "m.entry('RMSNormFwdOp')\n"  # parses the one file that declares it
        "assert [p.name for p in m._by_file] == ['normalization.yaml'], list(m._by_file)\n"
        "assert m._entries is None\n"
        "m.all_entries()\n"
        "assert m._entries is not None\n"
        "assert len(m._by_file) == len(list(m.manifest_dir().glob('*.yaml')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


def test_the_shipped_folder_loads_through_the_private_loader_too() -> None:
    entries = _load_from([manifest.manifest_dir()])
    assert sorted(entries) == OPS
    assert entries["RMSNormFwdOp"] is not manifest.entry("RMSNormFwdOp")  # no cache involved


# --- the index: names and modules from a text scan ----------------------------------------


def test_the_scan_reads_every_shipped_manifest_and_agrees_with_its_parse() -> None:
    # Every shipped file in the plain form, so that `import tileops.ops` parses none.
    for path in sorted(manifest.manifest_dir().glob("*.yaml")):
        scanned = _index.scan(path)
        assert scanned is not None, f"{path.name} is not in the form the index scan reads"
        parsed = _load_from([path])
        _index.check_against(scanned, {name: e.modules for name, e in parsed.items()})
    assert list(manifest.index()) == list(manifest.all_entries())
    for name, declared in manifest.index().items():
        assert declared.modules == manifest.entry(name).modules
        assert declared.source == manifest.entry(name).source


PLAIN = """\
# a comment
FirstOp:   # one more
  family: norm
  module: tileops.ops.norm.first
  doc: "module: not this one"
  upstream:
    module: tileops.ops.nested.is_not_read
SecondOp:
    module: [tileops.ops.a.second, tileops.ops.b]  # indented by four
    family: norm
"""


def test_the_scan_reads_names_and_modules_in_the_plain_form(tmp_path: Path) -> None:
    path = _write(tmp_path, PLAIN)
    assert _index.scan(path) == [
        manifest.Declared("FirstOp", path, ("tileops.ops.norm.first",)),
        manifest.Declared("SecondOp", path, ("tileops.ops.a.second", "tileops.ops.b")),
    ]


@pytest.mark.parametrize(
    "text",
    [
        '"QuotedOp":\n  module: tileops.ops.x\n',  # a quoted name
        "BlockOp:\n  module:\n    - tileops.ops.x\n",  # module: as a block list
        "MergedOp:\n  <<: *base\n",  # module: through a merge key (none written)
        "---\nDocOp:\n  module: tileops.ops.x\n",  # a document marker
        "FlowOp: {module: tileops.ops.x}\n",  # an entry as a flow mapping
        "AnchorOp: &a\n  module: tileops.ops.x\n",  # an anchor on the entry
        "QuotedModuleOp:\n  module: 'tileops.ops.x'\n",  # a quoted module
        "SplitOp:\n  module: [tileops.ops.x,\n    tileops.ops.y]\n",  # a list on two lines
        "TwiceOp:\n  module: tileops.ops.x\n  module: tileops.ops.y\n",  # module: twice
        "OutsideOp:\n  module: os.path\n",  # not under tileops.ops: the parse says why
        "SameOp:\n  module: tileops.ops.x\nSameOp:\n  module: tileops.ops.x\n",  # a name twice
        "  module: tileops.ops.x\n",  # indented before any name
        "",  # no entry
    ],
)
def test_the_scan_leaves_any_other_form_to_the_parse(tmp_path: Path, text: str) -> None:
    assert _index.scan(_write(tmp_path, text)) is None


def test_a_parse_that_disagrees_with_the_scan_is_a_manifest_error(tmp_path: Path) -> None:
    scanned = _index.scan(_write(tmp_path, PLAIN))
    assert scanned is not None
    both = {
        "FirstOp": ("tileops.ops.norm.first",),
        "SecondOp": ("tileops.ops.a.second", "tileops.ops.b"),
    }
    _index.check_against(scanned, both)
    with pytest.raises(ManifestError, match="text scan"):
        _index.check_against(scanned, {"FirstOp": ("tileops.ops.norm.first",)})
    with pytest.raises(ManifestError, match="text scan"):
        _index.check_against(scanned, {"FirstOp": ("tileops.ops.other",), "SecondOp": ("tileops.ops.b",)})


def test_the_index_refuses_an_op_declared_in_two_files(tmp_path: Path) -> None:
    one = _index.scan(_write(tmp_path, PLAIN, "one.yaml"))
    two = _index.scan(_write(tmp_path, "FirstOp:\n  module: tileops.ops.y\n", "two.yaml"))
    assert one is not None and two is not None
    with pytest.raises(ManifestError, match="also declared in"):
        _index.merge([one, two])


# --- malformed manifests ----------------------------------------------------------------

TOY = {
    "ToyOp": {
        "family": "norm",
        "module": "tileops.ops.toy",
        "ref_api": "torch.nn.functional.rms_norm",
        "signature": {
            "inputs": {"x": {"dtype": "float16 | bfloat16"}, "weight": {"dtype": "same_as(x)"}},
            "outputs": {"output": {"dtype": "same_as(x)", "shape": "x.shape"}},
            "params": {"eps": {"type": "float", "default": 1e-6}},
            "shape_rules": ["weight.shape == (x.shape[-1],)"],
        },
        "roofline": {"flops": "x.numel", "bytes": "2 * x.numel * eb"},
        "kernel_map": {"toy": "ToyKernel"},
        "workloads": [{"name": "w", "x": [4, 8], "weight": [8], "dtypes": ["float16"]}],
    }
}


def _write(tmp_path: Path, data: object, name: str = "toy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


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
    path = _write(tmp_path, _mutate(keys, value))
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
    entries = _load_from([_write(tmp_path, TOY)])
    assert entries["ToyOp"].params[0].default == 1e-6


def test_an_output_of_a_fixed_dtype_keeps_it_whatever_the_inputs_dtype(tmp_path: Path) -> None:
    data = copy.deepcopy(TOY)
    data["ToyOp"]["signature"]["outputs"] = {
        "output": {"dtype": "same_as(x)", "shape": "x.shape"},
        "ids": {"dtype": "int32", "shape": "(x.shape[0], 2)"},
        "scores": {"dtype": "float32", "shape": "x.shape[:1]"},
    }
    entry = _load_from([_write(tmp_path, data)])["ToyOp"]
    assert [(o.dtype_from, o.dtype) for o in entry.outputs] == [
        ("x", None),
        (None, torch.int32),
        (None, F32),
    ]
    for dtype in (F16, BF16):
        meta = entry.output_meta(specs(entry, {"x": (4, 8), "weight": (8,)}, dtype), {"eps": 1e-6})
        assert meta == [(dtype, (4, 8)), (torch.int32, (4, 2)), (F32, (4,))]


def test_yaml_that_does_not_parse_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "ToyOp: {family: norm\n  ref_api: [\n")
    with pytest.raises(ManifestError, match="YAML does not parse") as info:
        _load_from([path])
    assert str(path) in str(info.value)


def test_a_key_written_twice_is_an_error_not_a_silent_overwrite(tmp_path: Path) -> None:
    text = yaml.safe_dump(TOY, sort_keys=False)
    text = text.replace("  family: norm\n", "  family: norm\n  family: gemm\n")
    with pytest.raises(ManifestError, match="duplicate key 'family'"):
        _load_from([_write(tmp_path, text)])


def test_an_op_declared_in_two_files_is_an_error_naming_both(tmp_path: Path) -> None:
    first = _write(tmp_path, TOY, "a.yaml")
    second = _write(tmp_path, TOY, "b.yaml")
    with pytest.raises(ManifestError) as info:
        _load_from([tmp_path])
    assert str(first) in str(info.value) and str(second) in str(info.value)


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


# --- check_inputs -----------------------------------------------------------------------


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
    e = _load_from([_write(tmp_path, data)])["ToyOp"]
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


# --- roofline ---------------------------------------------------------------------------


def _roof(op: str, name: str, dtype: torch.dtype, **override: object) -> tuple[int, int]:
    e = manifest.entry(op)
    shapes, params = workload(e, name, dtype)
    params = e.init_params({**params, **override})
    return e.roofline(specs(e, shapes, dtype), params)


def test_roofline_of_norm_workloads_follows_the_table() -> None:
    M, N = 2048, 4096
    assert _roof("RMSNormFwdOp", "llama-8b-prefill", F16) == (4 * M * N, (2 * M * N + N) * 2)
    assert _roof("FusedAddRMSNormFwdOp", "llama-8b-prefill", BF16) == (
        5 * M * N,
        (4 * M * N + N) * 2,
    )
    assert _roof("LayerNormFwdOp", "llama-8b-prefill", F16) == (5 * M * N, (2 * M * N + 2 * N) * 2)
    n, c, s = 8, 128, 32 * 32
    assert _roof("GroupNormFwdOp", "image-g32-affine", F16) == (
        5 * n * c * s,
        (2 * n * c * s + 2 * c) * 2,
    )
    assert _roof("GroupNormFwdOp", "image-g32", BF16) == (3 * n * c * s, 2 * n * c * s * 2)


def test_roofline_of_reductions_follows_the_table() -> None:
    M, N = 32 * 32, 4096
    assert _roof("SoftmaxFwdOp", "attn-weights-4k", F32) == (5 * M * N, 2 * M * N * 4)
    assert _roof("LogSoftmaxFwdOp", "attn-weights-4k", F16, dim=None) == (  # legacy: dim 0
        5 * 32 * 32 * 4096,
        2 * 32 * 32 * 4096 * 2,
    )
    M, N = 128, 4 * 4096
    assert _roof("SumFwdOp", "batch-and-hidden", F16) == (M * N, (M * N + M) * 2)
    assert _roof("MeanFwdOp", "batch-and-hidden", F16) == (M * (N + 1), (M * N + M) * 2)
    assert _roof("AmaxFwdOp", "hidden-all", BF16) == (2048 * 4096, (2048 * 4096 + 1) * 2)


def test_roofline_of_gemm_and_bmm_workloads_follows_the_table() -> None:
    m, n, k = 4096, 4096, 7168
    assert _roof("GemmFwdOp", "ds-v3-prefill-attn-proj", BF16) == (
        2 * m * n * k,
        (m * k + n * k + m * n) * 2,
    )
    m, n, k = 128, 2112, 7168
    assert _roof("GemmFwdOp", "ds-v3-decode-gate-up", BF16) == (
        2 * m * n * k,
        (m * k + n * k + m * n) * 2,
    )
    b, m, n, k = 64, 128, 2048, 128
    assert _roof("BmmFwdOp", "mha-decode-qk", F16) == (
        2 * b * m * n * k,
        b * (m * k + n * k + m * n) * 2,
    )


def test_roofline_of_elementwise_workloads_follows_the_table() -> None:
    total = 16 * 256 * 56 * 56
    assert _roof("AddFwdOp", "conv-bias-broadcast", F16) == (
        2 * total,
        (total + 256) * 2 + total * 2,
    )
    assert _roof("MulFwdOp", "conv-bias-broadcast", BF16) == (total, (total + 256 + total) * 2)
    n = 4096 * 4096
    assert _roof("ClampFwdOp", "square-4k-min-only", F32) == (n, 3 * n * 4)
    assert _roof("ClampFwdOp", "square-4k-both", F16) == (n, 4 * n * 2)
    n = 2048 * 14336
    assert _roof("SiluFwdOp", "llama-8b-mlp-prefill", F16) == (5 * n, 2 * n * 2)
    assert _roof("GeluFwdOp", "llama-8b-mlp-prefill", F16) == (5 * n, 2 * n * 2)
    assert _roof("ReluFwdOp", "hidden-prefill", F16) == (2048 * 4096, 2 * 2048 * 4096 * 2)
    M, N = 2048, 14336
    assert _roof("SiluAndMulFwdOp", "llama-8b-mlp-prefill", BF16) == (6 * M * N, 3 * M * N * 2)


def test_roofline_of_rope_and_attention_workloads_follows_the_table() -> None:
    x = 2 * 32 * 2048 * 128
    assert _roof("RopeNeoxFwdOp", "b2-seq2k-h32-d128-2d", F16) == (
        4 * x,
        (2 * x + 2048 * 64 * 2) * 2,
    )
    x = 4096 * 128
    assert _roof("RopeNeoxFwdOp", "seq4k-d128-1d", BF16) == (4 * x, (2 * x + 4096 * 64 * 2) * 2)
    B, S, H, D, Hkv = 4, 512, 32, 128, 8
    flops = 4 * B * H * S * S * D
    nbytes = 2 * (B * S * H * D + B * S * Hkv * D) * 2
    assert _roof("GroupedQueryAttentionFwdOp", "llama-8b-short", F16) == (flops // 2, nbytes)
    assert _roof("GroupedQueryAttentionFwdOp", "llama-8b-short", F16, is_causal=False) == (
        flops,
        nbytes,
    )
    B, H, D, N, Hkv = 32, 32, 128, 4096, 8
    assert _roof("GroupedQueryAttentionDecodeWithKVCacheFwdOp", "llama-8b-4k", BF16) == (
        4 * B * H * N * D,
        (2 * B * H * D + 2 * B * N * Hkv * D) * 2,
    )


# --- workloads --------------------------------------------------------------------------


def test_every_op_has_workloads_and_full_cases_are_as_written() -> None:
    e = manifest.entry("GroupedQueryAttentionDecodeWithKVCacheFwdOp")
    shapes, params = workload(e, "qwen3-30b-a3b-bs1-kv256k", F16)
    assert shapes == {"q": (1, 32, 128), "k": (1, 262144, 4, 128), "v": (1, 262144, 4, 128)}
    assert params == {}
    c = manifest.entry("ClampFwdOp")
    assert workload(c, "square-4k-max-only", F32)[0]["min"] is None
    for e in manifest.all_entries().values():
        full = e.workload_cases("full")
        assert full, e.name
        assert len(full) == sum(len(w["dtypes"]) for w in e.workloads)


@pytest.mark.parametrize("op", OPS)
def test_cpu_workload_cases_satisfy_the_rules_and_the_size_budget(op: str) -> None:
    e = manifest.entry(op)
    cases = e.workload_cases("cpu")
    assert cases
    for name, shapes, params, dtype in cases:
        assert e.init_params(params) == params
        assert _largest_checked_tensor(e, shapes, params, dtype) <= 1 << 21, (name, shapes)


def _largest_checked_tensor(e, shapes: dict, params: dict, dtype) -> int:
    """The elements of a case's largest input or output, after checking its inputs
    against the entry's rules (which raise where the case breaks one)."""
    s = specs(e, shapes, dtype)
    e.check_inputs(s, params)
    sizes = [math.prod(v) for v in shapes.values() if v is not None]
    return max(sizes + [math.prod(shape) for _, shape in e.output_meta(s, params)])


def test_small_workload_cases_satisfy_the_rules_and_are_a_fraction_of_the_cpu_ones() -> None:
    largest = _largest_checked_tensor
    total = {"cpu": 0, "small": 0}
    for op in OPS:
        e = manifest.entry(op)
        cpu = {(n, d): largest(e, s, p, d) for n, s, p, d in e.workload_cases("cpu")}
        for name, shapes, params, dtype in e.workload_cases("small"):
            assert e.init_params(params) == params
            size = largest(e, shapes, params, dtype)
            assert size <= cpu[name, dtype], (op, name, shapes)
            total["small"] += size
            total["cpu"] += cpu[name, dtype]
    assert total["small"] * 4 <= total["cpu"], total


def test_cpu_scaling_keeps_divisibility_and_the_links_between_dims() -> None:
    bmm = {n: s for n, s, _, _ in manifest.entry("BmmFwdOp").workload_cases("cpu")}
    assert bmm["square-4k-b4"]["a"][2] % 16 == 0
    rms = {n: (s, p) for n, s, p, _ in manifest.entry("RMSNormFwdOp").workload_cases("cpu")}
    shapes, params = rms["llama-405b-prefill"]
    assert shapes["x"][-1] == shapes["weight"][0] == params["normalized_shape"][0] == 16384
    gqa = {n: s for n, s, _, _ in manifest.entry("GroupedQueryAttentionFwdOp").workload_cases("cpu")}
    q, k = gqa["llama-70b-long"]["q"], gqa["llama-70b-long"]["k"]
    assert (q[2], k[2], q[3]) == (64, 8, 128) and q[1] == k[1] < 2048


def test_workload_cases_rejects_an_unknown_scale() -> None:
    with pytest.raises(ValueError, match="'cpu', 'small', 'tiny' or 'full'"):
        manifest.entry("ReluFwdOp").workload_cases("gpu")


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


# --- references -------------------------------------------------------------------------


def test_tolerances_are_tightest_for_float32_and_exact_for_integers() -> None:
    assert tolerance(torch.int32) == (0.0, 0.0) and tolerance(torch.bool) == (0.0, 0.0)
    f32, f16, bf16 = tolerance(F32), tolerance(F16), tolerance(BF16)
    assert f32 < f16 and f16[0] <= bf16[0] and f16[1] <= bf16[1]
    with pytest.raises(ValueError):
        tolerance(torch.float64)


def test_reference_for_an_unknown_op_is_a_lookup_error() -> None:
    with pytest.raises(LookupError, match="NoSuchOp"):
        reference("NoSuchOp")


def test_references_compute_in_float32_and_return_the_input_dtype() -> None:
    x = torch.randn(4, 64).to(BF16)
    w = torch.randn(64).to(BF16)
    out = reference("RMSNormFwdOp")(x, w, normalized_shape=(64,), eps=1e-6)
    xf = x.float()
    expected = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    assert out.dtype == BF16
    assert torch.equal(out, expected.to(BF16))


def test_fused_add_rmsnorm_reference_normalises_the_sum_and_returns_it() -> None:
    x, r, w = (torch.randn(3, 32, dtype=F32) for _ in range(3))
    w = w[0]
    out, res = reference("FusedAddRMSNormFwdOp")(x, r, w, eps=1e-6)
    assert torch.equal(res, x + r)
    rtol, atol = tolerance(F32)
    torch.testing.assert_close(out, torch.nn.functional.rms_norm(x + r, (32,), w, 1e-6), rtol=rtol, atol=atol)


def test_gemm_reference_applies_the_transpose_flags() -> None:
    a, b = torch.randn(8, 4), torch.randn(6, 8)
    out = reference("GemmFwdOp")(a, b, trans_a=True, trans_b=True)
    torch.testing.assert_close(out, a.T @ b.T)


def test_silu_and_mul_reference_gates_with_the_first_half() -> None:
    x = torch.randn(3, 8)
    torch.testing.assert_close(reference("SiluAndMulFwdOp")(x), torch.nn.functional.silu(x[:, :4]) * x[:, 4:])


def test_inplace_activation_references_write_their_input() -> None:
    x = torch.randn(5)
    expected = torch.relu(x)
    out = reference("ReluFwdOp")(x, inplace=True)
    assert out is x and torch.equal(x, expected)
    y = torch.randn(5)
    before = y.clone()
    reference("SiluFwdOp")(y, inplace=False)
    assert torch.equal(y, before)


def test_rope_reference_is_the_identity_at_position_zero_and_keeps_pair_norms() -> None:
    x = torch.randn(6, 16)
    y = reference("RopeNeoxFwdOp")(x, layout="1d", base=10000.0)
    assert torch.equal(y[0], x[0])

    def pair_norms(t: torch.Tensor) -> torch.Tensor:
        return t[..., :8] ** 2 + t[..., 8:] ** 2

    torch.testing.assert_close(pair_norms(y), pair_norms(x))
    x2 = x.view(1, 6, 1, 16)
    assert torch.equal(reference("RopeNeoxFwdOp")(x2, layout="2d", base=10000.0).view(6, 16), y)


def test_rope_position_ids_reference_agrees_with_rope_at_the_same_positions() -> None:
    x = torch.randn(6, 2, 16)
    ref = reference("RopeNeoxPositionIdsFwdOp")
    pos = torch.arange(6, dtype=torch.int64)
    y = ref(x, pos, max_position=64, base=10000.0, rotary_dim=16)
    for h in range(2):
        assert torch.equal(y[:, h], reference("RopeNeoxFwdOp")(x[:, h], layout="1d", base=10000.0))
    # Partial rotary: the tail passes through; tokens in any order use their own position.
    shuffled = torch.tensor([5, 0, 3, 3, 1, 2], dtype=torch.int32)
    z = ref(x, shuffled, max_position=64, base=10000.0, rotary_dim=8)
    assert torch.equal(z[..., 8:], x[..., 8:])
    assert torch.equal(z[1, :, :8], x[1, :, :8])  # position 0
    alone = ref(x[2:3], torch.tensor([3]), max_position=64, base=10000.0, rotary_dim=8)
    assert torch.equal(z[2], alone[0])
    with pytest.raises(ValueError, match="position_ids"):
        ref(x, pos + 60, max_position=64, base=10000.0, rotary_dim=8)


def test_gqa_decode_reference_agrees_with_sdpa_on_one_query() -> None:
    q, k, v = torch.randn(2, 8, 16), torch.randn(2, 5, 2, 16), torch.randn(2, 5, 2, 16)
    out = reference("GroupedQueryAttentionDecodeWithKVCacheFwdOp")(q, k, v)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None], k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True
    )[:, :, 0]
    torch.testing.assert_close(out, expected)


def test_gqa_references_written_out_softcap_path_matches_sdpa_when_the_cap_is_huge() -> None:
    q, k, v = torch.randn(1, 6, 4, 8), torch.randn(1, 6, 2, 8), torch.randn(1, 6, 2, 8)
    ref = reference("GroupedQueryAttentionFwdOp")
    for causal in (True, False):
        torch.testing.assert_close(
            ref(q, k, v, is_causal=causal, softcap=1e9),
            ref(q, k, v, is_causal=causal),
            rtol=1e-5,
            atol=1e-5,
        )
    capped = ref(q, k, v, is_causal=True, softcap=0.01)
    assert not torch.allclose(capped, ref(q, k, v, is_causal=True))


def test_value_rules_parse_into_checks_whose_scalars_come_from_shapes_and_params(tmp_path: Path) -> None:
    data = copy.deepcopy(TOY)
    sig = data["ToyOp"]["signature"]
    sig["inputs"]["cu"] = {"dtype": "int32"}
    sig["params"]["limit"] = {"type": "int", "default": 3}
    sig["value_rules"] = ["offsets(cu, x.shape[0] * 2 - 1)", "spans_at_most(cu, limit // 2)"]
    data["ToyOp"]["workloads"][0]["cu"] = [3]
    (entry,) = _load_from([_write(tmp_path, data)]).values()
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
        _load_from([_write(tmp_path, data)])
