"""One op's manifest entry, loaded and compiled: the checks and numbers the op layer asks for."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ._errors import ManifestError
from ._expr import Expr, TensorView, namespace, view_of
from ._types import DTYPES, ParamType, dtype_rule_text
from ._upstream import Upstream
from ._values import ValueRule

Shape = tuple[int, ...]
WorkloadCase = tuple[str, dict[str, "Shape | None"], dict[str, Any], torch.dtype]


@dataclass(frozen=True)
class InputDecl:
    name: str
    dtypes: tuple[torch.dtype, ...] | None  # None when the rule is same_as
    same_as: str | None
    optional: bool
    mutated: bool


@dataclass(frozen=True)
class OutputDecl:
    name: str
    dtype_from: str | None  # the input whose dtype the output takes (manifest: same_as(<input>))
    dtype: torch.dtype | None  # or a fixed dtype (manifest: a dtype name)
    shape: Expr
    dtype_param: str | None = None  # or the dtype a str param names (manifest: param(<name>)); one is set


@dataclass(frozen=True)
class ParamDecl:
    name: str
    type: str  # canonical type string, e.g. "float | None"
    required: bool
    default: object  # normalised (lists as tuples); meaningless when required
    kw_only: bool


class MetaSpec(NamedTuple):
    """A TensorSpec look-alike on the meta device, for workloads (no tensor, no data)."""

    device: torch.device
    dtype: torch.dtype
    shape: Shape


_META = torch.device("meta")


@dataclass(frozen=True)
class _Workload:
    name: str
    shapes: dict[str, Shape | None]
    params: dict[str, Any]  # as init_params returns them
    dtypes: tuple[torch.dtype, ...]


class OpEntry:
    """A manifest entry. Built by the loader only; every expression is already compiled."""

    def __init__(
        self,
        *,
        name: str,
        family: str,
        modules: tuple[str, ...],
        doc: str | None,
        ref_api: str | None,
        fullgraph: bool,
        inputs: tuple[InputDecl, ...],
        outputs: tuple[OutputDecl, ...],
        params: tuple[ParamDecl, ...],
        kernel_map: dict[str, str],
        workloads: list[dict[str, Any]],
        source: Path,
        param_types: dict[str, ParamType],
        resolves: tuple[tuple[str, Expr], ...],
        param_rules: tuple[Expr, ...],
        shape_rules: tuple[Expr, ...],
        value_rules: tuple[ValueRule, ...],
        roofline_vars: tuple[tuple[str, Expr], ...],
        flops: Expr,
        bytes_: Expr,
        upstream: Upstream | None = None,
    ) -> None:
        self.name = name
        self.family = family
        self.modules = modules  # modules[0] defines the op class; the rest re-export it
        self.doc = doc
        self.ref_api = ref_api
        self.fullgraph = fullgraph
        self.inputs = inputs
        self.outputs = outputs
        self.params = params
        self.kernel_map = kernel_map
        self.workloads = workloads
        self.source = source
        self._param_types = param_types
        self._resolves = resolves
        self._param_rules = param_rules
        self._shape_rules = shape_rules
        self.value_rules = value_rules  # checked per call by the dispatcher, in C++
        self._roofline_vars = roofline_vars
        self._flops = flops
        self._bytes = bytes_
        self.upstream = upstream  # upstream TileOPs' constructor, where it differs from ours
        self._input_names = tuple(i.name for i in inputs)
        self._param_names = tuple(p.name for p in params)
        self._parsed_workloads: tuple[_Workload, ...] = ()  # set by the loader once checked
        self._cases: dict[str, list[WorkloadCase]] = {}

    def __repr__(self) -> str:
        return f"<OpEntry {self.name} from {self.source.name}>"

    # --- names ------------------------------------------------------------------------

    def input_names(self) -> tuple[str, ...]:
        return self._input_names

    def param_names(self) -> tuple[str, ...]:
        return self._param_names

    # --- construction time ------------------------------------------------------------

    def init_params(self, given: Mapping[str, object]) -> dict[str, Any]:
        """Check the constructor's params; defaults filled, declared order, lists as tuples.

        ``None`` stays ``None`` here: resolution needs the inputs (see ``call_params``).
        """
        unknown = [k for k in given if k not in self._param_types]
        if unknown:
            raise TypeError(f"{self.name}: unknown param {unknown[0]!r}; known params: {list(self._param_names)}")
        out: dict[str, Any] = {}
        missing = []
        for decl in self.params:
            if decl.name in given:
                value = given[decl.name]
                ok, converted = self._param_types[decl.name].convert(value)
                if not ok:
                    raise TypeError(
                        f"{self.name}: param '{decl.name}' expects {decl.type}, got {value!r} ({type(value).__name__})"
                    )
                out[decl.name] = converted
            elif decl.required:
                missing.append(decl.name)
            else:
                out[decl.name] = decl.default
        if missing:
            names = ", ".join(f"'{m}'" for m in missing)
            raise TypeError(f"{self.name}: missing required param {names}")
        if self._param_rules:
            ns = namespace(out)
            for rule in self._param_rules:
                self._check_rule("param rule", rule, ns)
        return out

    # --- per new signature ------------------------------------------------------------

    def check_inputs(
        self,
        specs: Sequence[object | None],
        params: Mapping[str, Any],
        constructed: Mapping[str, Any] | None = None,
    ) -> None:
        """Reject a call whose inputs break the manifest: None for a required input
        (TypeError), a non-tensor (TypeError), a dtype or same_as violation, inputs on two
        devices, a failing shape rule, or inputs that contradict the shape and dtype
        arguments the op was ``constructed`` with (``upstream:``) (ValueError). ``params``
        as init_params returns them."""
        specs = tuple(specs)
        if len(specs) != len(self.inputs):
            raise TypeError(
                f"{self.name}: expects {len(self.inputs)} inputs {list(self._input_names)}, got {len(specs)}"
            )
        views: dict[str, TensorView | None] = {}
        first_device: tuple[str, object] | None = None
        for decl, spec in zip(self.inputs, specs):
            if spec is None:
                if not decl.optional:
                    raise TypeError(f"{self.name}: input '{decl.name}' is required, got None")
                views[decl.name] = None
                continue
            dtype = getattr(spec, "dtype", None)
            shape = getattr(spec, "shape", None)
            if not isinstance(dtype, torch.dtype) or not isinstance(shape, (tuple, list)):
                shown = repr(spec) if len(repr(spec)) <= 80 else repr(spec)[:77] + "..."
                raise TypeError(
                    f"{self.name}: input '{decl.name}' expects a tensor"
                    f"{' or None' if decl.optional else ''}, got {type(spec).__name__}: {shown}"
                )
            device = getattr(spec, "device", None)
            if device is not None:
                if first_device is None:
                    first_device = (decl.name, device)
                elif device != first_device[1]:
                    raise ValueError(
                        f"{self.name}: inputs must be on one device; input "
                        f"'{first_device[0]}' is on {first_device[1]} and input "
                        f"'{decl.name}' is on {device} (pass CPU scalars as params, not tensors)"
                    )
            if decl.same_as is None:
                assert decl.dtypes is not None
                if dtype not in decl.dtypes:
                    raise ValueError(
                        f"{self.name}: input '{decl.name}' expects dtype {dtype_rule_text(decl.dtypes)}, got {dtype}"
                    )
            else:
                ref = views[decl.same_as]  # an earlier, required input (checked at load)
                assert ref is not None
                if dtype != ref.dtype:
                    raise ValueError(
                        f"{self.name}: input '{decl.name}' must have the same dtype as input "
                        f"'{decl.same_as}' ({ref.dtype}), got {dtype}"
                    )
            views[decl.name] = view_of(spec)
        if self._shape_rules or constructed:
            ns = namespace({**views, **params})
            for rule in self._shape_rules:
                self._check_rule("shape rule", rule, ns)
            if constructed and self.upstream is not None:  # after the rules: dims exist
                self.upstream.check(constructed, ns)

    def shape_args(self, specs: Sequence[object | None]) -> dict[str, int]:
        """The value of each upstream shape argument (``upstream:`` dims and limits) for
        inputs that passed ``check_inputs``: what a constructor taking them is given."""
        if self.upstream is None:
            return {}
        ns = namespace(self._views(specs))
        named = self.upstream.dims + self.upstream.limits
        return {name: int(self._eval(expr, ns, f"upstream.{name}")) for name, expr in named}

    def call_params(self, specs: Sequence[object | None], params: Mapping[str, Any]) -> dict[str, Any]:
        """The params a builder receives: ``resolve:`` expressions applied, values concrete.

        Resolution is idempotent, so passing call params again returns them unchanged.
        """
        if not self._resolves:
            return dict(params)
        return self._resolved(self._views(specs), params)

    def output_meta(self, specs: Sequence[object | None], params: Mapping[str, Any]) -> list[tuple[torch.dtype, Shape]]:
        """(dtype, shape) per declared output, for inputs that passed ``check_inputs``."""
        views = self._views(specs)
        ns = namespace({**views, **self._resolved(views, params)})
        meta = []
        for out in self.outputs:
            field = f"signature.outputs.{out.name}.shape"
            value = self._eval(out.shape, ns, field)
            try:
                shape = tuple(d if isinstance(d, torch.SymInt) else int(d) for d in value)  # traced sizes stay symbolic
            except TypeError:
                raise ManifestError(self.source, self.name, field, f"gave {value!r}, not a sequence of ints") from None
            if out.dtype is not None:
                meta.append((out.dtype, shape))
                continue
            if out.dtype_param is not None:
                meta.append((self._param_dtype(out, ns), shape))
                continue
            assert out.dtype_from is not None
            view = views[out.dtype_from]
            assert view is not None
            meta.append((view.dtype, shape))
        return meta

    def _param_dtype(self, out: OutputDecl, ns: Mapping[str, Any]) -> torch.dtype:
        """The dtype an output takes from a str param naming it (``param(<name>)``)."""
        value = ns[out.dtype_param]
        if value not in DTYPES:
            raise ValueError(
                f"{self.name}: param {out.dtype_param!r} names the dtype of output {out.name!r}; expected one of "
                f"{', '.join(DTYPES)}, got {value!r}"
            )
        return DTYPES[value]

    def roofline(self, specs: Sequence[object | None], params: Mapping[str, Any]) -> tuple[int, int]:
        """(flops, bytes) for one call; ``eb`` is the first input's element size."""
        views = self._views(specs)
        first = views[self._input_names[0]]
        assert first is not None
        ns = namespace({**views, **self._resolved(views, params), "eb": first.dtype.itemsize})
        for name, expr in self._roofline_vars:
            ns[name] = self._eval(expr, ns, f"roofline.vars.{name}")
        flops = self._eval(self._flops, ns, "roofline.flops")
        nbytes = self._eval(self._bytes, ns, "roofline.bytes")
        return int(flops), int(nbytes)

    # --- workloads --------------------------------------------------------------------

    def case_dtypes(self, dtype: torch.dtype) -> tuple[torch.dtype, ...]:
        """The dtype of each input in a workload case of ``dtype``: the first input has
        ``dtype`` (allowed or not: check_inputs judges), same_as inputs follow their source,
        another input with a rule of its own (position ids) takes ``dtype`` if its rule
        allows it, else the first dtype its rule lists."""
        out: dict[str, torch.dtype] = {}
        for index, decl in enumerate(self.inputs):
            if decl.same_as is not None:
                out[decl.name] = out[decl.same_as]
            else:
                assert decl.dtypes is not None
                keep = index == 0 or dtype in decl.dtypes
                out[decl.name] = dtype if keep else decl.dtypes[0]
        return tuple(out[n] for n in self._input_names)

    def case_specs(
        self,
        shapes: Mapping[str, Shape | None],
        dtype: torch.dtype,
        device: torch.device | str = _META,
    ) -> list[MetaSpec | None]:
        """TensorSpec-like objects (None for an absent optional input) for a workload case."""
        device = torch.device(device)
        out: list[MetaSpec | None] = []
        for name, dt in zip(self._input_names, self.case_dtypes(dtype)):
            shape = shapes.get(name)
            out.append(None if shape is None else MetaSpec(device, dt, tuple(shape)))
        return out

    def workload_cases(self, scale: str = "cpu") -> list[WorkloadCase]:
        """(name, shapes per input, params, dtype) for every workload x dtype.

        ``"full"``: as written. ``"cpu"``: big dims halved until every input and output has
        at most 2**21 elements, each step re-checked against the manifest's own rules;
        ``"small"``: the same toward 2**18, as far as the rules allow (an MoE's gate-up
        weight, twice its down weight's width, stays at 1.5 x 2**18);
        ``"tiny"``: the same down to a few hundred elements (for tests that make thousands
        of calls). Cases that shrink to the same thing appear once.
        """
        if scale not in ("cpu", "small", "tiny", "full"):
            raise ValueError(f"scale must be 'cpu', 'small', 'tiny' or 'full', got {scale!r}")
        cases = self._cases.get(scale)
        if cases is None:
            cases = self._build_cases(scale)
            self._cases[scale] = cases
        return [(n, dict(s), dict(p), d) for n, s, p, d in cases]

    def _build_cases(self, scale: str) -> list[WorkloadCase]:
        # imported here: only tests and benchmarks scale workloads
        from ._scale import SMALL_BUDGET, TINY_BUDGET, TINY_FLOOR, scale_case

        limits = {
            "small": {"budget": SMALL_BUDGET},
            "tiny": {"budget": TINY_BUDGET, "floor": TINY_FLOOR},
        }.get(scale, {})

        cases: list[WorkloadCase] = []
        seen = set()
        for wl in self._parsed_workloads:
            for dtype in wl.dtypes:
                shapes, params = wl.shapes, wl.params
                if scale != "full":
                    shapes, params = scale_case(self, shapes, params, dtype, **limits)
                    key = (tuple(shapes.items()), tuple(params.items()), dtype)
                    if key in seen:
                        continue
                    seen.add(key)
                cases.append((wl.name, dict(shapes), dict(params), dtype))
        return cases

    # --- internals --------------------------------------------------------------------

    def _views(self, specs: Sequence[object | None]) -> dict[str, TensorView | None]:
        return {name: None if spec is None else view_of(spec) for name, spec in zip(self._input_names, specs)}

    def _resolved(self, views: dict[str, TensorView | None], params: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(params)
        if self._resolves:
            ns = namespace({**views, **params})
            for name, expr in self._resolves:
                out[name] = self._eval(expr, ns, f"signature.params.{name}.resolve")
        return out

    def _eval(self, expr: Expr, ns: dict[str, Any], field: str) -> Any:
        # Inputs passed check_inputs, so a failure here is the manifest's fault.
        try:
            return expr(ns)
        except Exception as exc:
            raise ManifestError(
                self.source,
                self.name,
                field,
                f"`{expr.source}` raised {type(exc).__name__}: {exc} ({expr.describe(ns)})",
            ) from exc

    def _check_rule(self, kind: str, rule: Expr, ns: dict[str, Any]) -> None:
        try:
            holds = bool(rule(ns))
        except Exception as exc:  # noqa: BLE001 - e.g. x.shape[-1] of a 0-d tensor: the call's fault
            raise ValueError(
                f"{self.name}: {kind} `{rule.source}` does not hold ({type(exc).__name__}: {exc}): {rule.describe(ns)}"
            ) from None
        if not holds:
            raise ValueError(f"{self.name}: {kind} `{rule.source}` does not hold: {rule.describe(ns)}")
