"""The op list is the manifests: one op class per entry, at the module its entry names.

An entry's ``module:`` says where its class lives (``tileops.ops.norm.rms_norm``), and
optionally older paths that keep importing it. Where that module is a file of this
package and defines the class, the class is the file's: it adds behaviour of its own
(several kernel roles, constructor-only arguments, in-place returns). Every other op
class is generated here from its entry, and a module that has no file is created, so a
new op that adds no behaviour is one manifest entry and nothing else.

Each op is also exported from every package between its modules and ``tileops.ops``
(``tileops.ops.gemm.GemmFwdOp`` as well as ``tileops.ops.gemm.gemm.GemmFwdOp``).

Nothing is made at import. ``import tileops.ops`` reads only the manifest index (names
and modules, ``manifest.index()``, a text scan), because parsing every manifest, making
every class and registering every custom op would cost each process (a CLI call, every
worker of a serving engine) far more than the ops it uses. An op class is made the first
time anything asks for it, and every way of asking leads to ``op_class``:

* an attribute of ``tileops.ops`` or of a module its entry names (module ``__getattr__``,
  PEP 562; ``from tileops.ops import X`` is one), ``dir()`` lists it before;
* ``tileops.ops.ALL_OPS`` (all of them, in manifest order);
* its custom op by name, ``torch.ops.tileops.<name>`` (what loading a saved
  ``torch.export`` program does), through the ``tileops`` op namespace installed here.

Making a class parses its manifest file and registers its torch.library custom op
(``Op.__init_subclass__``), so a tracer never meets an op whose custom op is missing.
Modules that no file holds are made on import by a finder at the end of
``sys.meta_path`` (a file always wins); a hand-written module on an op's path (a package
above it, or a home module that leaves some of its ops generated) declares
``__getattr__, __dir__ = _catalog.lazy_members(__name__)``, and making an op that such a
module lacks this for is an ImportError that says so.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import threading
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from .. import manifest
from . import _library

if TYPE_CHECKING:
    from .op import Op

_PACKAGE = __name__.rpartition(".")[0]  # tileops.ops


class _Layout:
    """Which op names and child modules each module on an op's path holds, and which op
    each custom-op name belongs to: the manifest index, rearranged once."""

    def __init__(self, index: Mapping[str, manifest.Declared]) -> None:
        self.exports: dict[str, dict[str, None]] = {_PACKAGE: dict.fromkeys(index)}
        self.children: dict[str, dict[str, None]] = {}
        self.by_schema: dict[str, str] = {}
        for name, declared in index.items():
            for path in declared.modules:
                while path != _PACKAGE:
                    self.exports.setdefault(path, {})[name] = None
                    parent, _, leaf = path.rpartition(".")
                    self.children.setdefault(parent, {})[leaf] = None
                    path = parent
            schema = _library.schema_name(name)
            self.by_schema.setdefault(schema, name)
            self.by_schema.setdefault(schema + "_", name)  # the in-place form, where one is
        self.modules = frozenset(self.exports) - {_PACKAGE}


_layout_made: _Layout | None = None
_built: dict[str, type[Op]] = {}
_lock = threading.RLock()


def _layout() -> _Layout:
    global _layout_made
    if _layout_made is None:
        _layout_made = _Layout(manifest.index())
    return _layout_made


def op_class(name: str) -> type[Op]:
    """The op class of manifest entry ``name``, made on the first call."""
    cls = _built.get(name)
    if cls is not None:
        return cls
    entry = manifest.entry(name)  # parses the entry's file (under the manifest's own lock)
    from .op import Op  # noqa: F401 - imported before the lock: imports never wait inside it

    # Every module on the op's paths is imported before taking the lock, so a thread
    # holding it never waits on an import that another thread holds.
    for path in entry.modules:
        importlib.import_module(path)
    with _lock:
        cls = _built.get(name)
        if cls is None:
            cls = _make(entry)
            for path in entry.modules:
                _export(cls, path)
            setattr(sys.modules[_PACKAGE], name, cls)
            _built[name] = cls
    return cls


def all_ops() -> tuple[type[Op], ...]:
    """Every op class, in manifest order (files by name, entries as written)."""
    manifest.all_entries()  # every file parsed (and checked) before any class is made
    return tuple(op_class(name) for name in manifest.index())


def _make(entry: manifest.OpEntry) -> type[Op]:
    from .op import Op

    home = entry.modules[0]
    cls = sys.modules[home].__dict__.get(entry.name)
    if cls is None:
        return _generate(entry, home)
    if not (isinstance(cls, type) and issubclass(cls, Op) and cls._entry is entry):
        raise ImportError(
            f"{home}.{entry.name} is not the op class of manifest entry {entry.name} ({entry.source.name}); got {cls!r}"
        )
    return cls


def _generate(entry: manifest.OpEntry, home: str) -> type[Op]:
    from .op import Op

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


def _export(cls: type[Op], path: str) -> None:
    while path != _PACKAGE:
        module = sys.modules[path]
        existing = module.__dict__.get(cls.__name__)
        if existing is not None and existing is not cls:
            raise ImportError(f"{path}.{cls.__name__} is taken by {existing!r}")
        # A module another thread is still executing has not reached its hook yet (the
        # import lock lets a waiter through with the partial module where waiting would
        # deadlock); only a finished module without one is a file to fix.
        initializing = getattr(getattr(module, "__spec__", None), "_initializing", False)
        if existing is None and not _is_lazy(module) and not initializing:
            # Without the hook, the op would be missing from this module until some other
            # path made it: say so the first time the op is made, not on some later import.
            raise ImportError(
                f"{path} holds {cls.__name__} (manifest entry {cls.__name__}'s module:) but "
                f"its file does not declare its members lazily; add "
                f"`__getattr__, __dir__ = _catalog.lazy_members(__name__)` to it"
            )
        setattr(module, cls.__name__, cls)
        path = path.rpartition(".")[0]


def _is_lazy(module: types.ModuleType) -> bool:
    return getattr(module.__dict__.get("__getattr__"), "_tileops_lazy", False)


def member(path: str, name: str) -> Any:
    """Attribute ``name`` of the module at ``path`` that the manifests put there: an op
    class (made now) or a child module (imported now); AttributeError otherwise."""
    layout = _layout()
    if name in layout.exports.get(path, ()):
        return op_class(name)
    if name in layout.children.get(path, ()):
        return importlib.import_module(f"{path}.{name}")
    raise AttributeError(f"module {path!r} has no attribute {name!r}")


def lazy_members(
    path: str, aliases: Mapping[str, str] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module's ``__getattr__`` and ``__dir__`` (PEP 562) for the op classes and child
    modules the manifests put at ``path``; ``aliases``: other names of some of its ops."""
    also = dict(aliases or {})

    def __getattr__(name: str) -> Any:
        value = member(path, also.get(name, name))
        if name in also:
            setattr(sys.modules[path], name, value)
        return value

    def __dir__() -> list[str]:
        layout = _layout()
        names = {*sys.modules[path].__dict__, *also}
        names.update(layout.exports.get(path, ()), layout.children.get(path, ()))
        return sorted(names)

    __getattr__._tileops_lazy = True  # type: ignore[attr-defined]
    return __getattr__, __dir__


class _GeneratedModules:
    """Finder and loader of the modules that manifests name and no file holds. It sits at
    the end of ``sys.meta_path``, so it is asked only where no file answered."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_PACKAGE + ".") or fullname not in _layout().modules:
            return None
        # a package, so deeper generated paths can sit under it
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        module.__doc__ = f"Ops whose manifest entries name {module.__name__} (generated)."
        module.__getattr__, module.__dir__ = lazy_members(module.__name__)  # type: ignore[method-assign]


try:
    from torch._ops import _OpNamespace
except ImportError:  # a torch without it: names resolve once their classes are made
    _OpNamespace = None  # type: ignore[assignment,misc]

if _OpNamespace is not None:

    class _TileopsNamespace(_OpNamespace):  # type: ignore[misc,valid-type]
        """``torch.ops.tileops``: a custom op not registered yet is made on its first lookup
        by name, as loading a saved torch.export program does."""

        # torch names each op after its namespace class's module, and pickles (inductor's
        # caches) find the op again by that name: keep torch's.
        __module__ = _OpNamespace.__module__

        def __getattr__(self, op_name: str) -> Any:
            try:
                return super().__getattr__(op_name)
            except AttributeError:
                owner = _layout().by_schema.get(op_name)
                if owner is None or owner in _built or _library.defining():
                    raise
            op_class(owner)
            return super().__getattr__(op_name)


def install() -> None:
    """What ``import tileops.ops`` sets up: the finder and the ``tileops`` op namespace."""
    _layout()
    if not any(type(f).__qualname__ == "_GeneratedModules" for f in sys.meta_path):
        sys.meta_path.append(_GeneratedModules())
    if _OpNamespace is None:
        return
    current = torch.ops.__dict__.get("tileops")
    if current is None:
        torch.ops.tileops = _TileopsNamespace("tileops")
        dir_list = getattr(torch.ops, "_dir", None)
        if isinstance(dir_list, list):
            dir_list.append("tileops")  # as torch.ops does for a namespace it makes
    elif type(current) is _OpNamespace:  # looked up before tileops.ops was imported
        current.__class__ = _TileopsNamespace
