"""The compile boundary: one torch.library custom op per op class (namespace ``tileops``).

Tracers — dynamo, torch.export, make_fx, fake tensors, tensor subclasses, dispatch
modes — see the custom op, never a kernel. Its fake implementation is derived from the
manifest's output rules, so shapes and dtypes are known without running anything; its
real implementation runs the op's normal eager path. A backend does nothing for this.

Schema: the op's inputs as tensors, then its manifest params, then its constructor-only
arguments (those of its class, then upstream's shape and dtype arguments, so a traced call
is checked against them as an eager one), then ``target`` ("" = device detection,
"<builtin>" = in-tree, else a name).
An op whose ``mutated`` inputs are written only in an in-place form (``inplace=True``)
uses a second op for that form, ``<name>_``, that mutates the input and returns nothing;
an op that writes them on every call (paged prefill appends to its cache) declares them
mutated in its one op, which also returns the outputs.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

import torch

from ..backend.types import BUILTIN, _Builtin

# An op class or instance (tileops.ops.op.Op). Not imported: op.py imports this module,
# and this one needs only the attributes it reads.
Op = Any

_BUILTIN_TAG = "<builtin>"
_instances: OrderedDict[tuple, Op] = OrderedDict()
_INSTANCE_BOUND = 64
_defining = threading.local()


def _schema_type(type_text: str) -> str:
    """Schema type of a manifest param type string."""
    parts = {p.strip() for p in type_text.split("|")}
    optional = "None" in parts
    parts.discard("None")
    if parts and all(p in ("list[float]", "tuple[float, ...]") for p in parts):
        base = "float[]"
    elif any(p.startswith(("list[", "tuple[")) for p in parts):
        base = "int[]"
    elif parts == {"int", "float"}:
        base = "Scalar"
    elif len(parts) == 1:
        base = {"int": "int", "float": "float", "bool": "bool", "str": "str"}[parts.pop()]
    else:
        raise ValueError(f"no schema type for manifest type {type_text!r}")
    return base + ("?" if optional else "")


def extra_args(cls: Any) -> dict[str, str]:
    """Constructor-only arguments carried through the custom op, name -> schema type: the
    class's own, then upstream's shape (int) and dtype (ScalarType) arguments, None when
    the op was built in our form."""
    extra = dict(cls._extra_args)
    upstream = cls._entry.upstream
    if upstream is not None:
        for name in upstream.checked:
            kind = "ScalarType?" if name in upstream.served_dtypes else "int?"
            extra.setdefault(name, kind)
    return extra


def schema_name(class_name: str) -> str:
    """Schema name of an op class's name: RMSNormFwdOp -> rms_norm_fwd."""
    name = class_name.removesuffix("Op")
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def _op_name(cls: type) -> str:
    return schema_name(cls.__name__)


def _schema(cls: type, mutating: bool, returns: bool) -> str:
    entry = cls._entry
    args = []
    for decl in entry.inputs:
        tensor = "Tensor" + ("(a!)" if mutating and decl.mutated else "")
        args.append(f"{tensor}{'?' if decl.optional else ''} {decl.name}")
    args += [f"{_schema_type(p.type)} {p.name}" for p in entry.params]
    args += [f"{kind} {name}" for name, kind in extra_args(cls).items()]
    args.append("str target")
    outputs = (
        "()"
        if not returns
        else ("Tensor" if len(entry.outputs) == 1 else "(" + ", ".join("Tensor" for _ in entry.outputs) + ")")
    )
    return f"({', '.join(args)}) -> {outputs}"


def defining() -> bool:
    """Whether this thread is inside ``define_custom_op``: torch looks the name up there
    before defining it, and that lookup must not make the op (``_catalog``)."""
    return getattr(_defining, "depth", 0) > 0


def define_custom_op(cls: Any) -> None:
    """Registers ``tileops::<op_name>`` (and ``<op_name>_`` where an input is written)."""
    _defining.depth = getattr(_defining, "depth", 0) + 1
    try:
        _define(cls)
    finally:
        _defining.depth -= 1


_lib: torch.library.Library | None = None


def _library() -> torch.library.Library:
    """The ``tileops`` fragment every custom op is defined in (kept alive: dropping it
    would unregister them)."""
    global _lib
    if _lib is None:
        _lib = torch.library.Library("tileops", "FRAGMENT")  # noqa: TOR901 (ours, for the process)
    return _lib


def _define(cls: Any) -> None:
    # Defined on torch.library.Library, not torch.library.custom_op: a call through a
    # compiled graph then costs about 2 us of torch's dispatch instead of 4 to 8 (custom_op
    # wraps every call in Python for autograd and checks its outputs' aliasing); the
    # schema, the fake and what tracers record are the same.
    entry = cls._entry
    name = _op_name(cls)
    n_inputs = len(entry.inputs)
    param_names = [p.name for p in entry.params]
    extra_names = list(extra_args(cls))

    def construct(rest: tuple) -> Op:
        params = dict(zip(param_names, rest[: len(param_names)]))
        extras = dict(zip(extra_names, rest[len(param_names) : len(param_names) + len(extra_names)]))
        return _construct(cls, params, extras, rest[-1])

    def real(*args: Any) -> Any:
        return _instance(cls, args[n_inputs:], construct)._dispatcher.call_eager(*args[:n_inputs])

    def fake(*args: Any) -> Any:
        tensors = list(args[:n_inputs])
        op = _instance(cls, args[n_inputs:], construct)
        device = next(t.device for t in tensors if t is not None)
        metas = entry.output_meta(tensors, entry.call_params(tensors, op.params))
        outs = tuple(torch.empty(shape, dtype=dtype, device=device) for dtype, shape in metas)
        return outs[0] if len(outs) == 1 else outs

    mutated = tuple(d.name for d in entry.inputs if d.mutated)
    always = bool(mutated) and not cls._inplace_form  # written on every call
    cls._custom_op = _register(name, _schema(cls, mutating=always, returns=True), real, fake)
    if mutated and not always:

        def real_inplace(*args: Any) -> None:
            real(*args)

        def fake_inplace(*args: Any) -> None:
            return None

        schema = _schema(cls, mutating=True, returns=False)
        cls._custom_op_inplace = _register(name + "_", schema, real_inplace, fake_inplace)


def _register(name: str, schema: str, real: Any, fake: Any) -> Any:
    """Defines ``tileops::<name>``: ``real`` for every device (the ops compute forward passes
    only), ``fake`` for tracers. Returns its default overload."""
    lib = _library()
    lib.define(name + schema)
    lib.impl(name, real, "CompositeExplicitAutograd")  # no backward formula (torch's autograd fallback)
    torch.library.register_fake(f"tileops::{name}", fake, lib=lib)
    return getattr(torch.ops.tileops, name).default


def _target_tag(op: Op) -> str:
    target = op._settled if op._settled is not None else op._target_arg
    if target is None:
        return ""
    return _BUILTIN_TAG if isinstance(target, _Builtin) else target


def _instance(cls: Any, rest: tuple, construct: Any) -> Op:
    """The eager op behind a custom op call: one per (class, params, target), bounded.
    ``rest``: the call's arguments after its tensors, as the schema orders them."""
    key = (cls, tuple(tuple(v) if type(v) is list else v for v in rest))
    op = _instances.get(key)
    if op is None:
        op = construct(rest)
        _instances[key] = op
        if len(_instances) > _INSTANCE_BOUND:
            _instances.popitem(last=False)
    else:
        _instances.move_to_end(key)
    return op


def _construct(cls: Any, params: dict, extras: dict, target: str) -> Op:
    chosen = None if target == "" else BUILTIN if target == _BUILTIN_TAG else target
    # upstream's arguments are passed only where given: they select upstream's form
    given = {k: v for k, v in extras.items() if v is not None or k in cls._extra_args}
    return cls(**params, **given, target=chosen)


def call_custom_op(op: Op, args: tuple) -> Any:
    """Calls ``op``'s custom op with the op's params: what every tracer records."""
    cls = type(op)
    params = [_schema_param(p, op.params[p.name]) for p in cls._entry.params]
    extras = [op.extras.get(name) for name in extra_args(cls)]
    if op._returns_input():
        cls._custom_op_inplace(*args, *params, *extras, _target_tag(op))
        return args[op._return_slot()]
    return cls._custom_op(*args, *params, *extras, _target_tag(op))


def _schema_param(decl: Any, value: Any) -> Any:
    if value is None:
        return None
    schema = _schema_type(decl.type)
    if schema.startswith("int[]"):
        return [value] if isinstance(value, int) else list(value)
    if schema.startswith("float[]"):
        return list(value)
    return value
