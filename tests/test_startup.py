"""Start-up: ``import tileops.ops`` parses no manifest and makes no op; each op is made,
with its custom op, the first time anything asks for it, by whichever way it is asked.

Each test runs a fresh interpreter, since what a process has imported and made is the
subject. No test here measures a time (benchmarks/startup.py does).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

from tileops import manifest


def run(code: str, *, timeout: int = 120) -> str:
    """Runs ``code`` in a fresh interpreter; its stdout (it must exit 0)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_importing_tileops_ops_parses_no_manifest_and_makes_no_op():
    out = run(
        """
        import json, sys, torch
        import tileops.ops
        import tileops.manifest as m
        from tileops.ops import _catalog
        print(json.dumps({
            "heavy": sorted(
                name for name in ("yaml", "tileops.manifest._load", "tileops.manifest._entry",
                                  "tileops.ops.op", "tileops.ops._runtime")
                if name in sys.modules
            ),
            "parsed": [p.name for p in m._by_file],
            "made": list(_catalog._built),
            "ops modules": sorted(
                n for n in sys.modules if n.startswith("tileops.ops.")
                and n not in ("tileops.ops._catalog", "tileops.ops._library")
            ),
            "registered": [
                name for name in ("rms_norm_fwd", "softmax_fwd", "silu_fwd_")
                if torch._C._jit_get_operation("tileops::" + name)[0] is not None
            ],
            "all": tileops.ops.__all__,
            "dir": dir(tileops.ops),
        }))
        """
    )
    seen = json.loads(out)
    assert seen["heavy"] == [] and seen["parsed"] == [] and seen["made"] == []
    assert seen["ops modules"] == [] and seen["registered"] == []
    names = list(manifest.index())
    assert seen["all"] == [*names, "ALL_OPS", "Op"]
    assert set(names) | {"ALL_OPS", "Op", "norm", "reduction", "gemm"} <= set(seen["dir"])


def test_importing_tileops_stays_off_the_op_layer():
    out = run(
        """
        import sys, tileops
        print(sorted(n for n in sys.modules if n.startswith(("tileops.ops", "tileops.manifest"))))
        """
    )
    assert out.strip() == "[]"


def test_the_first_op_parses_only_its_manifest_file_and_makes_only_its_class():
    out = run(
        """
        import json, torch
        import tileops.manifest as m
        from tileops.ops import RMSNormFwdOp, _catalog
        y = RMSNormFwdOp(normalized_shape=(8,))
        print(json.dumps({
            "parsed": [p.name for p in m._by_file],
            "made": list(_catalog._built),
            "custom op": str(RMSNormFwdOp._custom_op),
        }))
        """
    )
    seen = json.loads(out)
    assert seen["parsed"] == ["normalization.yaml"]
    assert seen["made"] == ["RMSNormFwdOp"]
    assert seen["custom op"] == "tileops.rms_norm_fwd.default"


def test_every_op_is_reachable_at_each_of_its_modules_before_anything_else_made_it():
    # One fresh interpreter per op would be slow; each op is asked for at a module its entry
    # names first (a hand-written module without the lazy hook fails here), then everywhere.
    paths = {name: [*declared.modules] for name, declared in manifest.index().items()}
    out = run(
        f"""
        import importlib, json
        import tileops.ops
        paths = {paths!r}
        found = {{}}
        for name, modules in reversed(list(paths.items())):
            module = importlib.import_module(modules[-1])
            assert name in dir(module), (modules[-1], name)
            cls = getattr(module, name)
            for path in modules:
                while path != "tileops.ops":
                    module = importlib.import_module(path)
                    assert name in dir(module), (path, name)
                    assert getattr(module, name) is cls, (path, name)
                    path = path.rpartition(".")[0]
            assert getattr(tileops.ops, name) is cls
            found[name] = cls.__module__
        assert [c.__name__ for c in tileops.ops.ALL_OPS] == list(paths)
        print(json.dumps(found))
        """
    )
    found = json.loads(out)
    assert found == {name: modules[0] for name, modules in paths.items()}


def test_a_generated_module_imports_on_its_own_and_lists_its_ops():
    out = run(
        """
        import json
        import tileops.ops.reduction.softmax as softmax
        from tileops.ops.gemm import GemmOp, bmm
        print(json.dumps({
            "dir": [n for n in dir(softmax) if n.endswith("Op")],
            "path": softmax.__path__,
            "made": softmax.SoftmaxFwdOp.__module__,
            "gemm": [GemmOp.__name__, [n for n in dir(bmm) if n.endswith("Op")]],
        }))
        """
    )
    seen = json.loads(out)
    assert seen["dir"] == ["LogSoftmaxFwdOp", "SoftmaxFwdOp"]
    assert seen["path"] == [] and seen["made"] == "tileops.ops.reduction.softmax"
    assert seen["gemm"] == ["GemmFwdOp", ["BmmFwdOp"]]


def test_every_custom_op_resolves_by_name_after_importing_tileops_ops_only():
    out = run(
        """
        import json, torch
        import tileops.ops
        from tileops.ops import _library
        names = {}
        for name in tileops.ops.__all__[:-2]:
            schema = _library.schema_name(name)
            packet = getattr(torch.ops.tileops, schema)
            names[name] = str(packet.default)
        inplace = str(torch.ops.tileops.silu_fwd_.default)  # the in-place form of an op
        try:
            torch.ops.tileops.no_such_op
        except AttributeError:
            missing = "AttributeError"
        print(json.dumps({"names": names, "inplace": inplace, "missing": missing}))
        """
    )
    seen = json.loads(out)
    assert seen["inplace"] == "tileops.silu_fwd_.default"
    assert seen["missing"] == "AttributeError"
    assert set(seen["names"]) == set(manifest.index())
    assert all(text.startswith("tileops.") for text in seen["names"].values())


def test_a_namespace_looked_up_before_the_import_still_makes_ops_by_name():
    out = run(
        """
        import torch
        namespace = torch.ops.tileops  # before tileops.ops is imported
        import tileops.ops
        assert torch.ops.tileops is namespace
        print(torch.ops.tileops.layer_norm_fwd.default)
        """
    )
    assert out.strip() == "tileops.layer_norm_fwd.default"


def test_a_saved_export_loads_in_a_process_that_only_imported_tileops_ops(tmp_path):
    saved = tmp_path / "rms_norm.pt2"
    run(
        f"""
        import torch
        from tileops.ops import RMSNormFwdOp
        from tileops.testing.fakes import RecordingTarget

        RecordingTarget("fake_cpu", "cpu", ops=("RMSNormFwdOp",)).register()
        op = RMSNormFwdOp(normalized_shape=(8,))

        class Model(torch.nn.Module):
            def forward(self, x, w):
                return op(x, w)

        x, w = torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(8, dtype=torch.bfloat16)
        torch.export.save(torch.export.export(Model(), (x, w)), {str(saved)!r})
        """
    )
    out = run(
        f"""
        import torch
        import tileops.ops
        program = torch.export.load({str(saved)!r})
        print([str(n.target) for n in program.graph.nodes if n.op == "call_function"])
        """
    )
    assert out.strip() == "['tileops.rms_norm_fwd.default']"


def test_threads_asking_for_ops_at_once_get_one_class_each():
    out = run(
        """
        import random, threading
        import tileops.ops
        names = tileops.ops.__all__[:-2]
        seen, errors = [], []
        barrier = threading.Barrier(6)

        def ask(seed):
            order = list(names)
            random.Random(seed).shuffle(order)
            barrier.wait()
            try:
                seen.append({name: getattr(tileops.ops, name) for name in order})
            except BaseException as error:
                errors.append(repr(error))

        threads = [threading.Thread(target=ask, args=(seed,)) for seed in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert all(s == seen[0] for s in seen) and len(seen) == 6
        print(len(seen[0]))
        """,
        timeout=300,
    )
    assert int(out) == len(manifest.index())


def test_a_manifest_the_scan_cannot_read_is_parsed_at_import(tmp_path):
    # The same ops, one file rewritten with a quoted op name: the scan leaves that file to
    # the parse (at import), the others stay unparsed, and every op still works.
    folder = tmp_path / "manifests"
    shutil.copytree(manifest.manifest_dir(), folder, ignore=shutil.ignore_patterns("*.py*", "__pycache__"))
    gemm = folder / "gemm.yaml"
    gemm.write_text(gemm.read_text().replace("\nGemmFwdOp:", '\n"GemmFwdOp":'))
    out = run(
        f"""
        import json
        from pathlib import Path
        import tileops.manifest as m
        m._DIR = Path({str(folder)!r})
        import tileops.ops
        parsed = [p.name for p in m._by_file]
        from tileops.ops import GemmFwdOp, RMSNormFwdOp
        print(json.dumps({{"at import": parsed, "ops": len(tileops.ops.ALL_OPS)}}))
        """
    )
    seen = json.loads(out)
    assert seen == {"at import": ["gemm.yaml"], "ops": len(manifest.index())}


def test_a_hand_written_module_without_the_lazy_hook_is_named_when_its_op_is_made():
    out = run(
        """
        import sys, types
        import tileops.ops
        from tileops.ops import _catalog

        plain = types.ModuleType("tileops.ops.plain")  # a file without the hook
        sys.modules["tileops.ops.plain"] = plain
        cls = tileops.ops.SoftmaxFwdOp
        try:
            _catalog._export(cls, "tileops.ops.plain")
        except ImportError as error:
            print(error)
        """
    )
    assert "tileops.ops.plain" in out and "lazy_members(__name__)" in out


def test_the_manifest_module_exports_its_classes_on_first_use():
    out = run(
        """
        import sys
        import tileops.manifest as m
        assert "tileops.manifest._entry" not in sys.modules
        print(m.OpEntry.__module__, m.Upstream.__module__, "OpEntry" in dir(m))
        """
    )
    assert out.split() == ["tileops.manifest._entry", "tileops.manifest._upstream", "True"]
