"""The import graph of src/tileops: no cycles, and the in-tree kernels stand below dispatch.

Every import statement counts, wherever it is written (module top, inside a function,
under ``if TYPE_CHECKING``): a cycle hidden in a function is still a cycle a reader has
to untangle. ``from package import name`` is an edge to the submodule where ``name`` is
one, else to the package.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import tileops

ROOT = Path(tileops.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _imported(base: str, name: str, modules: dict[str, Path]) -> str:
    """What ``from base import name`` imports: a submodule (.py or compiled) or ``base``."""
    full = f"{base}.{name}"
    if base not in modules or modules[base].name != "__init__.py":
        return base  # a plain module (or outside tileops): ``name`` is an attribute
    if full in modules or importlib.util.find_spec(full) is not None:
        return full  # a compiled submodule (tileops._C) is no node of the graph
    return base


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [_imported(base, alias.name, modules) for alias in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph[todo.pop()] - seen:
            seen.add(w)
            todo.append(w)
    return seen


def test_the_graph_sees_the_imports_it_is_about():
    graph = _graph()
    assert "tileops.ops.op" in graph["tileops.ops._catalog"]
    assert "tileops.manifest" in graph["tileops.ops._catalog"]
    assert "tileops.backend.registry" in graph["tileops.backend.dispatch"]
    assert "tileops.manifest._scale" in graph["tileops.manifest._entry"]  # a local import


def test_the_cycle_finder_finds_a_cycle_through_a_local_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_src_tileops_has_no_import_cycle():
    assert _cycles(_graph()) == []


def test_the_in_tree_kernels_do_not_import_the_dispatch_layer():
    reached = _reachable(_graph(), "tileops.kernels")
    dispatch_layer = {
        "tileops.backend.dispatch",
        "tileops.backend.registry",
        "tileops.backend.discovery",
        "tileops.backend",
    }
    assert not reached & dispatch_layer
    assert not {m for m in reached if m.startswith("tileops.ops")}
