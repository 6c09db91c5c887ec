"""Upstream TileOPs' constructor of an op (manifest key ``upstream:``), accepted beside ours.

Upstream's attention ops are constructed with the shapes and dtype of the calls they will
serve (batch, heads, dim, ...) ahead of their params; here those come from the tensors.
An entry's ``upstream:`` says what each such argument is, so code written against
upstream runs unchanged and a call that contradicts its constructor is refused:

* ``init``: upstream's parameter list as its Python API writes it (order and defaults),
  for a generated constructor. An op class that writes its own constructor (the dense
  GQA ops, whose constructor is upstream's) declares the checks below only.
* ``dims``: shape argument -> the input dimension it must equal (an expression);
  ``limits``: shape argument -> an input dimension it must be at least.
* ``dtypes``: dtype argument -> the input whose dtype it names (None: not checked).
* ``knobs``: upstream-only argument -> the values served here, which compute what
  upstream computes (``any``: every value); any other value raises.
* ``params``: a manifest param upstream's constructor lacks -> an expression of its
  arguments.
* ``forward``: arguments upstream's ``forward`` takes after the inputs; accepted and not
  needed (a bound the tensors and the op's own params already carry).

The shape and dtype arguments are checked by ``OpEntry.check_inputs`` on a memo miss:
shapes and dtypes are part of the memo key, so a hit has nothing left to check.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ._expr import Expr, namespace
from ._types import dtype_rule_text

_FRAMEWORK = {"kernel_map": None, "tune": False, "target": None}  # ours: the defaults
_KEYS = {"init", "dims", "limits", "dtypes", "knobs", "params", "forward"}


class _Unset:
    """Default of our own params in upstream's form: the manifest's default applies."""

    def __repr__(self) -> str:
        return "<manifest default>"


_UNSET = _Unset()


@dataclass(frozen=True)
class Knob:
    served: tuple[Any, ...] | None  # None: every value is served
    hint: str | None


@dataclass(frozen=True)
class Bound:
    """A constructor call in upstream's form, sorted out."""

    params: dict[str, Any]  # manifest params, for OpEntry.init_params
    checked: dict[str, Any]  # shape and dtype arguments, checked against each new signature
    framework: dict[str, Any]  # target, kernel_map, tune


@dataclass(frozen=True)
class Upstream:
    op: str
    init: str | None  # upstream's parameter list as written
    signature: inspect.Signature | None  # upstream's, then our other params and target as keywords
    names: tuple[str, ...]  # upstream's parameters, in its order
    required: tuple[str, ...]  # upstream's parameters without a default
    dims: tuple[tuple[str, Expr], ...]
    limits: tuple[tuple[str, Expr], ...]
    dtypes: tuple[tuple[str, str], ...]  # (argument, input)
    served_dtypes: Mapping[str, tuple[torch.dtype, ...]]  # per dtype argument: what its input takes
    knobs: Mapping[str, Knob]
    params: tuple[tuple[str, Expr], ...]
    forward: tuple[str, ...]

    @property
    def checked(self) -> tuple[str, ...]:
        """The arguments checked against a call: shape arguments, then dtype arguments."""
        return tuple(n for n, _ in self.dims + self.limits) + tuple(n for n, _ in self.dtypes)

    def form(self) -> str:
        return f"{self.op}({self.init})"

    # --- construction -------------------------------------------------------------

    def claims(self, args: tuple, kwargs: Mapping[str, Any], ours: Collection[str], ours_positional: int) -> bool:
        """Whether a constructor call is in upstream's form: it passes an argument our form
        lacks (by keyword, or by position past ours), or upstream's leading shape arguments
        by position, as ints (where our form has a bool, a float or None among them)."""
        if self.signature is None:
            return False
        if any(name in self.signature.parameters and name not in ours for name in kwargs):
            return True
        if len(args) > ours_positional:
            return True
        shape_args = {n for n, _ in self.dims + self.limits}
        lead = max((i + 1 for i, n in enumerate(self.required) if n in shape_args), default=0)
        return 0 < lead <= len(args) and all(_is_int(a) for a in args[:lead])

    def bind(self, args: tuple, kwargs: Mapping[str, Any]) -> Bound:
        assert self.signature is not None
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(
                f"{self.op}: {error} (read as upstream TileOPs' form {self.form()}, as it passes "
                f"upstream's shape arguments or one only that form has); pass it as written there, "
                f"or use this op's own form with the manifest params"
            ) from None
        bound.apply_defaults()
        values = dict(bound.arguments)
        framework = {name: values.pop(name) for name in _FRAMEWORK}
        shape_args = {n for n, _ in self.dims + self.limits}
        params: dict[str, Any] = {}
        checked: dict[str, Any] = {}
        for name, value in values.items():
            if name in shape_args:
                checked[name] = self._shape_arg(name, value)
            elif name in self.served_dtypes:
                if value is not None:
                    checked[name] = self._dtype_arg(name, value)
            elif name in self.knobs:
                self._knob(name, value)
            elif value is not _UNSET:  # a manifest param; unset ones take the manifest default
                params[name] = value
        ns = namespace(values)
        for name, expr in self.params:
            if name not in params:
                params[name] = expr(ns)
        return Bound(params, checked, framework)

    def _shape_arg(self, name: str, value: Any) -> int:
        if not _is_int(value) or value <= 0:
            raise ValueError(
                f"{self.op}: {name} must be a positive int (upstream's shape argument; "
                f"form {self.form()}), got {value!r}"
            )
        return int(value)

    def _dtype_arg(self, name: str, value: Any) -> torch.dtype:
        served = self.served_dtypes[name]
        if not isinstance(value, torch.dtype):
            raise TypeError(f"{self.op}: {name} must be a torch.dtype, got {value!r} ({type(value).__name__})")
        if value not in served:
            raise ValueError(
                f"{self.op}: {name}={value} is not served here (the tensors it names may be "
                f"{dtype_rule_text(served)}); pass one of those"
            )
        return value

    def _knob(self, name: str, value: Any) -> None:
        knob = self.knobs[name]
        if knob.served is None or any(_same(value, v) for v in knob.served):
            return
        shown = ", ".join(repr(v) for v in knob.served)
        hint = f"; {knob.hint}" if knob.hint else ""
        given = repr(value) if len(repr(value)) <= 60 else f"<{type(value).__name__}>"
        raise ValueError(
            f"{self.op}: upstream's {name}={given} is not served by tileops (it would change "
            f"what the op computes); {name} may be {shown} here. Pass one of those or leave "
            f"{name} out{hint}"
        )

    # --- a call -------------------------------------------------------------------

    def check(self, constructed: Mapping[str, Any], ns: dict[str, Any]) -> None:
        """Refuse a call whose inputs contradict the constructor's shape or dtype arguments
        (``ns``: the call's input views, after the shape rules held)."""
        for name, expr in self.dims:
            want = constructed.get(name)
            if want is None:
                continue
            have = expr(ns)
            if have != want:
                raise ValueError(
                    f"{self.op}: constructed with {name}={want}, but this call has "
                    f"{expr.source} = {have}. Construct the op with {name}={have}, or pass "
                    f"inputs with {expr.source} == {want}"
                )
        for name, expr in self.limits:
            most = constructed.get(name)
            if most is None:
                continue
            have = expr(ns)
            if have > most:
                raise ValueError(
                    f"{self.op}: constructed with {name}={most}, the most {expr.source} may be, "
                    f"but this call has {expr.source} = {have}. Construct the op with "
                    f"{name} >= {have}, or pass inputs with {expr.source} <= {most}"
                )
        for name, input_name in self.dtypes:
            want = constructed.get(name)
            have = ns[input_name].dtype
            if want is not None and have != want:
                raise ValueError(
                    f"{self.op}: constructed with {name}={want}, but this call's {input_name} "
                    f"is {have}. Construct the op with {name}={have}, or pass {want} inputs"
                )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _same(a: Any, b: Any) -> bool:
    """Equal and of one kind: True is not 1 here, as a bool param is not an int."""
    return type(a) is type(b) and a == b


# --- loading --------------------------------------------------------------------------


def parse(ctx: Any, raw: Any, inputs: Mapping[str, tuple[torch.dtype, ...]], params: Mapping[str, Any]) -> Upstream:
    """The entry's ``upstream:`` section. ``inputs``: input -> the dtypes it accepts;
    ``params``: manifest param -> its ParamDecl. Every error names the field."""
    field = "upstream"
    raw = ctx.mapping(raw, field, empty_ok=False)
    ctx.keys(raw, field, _KEYS, _KEYS)
    input_names = set(inputs)

    def exprs(key: str, allowed: set[str]) -> tuple[tuple[str, Expr], ...]:
        out = []
        for name, source in ctx.mapping(raw.get(key), f"{field}.{key}").items():
            ctx.identifier(name, f"{field}.{key}")
            out.append((name, ctx.expr(source, f"{field}.{key}.{name}", allowed, allowed)))
        return tuple(out)

    dims, limits = exprs("dims", input_names), exprs("limits", input_names)
    dtypes: list[tuple[str, str]] = []
    for name, input_name in ctx.mapping(raw.get("dtypes"), f"{field}.dtypes").items():
        if input_name not in input_names:
            raise ctx.error(
                f"{field}.dtypes.{name}",
                f"{input_name!r} is not an input; inputs: {sorted(inputs)}",
            )
        dtypes.append((name, input_name))
    knobs = {
        name: _knob(ctx, f"{field}.knobs.{name}", value)
        for name, value in ctx.mapping(raw.get("knobs"), f"{field}.knobs").items()
    }
    forward = raw.get("forward") or []
    if not isinstance(forward, list) or any(not isinstance(n, str) or n in input_names for n in forward):
        raise ctx.error(
            f"{field}.forward",
            f"expected a list of argument names that are not inputs, got {forward!r}",
        )

    signature, names, required, derived = None, [], (), ()
    init = raw.get("init")
    if init is not None:
        upstream_params = _parse_init(ctx, f"{field}.init", init)
        names = [p.name for p in upstream_params]
        special = {n for n, _ in dims + limits} | {n for n, _ in dtypes} | set(knobs) | set(_FRAMEWORK)
        for name in names:
            if name not in params and name not in special:
                raise ctx.error(
                    f"{field}.init",
                    f"{name!r} is no manifest param, dim, limit, dtype, knob or kernel_map / tune: say what it is",
                )
        for name in special - set(_FRAMEWORK):
            if name not in names:
                raise ctx.error(field, f"{name!r} is declared but is not in upstream's init")
        derived = exprs("params", set(names))
        for name, _ in derived:
            if name not in params or name in names:
                raise ctx.error(f"{field}.params.{name}", "must be a manifest param that upstream's init lacks")
        for name, decl in params.items():
            if decl.required and name not in names and name not in dict(derived):
                raise ctx.error(
                    field,
                    f"required param {name!r} is not in upstream's init: derive it under params",
                )
        for name, knob in knobs.items():
            default = next(p.default for p in upstream_params if p.name == name)
            if knob.served is not None and not any(_same(default, v) for v in knob.served):
                raise ctx.error(f"{field}.knobs.{name}", f"upstream's default {default!r} must be served")
        # Ours, by keyword: the params upstream's constructor lacks (windows), and target.
        ours = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=_UNSET) for n in params if n not in names]
        ours += [
            inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d)
            for n, d in _FRAMEWORK.items()
            if n not in names
        ]
        signature = inspect.Signature(upstream_params + ours)
        required = tuple(p.name for p in upstream_params if p.default is inspect.Parameter.empty)
    elif raw.get("params") or knobs or forward:
        raise ctx.error(field, "params, knobs and forward describe upstream's init: declare it")

    return Upstream(
        op=ctx.entry,
        init=init,
        signature=signature,
        names=tuple(names),
        required=required,
        dims=dims,
        limits=limits,
        dtypes=tuple(dtypes),
        served_dtypes={name: inputs[input_name] for name, input_name in dtypes},
        knobs=knobs,
        params=derived,
        forward=tuple(forward),
    )


def _knob(ctx: Any, field: str, value: Any) -> Knob:
    if value == "any":
        return Knob(None, None)
    hint = None
    if isinstance(value, dict):
        ctx.keys(value, field, {"served", "hint"}, {"hint"})
        value, hint = value["served"], value.get("hint")
    if not isinstance(value, list) or not value:
        raise ctx.error(
            field,
            f"expected 'any', a list of served values or {{served: [...], hint: ...}}, got {value!r}",
        )
    return Knob(tuple(_value(ctx, field, v) for v in value), hint)


def _value(ctx: Any, field: str, value: Any) -> Any:
    """A knob value as YAML gives it; ``torch.float32`` names a dtype."""
    if isinstance(value, str) and value.startswith("torch."):
        dtype = getattr(torch, value.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise ctx.error(field, f"{value!r} is not a torch dtype")
        return dtype
    return value


def _parse_init(ctx: Any, field: str, text: Any) -> list[inspect.Parameter]:
    """``"batch, heads, dtype=torch.float16, *, activation='silu_and_mul'"`` as Parameters."""
    if not isinstance(text, str) or not text.strip():
        raise ctx.error(field, f"expected upstream's parameter list as a string, got {text!r}")
    try:
        args = ast.parse(f"def _({text}): pass").body[0].args  # type: ignore[attr-defined]
    except SyntaxError as error:
        raise ctx.error(field, f"does not parse as a parameter list: {error.msg}") from None
    if args.vararg or args.kwarg or args.posonlyargs:
        raise ctx.error(field, "*args, **kwargs and positional-only parameters are not supported")
    out = []
    defaults = [None] * (len(args.args) - len(args.defaults)) + list(args.defaults)
    kinds = [(a, d, inspect.Parameter.POSITIONAL_OR_KEYWORD) for a, d in zip(args.args, defaults)]
    kinds += [(a, d, inspect.Parameter.KEYWORD_ONLY) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    for arg, node, kind in kinds:
        default = inspect.Parameter.empty if node is None else _default(ctx, field, arg.arg, node)
        out.append(inspect.Parameter(arg.arg, kind, default=default))
    return out


def _default(ctx: Any, field: str, name: str, node: ast.expr) -> Any:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
        return _value(ctx, f"{field}.{name}", f"torch.{node.attr}")
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise ctx.error(
            field,
            f"default of {name!r} must be a literal or torch.<dtype>, got {ast.unparse(node)!r}",
        ) from None
