"""Reading manifest YAML: schema checks, expression compilation, workload checks."""

from __future__ import annotations

import keyword
import re
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

import torch
import yaml

from ._entry import InputDecl, OpEntry, OutputDecl, ParamDecl, _Workload
from ._errors import ManifestError
from ._expr import HELPERS, Expr, ExprError, compile_expr
from ._index import OPS_PACKAGE, is_module_path
from ._types import (
    DTYPE_NAMES,
    ParamType,
    TypeSyntaxError,
    parse_dtype,
    parse_dtype_rule,
    parse_param_type,
)
from ._upstream import Upstream
from ._upstream import parse as parse_upstream
from ._values import ValueRule, ValueRuleError, parse_value_rule

_ENTRY_KEYS = {
    "family",
    "module",
    "doc",
    "ref_api",
    "torch_compile_fullgraph",
    "signature",
    "roofline",
    "kernel_map",
    "workloads",
    "upstream",
}
_ENTRY_OPTIONAL = {"torch_compile_fullgraph", "doc", "upstream"}
_SIGNATURE_KEYS = {"inputs", "outputs", "params", "param_rules", "shape_rules", "value_rules"}
_SIGNATURE_OPTIONAL = {"params", "param_rules", "shape_rules", "value_rules"}
_INPUT_KEYS = {"dtype", "optional", "mutated"}
_OUTPUT_KEYS = {"dtype", "shape"}
_PARAM_KEYS = {"type", "default", "resolve", "kw_only"}
_ROOFLINE_KEYS = {"vars", "flops", "bytes"}
_WORKLOAD_KEYS = {"name", "params", "dtypes", "constructor"}  # plus one key per input
_ROOFLINE_RESERVED = {"eb"}
_PARAM_DTYPE = re.compile(r"^param\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)$")  # an output's dtype named by a str param


# libyaml's parser when PyYAML was built with it (several times faster); same semantics.
_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(_SafeLoader):  # type: ignore[misc,valid-type]
    """SafeLoader that refuses a key written twice in one mapping (PyYAML keeps the last)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:
            continue  # unhashable: SafeLoader reports it below
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r}",
                key_node.start_mark,
            )
        seen.add(key)
    return _SafeLoader.construct_mapping(loader, node, deep=True)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


class _Ctx:
    """Where we are, so every error names file, entry and field."""

    def __init__(self, path: Path, entry: str | None = None) -> None:
        self.path = path
        self.entry = entry

    def error(self, field: str | None, problem: str) -> ManifestError:
        return ManifestError(self.path, self.entry, field, problem)

    def mapping(self, value: Any, field: str, *, empty_ok: bool = True) -> dict[Any, Any]:
        if value is None and empty_ok:
            return {}
        if not isinstance(value, dict):
            raise self.error(field, f"expected a mapping, got {value!r}")
        if not value and not empty_ok:
            raise self.error(field, "must not be empty")
        return value

    def keys(
        self,
        value: dict[Any, Any],
        field: str | None,
        known: set[str],
        optional: Collection[str] = (),
    ) -> None:
        for key in value:
            if key not in known:
                raise self.error(field, f"unknown key {key!r}; known keys: {sorted(known)}")
        for key in sorted(known - set(optional)):
            if key not in value:
                raise self.error(field, f"missing key {key!r}")

    def identifier(self, name: Any, field: str | None) -> str:
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise self.error(field, f"{name!r} is not a valid identifier")
        if name.startswith("_"):
            raise self.error(field, f"{name!r}: names starting with '_' are reserved")
        return name

    def binding(self, name: Any, field: str) -> str:
        """An input or param name: an identifier that the roofline's ``eb`` cannot hide."""
        self.identifier(name, field)
        if name in _ROOFLINE_RESERVED:
            raise self.error(field, f"{name!r} is reserved for the roofline")
        return name

    def flag(self, value: Any, field: str) -> bool:
        if not isinstance(value, bool):
            raise self.error(field, f"expected true or false, got {value!r}")
        return value

    def expr(self, source: Any, field: str, allowed: set[str], reported: set[str]) -> Expr:
        try:
            return compile_expr(source, f"{self.path.name}:{self.entry}.{field}", allowed | set(HELPERS), reported)
        except ExprError as exc:
            raise self.error(field, str(exc)) from None

    def expr_list(self, value: Any, field: str, allowed: set[str], reported: set[str]) -> tuple[Expr, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.error(field, f"expected a list of expressions, got {value!r}")
        return tuple(self.expr(src, f"{field}[{i}]", allowed, reported) for i, src in enumerate(value))


def _resolve_ref_api(ctx: _Ctx, value: Any) -> str | None:
    if value == "none":
        return None
    if not isinstance(value, str) or not value.startswith("torch."):
        raise ctx.error("ref_api", f"expected 'none' or a torch.* function path, got {value!r}")
    obj: Any = torch
    for part in value.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            raise ctx.error("ref_api", f"{value!r} does not name anything in torch")
    if not callable(obj):
        raise ctx.error("ref_api", f"{value!r} is not callable")
    return value


def _modules(ctx: _Ctx, value: Any) -> tuple[str, ...]:
    """``module:`` is one dotted path under tileops.ops, or a list of them (the first is
    where the class is defined; the others keep older import paths working)."""
    paths = value if isinstance(value, list) else [value]
    if not paths:
        raise ctx.error("module", "expected a module path or a non-empty list of them")
    for path in paths:
        if not is_module_path(path):
            raise ctx.error("module", f"expected a dotted module path under {OPS_PACKAGE}, got {path!r}")
    if len(set(paths)) != len(paths):
        raise ctx.error("module", f"names a module twice: {paths!r}")
    return tuple(paths)


def _inputs(ctx: _Ctx, raw: Any) -> tuple[InputDecl, ...]:
    field = "signature.inputs"
    decls: list[InputDecl] = []
    for name, spec in ctx.mapping(raw, field, empty_ok=False).items():
        f = f"{field}.{name}"
        ctx.binding(name, f)
        spec = ctx.mapping(spec, f)
        ctx.keys(spec, f, _INPUT_KEYS, {"optional", "mutated"})
        try:
            dtypes, same_as = parse_dtype_rule(spec["dtype"])
        except TypeSyntaxError as exc:
            raise ctx.error(f"{f}.dtype", str(exc)) from None
        optional = ctx.flag(spec.get("optional", False), f"{f}.optional")
        mutated = ctx.flag(spec.get("mutated", False), f"{f}.mutated")
        if same_as is not None:
            earlier = {d.name: d for d in decls}
            if same_as not in earlier:
                raise ctx.error(
                    f"{f}.dtype",
                    f"same_as({same_as}) must name an earlier input; earlier inputs: {list(earlier)}",
                )
            if earlier[same_as].optional:
                raise ctx.error(f"{f}.dtype", f"same_as({same_as}) names an optional input")
        if not decls and optional:
            raise ctx.error(f, "the first input gives the op its dtype and cannot be optional")
        decls.append(InputDecl(name, dtypes, same_as, optional, mutated))
    return tuple(decls)


def _params(ctx: _Ctx, raw: Any, taken: set[str]) -> tuple[tuple[ParamDecl, ...], dict[str, ParamType], dict[str, Any]]:
    field = "signature.params"
    decls: list[ParamDecl] = []
    types: dict[str, ParamType] = {}
    resolve_src: dict[str, Any] = {}
    seen_default = False
    for name, spec in ctx.mapping(raw, field).items():
        f = f"{field}.{name}"
        ctx.binding(name, f)
        if name in taken:
            raise ctx.error(f, f"param {name!r} has the name of an input")
        spec = ctx.mapping(spec, f)
        ctx.keys(spec, f, _PARAM_KEYS, {"default", "resolve", "kw_only"})
        try:
            ptype = parse_param_type(spec["type"])
        except TypeSyntaxError as exc:
            raise ctx.error(f"{f}.type", str(exc)) from None
        kw_only = ctx.flag(spec.get("kw_only", False), f"{f}.kw_only")
        required = "default" not in spec
        default: Any = None
        if not required:
            ok, default = ptype.convert(spec["default"])
            if not ok:
                raw_default = spec["default"]
                raise ctx.error(
                    f"{f}.default",
                    f"{raw_default!r} ({type(raw_default).__name__}) is not a {ptype.text}"
                    + (" (YAML reads 1e-6 as a string: write 1.0e-6)" if isinstance(raw_default, str) else ""),
                )
        if not kw_only:
            # The op's __init__ takes these positionally: no required one after a default.
            if required and seen_default:
                raise ctx.error(
                    f,
                    "a required positional param cannot follow one with a default; mark it kw_only or move it",
                )
            seen_default = seen_default or not required
        if "resolve" in spec:
            resolve_src[name] = spec["resolve"]
        decls.append(ParamDecl(name, ptype.text, required, default, kw_only))
        types[name] = ptype
    return tuple(decls), types, resolve_src


def _value_rules(ctx: _Ctx, raw: Any, inputs: tuple[InputDecl, ...], params: set[str]) -> tuple[ValueRule, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ctx.error("signature.value_rules", f"expected a list of checks, got {raw!r}")
    declared = {i.name: i.dtypes for i in inputs}
    rules = []
    for index, text in enumerate(raw):
        try:
            rules.append(parse_value_rule(text, declared, params))
        except ValueRuleError as exc:
            raise ctx.error(f"signature.value_rules[{index}]", str(exc)) from None
    return tuple(rules)


def _upstream(ctx: _Ctx, raw: Any, inputs: tuple[InputDecl, ...], params: tuple[ParamDecl, ...]) -> Upstream | None:
    if raw is None:
        return None
    accepted: dict[str, Any] = {}
    for decl in inputs:  # same_as inputs accept what their source accepts
        accepted[decl.name] = decl.dtypes if decl.same_as is None else accepted[decl.same_as]
    return parse_upstream(ctx, raw, accepted, {p.name: p for p in params})


def _entry(ctx: _Ctx, name: Any, raw: Any) -> OpEntry:
    ctx.identifier(name, None)
    raw = ctx.mapping(raw, None, empty_ok=False)  # type: ignore[arg-type]
    ctx.keys(raw, None, _ENTRY_KEYS, _ENTRY_OPTIONAL)

    family = raw["family"]
    if not isinstance(family, str) or not family:
        raise ctx.error("family", f"expected a non-empty string, got {family!r}")
    ref_api = _resolve_ref_api(ctx, raw["ref_api"])
    modules = _modules(ctx, raw["module"])
    doc = raw.get("doc")
    if doc is not None and (not isinstance(doc, str) or not doc.strip()):
        raise ctx.error("doc", f"expected a non-empty string, got {doc!r}")
    fullgraph = ctx.flag(raw.get("torch_compile_fullgraph", False), "torch_compile_fullgraph")

    sig = ctx.mapping(raw["signature"], "signature", empty_ok=False)
    ctx.keys(sig, "signature", _SIGNATURE_KEYS, _SIGNATURE_OPTIONAL)
    inputs = _inputs(ctx, sig["inputs"])
    input_names = {i.name for i in inputs}
    params, ptypes, resolve_src = _params(ctx, sig.get("params"), input_names)
    param_names = {p.name for p in params}
    names = input_names | param_names

    param_rules = ctx.expr_list(sig.get("param_rules"), "signature.param_rules", param_names, param_names)
    shape_rules = ctx.expr_list(sig.get("shape_rules"), "signature.shape_rules", names, names)
    value_rules = _value_rules(ctx, sig.get("value_rules"), inputs, param_names)
    resolves = tuple(
        (p, ctx.expr(src, f"signature.params.{p}.resolve", names, names)) for p, src in resolve_src.items()
    )

    outputs: list[OutputDecl] = []
    for oname, spec in ctx.mapping(sig["outputs"], "signature.outputs", empty_ok=False).items():
        f = f"signature.outputs.{oname}"
        ctx.identifier(oname, f)
        spec = ctx.mapping(spec, f)
        ctx.keys(spec, f, _OUTPUT_KEYS)
        named = _PARAM_DTYPE.match(spec["dtype"]) if isinstance(spec["dtype"], str) else None
        if named is not None:  # param(<name>): the dtype a str param names
            if ptypes.get(named.group(1)) is None or ptypes[named.group(1)].text != "str":
                raise ctx.error(f"{f}.dtype", f"{spec['dtype']}: param {named.group(1)!r} must be a declared str param")
            outputs.append(
                OutputDecl(oname, None, None, ctx.expr(spec["shape"], f"{f}.shape", names, names), named.group(1))
            )
            continue
        try:
            fixed, same_as = parse_dtype_rule(spec["dtype"])
        except TypeSyntaxError as exc:
            raise ctx.error(f"{f}.dtype", str(exc)) from None
        if same_as is None:
            assert fixed is not None
            if len(fixed) != 1:
                raise ctx.error(
                    f"{f}.dtype",
                    "an output's dtype must be same_as(<input>) or one dtype name "
                    f"(an output has one dtype), got {spec['dtype']!r}",
                )
        elif same_as not in input_names:
            raise ctx.error(f"{f}.dtype", f"same_as({same_as}) names no input")
        elif next(i for i in inputs if i.name == same_as).optional:
            raise ctx.error(f"{f}.dtype", f"same_as({same_as}) names an optional input")
        outputs.append(
            OutputDecl(
                oname,
                same_as,
                None if fixed is None else fixed[0],
                ctx.expr(spec["shape"], f"{f}.shape", names, names),
            )
        )

    roof = ctx.mapping(raw["roofline"], "roofline", empty_ok=False)
    ctx.keys(roof, "roofline", _ROOFLINE_KEYS, {"vars"})
    visible = names | _ROOFLINE_RESERVED
    roof_vars: list[tuple[str, Expr]] = []
    for vname, src in ctx.mapping(roof.get("vars"), "roofline.vars").items():
        f = f"roofline.vars.{vname}"
        ctx.identifier(vname, f)
        if vname in visible:
            raise ctx.error(f, f"{vname!r} would hide an input, param or 'eb'")
        roof_vars.append((vname, ctx.expr(src, f, visible, names)))
        visible = visible | {vname}
    flops = ctx.expr(roof["flops"], "roofline.flops", visible, names)
    nbytes = ctx.expr(roof["bytes"], "roofline.bytes", visible, names)

    kernel_map: dict[str, str] = {}
    for role, cls in ctx.mapping(raw["kernel_map"], "kernel_map", empty_ok=False).items():
        ctx.identifier(role, f"kernel_map.{role}")
        if not isinstance(cls, str) or not cls.isidentifier():
            raise ctx.error(f"kernel_map.{role}", f"expected a class name, got {cls!r}")
        kernel_map[role] = cls

    workloads = raw["workloads"]
    if not isinstance(workloads, list) or not workloads:
        raise ctx.error("workloads", "expected a non-empty list")

    entry = OpEntry(
        name=name,
        family=family,
        modules=modules,
        doc=doc,
        ref_api=ref_api,
        fullgraph=fullgraph,
        inputs=inputs,
        outputs=tuple(outputs),
        params=params,
        kernel_map=kernel_map,
        workloads=workloads,
        source=ctx.path,
        param_types=ptypes,
        resolves=resolves,
        param_rules=param_rules,
        shape_rules=shape_rules,
        value_rules=value_rules,
        roofline_vars=tuple(roof_vars),
        flops=flops,
        bytes_=nbytes,
        upstream=_upstream(ctx, raw.get("upstream"), inputs, params),
    )
    entry._parsed_workloads = tuple(_workload(ctx, entry, i, w) for i, w in enumerate(workloads))
    return entry


def _workload(ctx: _Ctx, entry: OpEntry, index: int, raw: Any) -> _Workload:
    field = f"workloads[{index}]"
    raw = ctx.mapping(raw, field, empty_ok=False)
    label = raw.get("name")
    if not isinstance(label, str) or not label:
        raise ctx.error(field, f"needs a 'name' string, got {label!r}")
    field = f"workloads[{index}] ({label})"
    if any(w.get("name") == label for w in entry.workloads[:index] if isinstance(w, dict)):
        raise ctx.error(field, f"workload name {label!r} is used twice")
    known = _WORKLOAD_KEYS | set(entry.input_names())
    for key in raw:
        if key not in known:
            raise ctx.error(field, f"unknown key {key!r}; known keys: {sorted(known)}")

    shapes: dict[str, tuple[int, ...] | None] = {}
    for decl in entry.inputs:
        shape = raw.get(decl.name)
        if shape is None:
            if not decl.optional:
                raise ctx.error(field, f"gives no shape for required input {decl.name!r}")
            shapes[decl.name] = None
            continue
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise ctx.error(f"{field}.{decl.name}", f"expected a list of sizes, got {shape!r}")
        shapes[decl.name] = tuple(shape)

    dtypes_raw = raw.get("dtypes")
    if not isinstance(dtypes_raw, list) or not dtypes_raw:
        raise ctx.error(f"{field}.dtypes", f"expected a non-empty list of dtypes, got {dtypes_raw!r}")
    try:
        dtypes = tuple(parse_dtype(d) for d in dtypes_raw)
    except TypeSyntaxError as exc:
        raise ctx.error(f"{field}.dtypes", str(exc)) from None

    if "constructor" in raw:
        ctx.mapping(raw["constructor"], f"{field}.constructor")  # free-form, not interpreted

    try:
        params = entry.init_params(ctx.mapping(raw.get("params"), f"{field}.params"))
    except (TypeError, ValueError) as exc:
        raise ctx.error(f"{field}.params", str(exc)) from None

    # A workload that breaks its own op's rules is a manifest bug: find it at load.
    for dtype in dtypes:
        specs = entry.case_specs(shapes, dtype)
        try:
            entry.check_inputs(specs, params)
        except (TypeError, ValueError) as exc:
            raise ctx.error(f"{field} as {DTYPE_NAMES[dtype]}", str(exc)) from None
    entry.output_meta(specs, params)  # evaluation errors surface as ManifestError
    entry.roofline(specs, params)
    return _Workload(label, shapes, params, dtypes)


def load_file(path: Path) -> dict[str, OpEntry]:
    ctx = _Ctx(path)
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ctx.error(None, f"YAML does not parse: {exc}") from None
    except OSError as exc:
        raise ctx.error(None, f"cannot read: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise ctx.error(None, "expected a mapping of op names to entries")
    entries: dict[str, OpEntry] = {}
    for name, raw in data.items():
        entries[name] = _entry(_Ctx(path, str(name)), name, raw)
    return entries


def load_paths(paths: Iterable[str | Path]) -> dict[str, OpEntry]:
    """Load manifest files; a directory stands for its ``*.yaml`` files in name order."""
    files: list[Path] = []
    for p in paths:
        p = Path(p)
        files.extend(sorted(p.glob("*.yaml")) if p.is_dir() else [p])
    entries: dict[str, OpEntry] = {}
    for path in files:
        for name, entry in load_file(path).items():
            if name in entries:
                raise ManifestError(path, name, None, f"op is also declared in {entries[name].source}")
            entries[name] = entry
    return entries
