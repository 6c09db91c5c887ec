"""Loading the shipped manifests (once, lazily, from their folder) and the index: op names
and modules from a text scan that `import tileops.ops` makes instead of a parse."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tileops import manifest
from tileops.manifest import ManifestError, _index, _load_from

from ._common import OPS, write

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
    path = write(tmp_path, PLAIN)
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
    assert _index.scan(write(tmp_path, text)) is None


def test_a_parse_that_disagrees_with_the_scan_is_a_manifest_error(tmp_path: Path) -> None:
    scanned = _index.scan(write(tmp_path, PLAIN))
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
    one = _index.scan(write(tmp_path, PLAIN, "one.yaml"))
    two = _index.scan(write(tmp_path, "FirstOp:\n  module: tileops.ops.y\n", "two.yaml"))
    assert one is not None and two is not None
    with pytest.raises(ManifestError, match="also declared in"):
        _index.merge([one, two])
