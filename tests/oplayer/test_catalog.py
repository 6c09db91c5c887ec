"""The manifests are the op list: a class per entry, at the modules the entry names."""

from __future__ import annotations

import importlib
import inspect

import pytest

import tileops.ops
from tileops import manifest
from tileops.ops import ALL_OPS

ENTRIES = manifest.all_entries()


def test_all_ops_is_every_manifest_entry_in_manifest_order():
    assert [cls.__name__ for cls in ALL_OPS] == list(ENTRIES)
    assert sorted(tileops.ops.__all__) == sorted([*ENTRIES, "ALL_OPS", "Op"])


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_each_op_is_importable_from_every_module_its_entry_names_and_their_packages(name):
    cls = getattr(tileops.ops, name)
    home, *older = ENTRIES[name].modules
    assert cls.__module__ == home and cls.__qualname__ == name
    for path in (home, *older):
        while path != "tileops.ops":
            assert getattr(importlib.import_module(path), name) is cls, path
            path = path.rpartition(".")[0]


# Import paths that backends and user code written against upstream use, and the ones
# this project shipped before the manifests named modules.
COMPATIBLE_PATHS = [
    "tileops.ops.gemm.gemm.GemmFwdOp",
    "tileops.ops.gemm.GemmFwdOp",
    "tileops.ops.gemm.bmm.BmmFwdOp",
    "tileops.ops.bmm.BmmFwdOp",
    "tileops.ops.elementwise.arithmetic.AddFwdOp",
    "tileops.ops.elementwise.arithmetic.MulFwdOp",
    "tileops.ops.elementwise.binary.AddFwdOp",
    "tileops.ops.elementwise.clamp.ClampFwdOp",
    "tileops.ops.elementwise.activations.SiluAndMulFwdOp",
    "tileops.ops.norm.rms_norm.RMSNormFwdOp",
    "tileops.ops.norm.fused_add_rms_norm.FusedAddRMSNormFwdOp",
    "tileops.ops.reduction.softmax.SoftmaxFwdOp",
    "tileops.ops.reduction.reduce.SumFwdOp",
    "tileops.ops.rope.RopeNeoxFwdOp",
    "tileops.ops.rope.RopeNeoxPositionIdsFwdOp",
    "tileops.ops.attention.gqa.GroupedQueryAttentionFwdOp",
    "tileops.ops.attention.gqa.GroupedQueryAttentionDecodeWithKVCacheFwdOp",
]


@pytest.mark.parametrize("path", COMPATIBLE_PATHS)
def test_upstream_and_earlier_import_paths_keep_working(path):
    module, _, name = path.rpartition(".")
    assert getattr(importlib.import_module(module), name) is getattr(tileops.ops, name)


def test_upstreams_earlier_gemm_name_is_the_same_class_under_its_manifest_name():
    from tileops.ops.gemm import GemmFwdOp, GemmOp

    assert GemmOp is GemmFwdOp
    assert GemmOp()._entry.name == "GemmFwdOp"


@pytest.mark.parametrize("cls", ALL_OPS, ids=lambda c: c.__name__)
def test_forward_takes_the_manifest_inputs_with_trailing_optional_ones_defaulting_to_none(cls):
    entry = ENTRIES[cls.__name__]
    params = list(inspect.signature(cls.forward).parameters.values())[1:]
    # then upstream's trailing forward arguments, if any (accepted, not needed)
    unused = list(entry.upstream.forward) if entry.upstream else []
    assert [p.name for p in params] == [*entry.input_names(), *unused]
    assert all(p.default is None for p in params[len(entry.inputs) :])
    trailing = [all(d.optional for d in entry.inputs[i:]) for i in range(len(entry.inputs))]
    for decl, p, last in zip(entry.inputs, params, trailing):
        # an optional input defaults to None unless a required one follows it
        assert (p.default is None) if decl.optional and last else (p.default is inspect.Parameter.empty)


@pytest.mark.parametrize("cls", [c for c in ALL_OPS if not c._extra_args], ids=lambda c: c.__name__)
def test_the_constructor_takes_the_manifest_params_then_target_kernel_map_and_tune(cls):
    entry = ENTRIES[cls.__name__]
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    names = [p.name for p in params]
    assert names == [*entry.param_names(), "target", "kernel_map", "tune"]
    by_name = {p.name: p for p in params}
    for decl in entry.params:
        p = by_name[decl.name]
        assert (p.default is inspect.Parameter.empty) == decl.required, decl.name
        if decl.kw_only:
            assert p.kind is inspect.Parameter.KEYWORD_ONLY, decl.name
    for extra in ("target", "kernel_map", "tune"):
        assert by_name[extra].kind is inspect.Parameter.KEYWORD_ONLY


def test_a_generated_op_documents_its_manifest_entry():
    doc = tileops.ops.SoftmaxFwdOp.__doc__
    assert ENTRIES["SoftmaxFwdOp"].doc in doc
    assert "SoftmaxFwdOp(dim=None)" in doc and "op(x)" in doc
    assert "reduction.yaml" in doc and "torch.nn.functional.softmax" in doc
