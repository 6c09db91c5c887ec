"""The op list is the manifests: one op class per entry, at the module its entry names.

An entry's ``module:`` says where its class lives (``tileops.ops.norm.rms_norm``), and
optionally older paths that keep importing it. Where that module is a file of this
package and defines the class, the class is the file's: it adds behaviour of its own
(several kernel roles, constructor-only arguments, in-place returns). Every other op
class is generated here from its entry, and a module that has no file is created, so a
new op that adds no behaviour is one manifest entry and nothing else.

Each op is also exported from every package between its modules and ``tileops.ops``
(``tileops.ops.gemm.GemmFwdOp`` as well as ``tileops.ops.gemm.gemm.GemmFwdOp``).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

from .. import manifest
from .op import Op

_PACKAGE = __name__.rpartition(".")[0]  # tileops.ops


def build() -> dict[str, type[Op]]:
    """Every op class, by name, in manifest order (files by name, entries as written)."""
    ops: dict[str, type[Op]] = {}
    for name, entry in manifest.all_entries().items():
        home, *older = entry.modules
        module = _module(home)
        cls = module.__dict__.get(name)
        if cls is None:
            cls = _generate(entry, home)
        elif not (isinstance(cls, type) and issubclass(cls, Op) and cls._entry is entry):
            raise ImportError(
                f"{home}.{name} is not the op class of manifest entry {name} "
                f"({entry.source.name}); got {cls!r}"
            )
        for path in (home, *older):
            _export(cls, path)
        ops[name] = cls
    return ops


def _generate(entry: manifest.OpEntry, home: str) -> type[Op]:
    namespace = {"__module__": home, "__qualname__": entry.name, "__doc__": _doc(entry)}
    return types.new_class(entry.name, (Op,), exec_body=lambda ns: ns.update(namespace))


def _doc(entry: manifest.OpEntry) -> str:
    params = ", ".join(p.name if p.required else f"{p.name}={p.default!r}" for p in entry.params)
    inputs = ", ".join(f"{i.name}=None" if i.optional else i.name for i in entry.inputs)
    reference = entry.ref_api or "written out in tileops.testing.references"
    lines = [
        entry.doc or entry.name,
        "",
        f"``{entry.name}({params})``, then ``op({inputs})``.",
        f"Declared in manifest/{entry.source.name}; reference: {reference}.",
    ]
    if entry.upstream is not None and entry.upstream.init is not None:
        lines.append(f"Also upstream TileOPs' ``{entry.upstream.form()}``.")
    return "\n".join(lines)


def _module(path: str) -> types.ModuleType:
    """The module at ``path``: imported where a file exists, else created (with parents)."""
    module = sys.modules.get(path)
    if module is not None:
        return module
    parent_path, _, leaf = path.rpartition(".")
    parent = _module(parent_path) if parent_path != _PACKAGE else sys.modules[_PACKAGE]
    if importlib.util.find_spec(path) is not None:
        return importlib.import_module(path)
    module = types.ModuleType(path, f"Ops whose manifest entries name {path} (generated).")
    module.__path__ = []  # a package, so deeper generated paths can sit under it
    module.__package__ = path
    sys.modules[path] = module
    setattr(parent, leaf, module)
    return module


def _export(cls: type[Op], path: str) -> None:
    while path != _PACKAGE:
        module = _module(path)
        existing = module.__dict__.get(cls.__name__)
        if existing is not None and existing is not cls:
            raise ImportError(f"{path}.{cls.__name__} is taken by {existing!r}")
        setattr(module, cls.__name__, cls)
        path = path.rpartition(".")[0]
