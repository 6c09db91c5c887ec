"""The machinery of the hostile-input property (test_hostile_inputs.py) and of its value-rule
companions (test_hostile_value_rules.py): a recording target that claims cpu and meta and
computes with the references, small valid calls derived from the manifests and their
mutations, the structural oracle, materialising a call, and check_one, which makes one call
and judges how it ended."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from tileops import manifest
from tileops.backend import OpNotAvailableError, register_detector, register_kernel_builder
from tileops.ops import ALL_OPS
from tileops.testing import harness, references

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
DTYPES = [
    F16,
    BF16,
    F32,
    torch.float64,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.uint8,
    torch.complex64,
]
HUGE = [2**31 + 1, 2**40]  # only ever on the meta device
CPU, META = torch.device("cpu"), torch.device("meta")
GARBAGE = [1, 2.5, "x", [1.0, 2.0], (), object(), float("nan")]
HOSTILE_PARAMS = [
    -1,
    -(2**40),
    0,
    2**63,
    1.5,
    float("nan"),
    float("inf"),
    "x",
    None,
    [],
    [-1],
    (1, "a"),
    True,
]


# ---- a recording target that claims cpu and meta and computes with the references ---------


@dataclass
class Recorder:
    builds: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    kernel_calls: list[tuple[str, tuple[bool, ...]]] = field(default_factory=list)

    def register(self) -> Recorder:
        register_detector("hostile", lambda device: device.type in ("cpu", "meta"))
        for name in manifest.all_entries():
            register_kernel_builder(name, "hostile", self._builder(name))
        return self

    def clear(self) -> None:
        self.builds.clear()
        self.kernel_calls.clear()

    def _builder(self, name: str) -> Callable[..., Any]:
        reference = references.reference(name)

        def build(*specs: Any, **params: Any) -> Callable[..., Any]:
            self.builds.append((name, specs))

            def kernel(*tensors: torch.Tensor | None) -> Any:
                self.kernel_calls.append((name, tuple(t is None or t.is_contiguous() for t in tensors)))
                return run_reference(name, reference, tensors, params)

            return kernel

        return build


def run_reference(name: str, reference: Callable[..., Any], tensors: tuple, params: dict) -> Any:
    try:
        return reference(*tensors, **params)
    except (NotImplementedError, RuntimeError) as error:
        # A reference that reads data (RoPE's position-id check calls .item()) cannot run
        # on meta: run it on small CPU zeros and hand back meta tensors of its results.
        on_meta = any(t is not None and t.device.type == "meta" for t in tensors)
        if not on_meta or "meta" not in str(error):
            raise
        if any(t is not None and t.numel() > 1 << 16 for t in tensors):
            # Huge, so no CPU copy: the manifest's output shapes are all there is to go on
            # (this one case checks plumbing, not shapes).
            specs = [None if t is None else t for t in tensors]
            metas = tuple(
                torch.empty(shape, dtype=dtype, device="meta")
                for dtype, shape in manifest.entry(name).output_meta(specs, params)
            )
            return metas if len(metas) > 1 else metas[0]
        cpu = [None if t is None else torch.zeros(t.shape, dtype=t.dtype) for t in tensors]
        result = reference(*cpu, **params)
        outs = result if isinstance(result, tuple) else (result,)
        metas = tuple(torch.empty(o.shape, dtype=o.dtype, device="meta") for o in outs)
        return metas if isinstance(result, tuple) else metas[0]


# ---- one small valid call per op; sizes are drawn --------------------------------------


@dataclass
class Call:
    """A constructor's kwargs and a call's arguments, as specs before materialising.
    Each argument is ``("tensor", shape, dtype, device, contiguous)``, ``("none",)`` or
    ``("garbage", value)``."""

    ctor: dict[str, Any]
    args: list[tuple]
    broken: list[str] = field(default_factory=list)  # mutations that must be rejected


def t(shape: tuple[int, ...], dtype: torch.dtype) -> tuple:
    return ("tensor", tuple(shape), dtype, CPU, True)


def _seed_cases(op: str) -> list[harness.Case]:
    """The op's workloads at the tiny scale, and the harness's one-row and odd variants."""
    return [c for c in harness.cases(None, ops=[op], scale="tiny") if not c.strided]


def _is_valid(entry: manifest.OpEntry, shapes: dict, params: dict, dtype: torch.dtype) -> bool:
    try:
        entry.check_inputs(entry.case_specs(shapes, dtype), entry.init_params(params))
    except (TypeError, ValueError):
        return False
    return True


@st.composite
def seeds(draw: st.DrawFn, op: str) -> Call:
    """A valid call derived from the manifest: one of its workloads at the tiny scale, in
    any dtype the first input allows, with bool and optional params drawn and the leading
    dim sometimes 0 or 1; where a draw breaks the op's rules the workload stays as written."""
    entry = manifest.entry(op)
    case = draw(st.sampled_from(_seed_cases(op)))
    shapes, params, dtype = dict(case.shapes), dict(case.params), case.dtype
    drawn_dtype = draw(st.sampled_from(entry.inputs[0].dtypes))
    drawn_params = dict(params)
    for decl in entry.params:
        if decl.type == "bool":
            drawn_params[decl.name] = draw(st.booleans())
        elif "None" in decl.type.split(" | ") and decl.name in drawn_params:
            drawn_params[decl.name] = draw(st.sampled_from([params[decl.name], None]))
    if _is_valid(entry, shapes, drawn_params, drawn_dtype):
        params, dtype = drawn_params, drawn_dtype
    first = shapes[entry.inputs[0].name]
    if first:
        lead = draw(st.sampled_from([first[0], 0, 1]))
        resized = {
            k: None if v is None else ((lead, *v[1:]) if v and v[0] == first[0] else v) for k, v in shapes.items()
        }
        if _is_valid(entry, resized, params, dtype):
            shapes = resized
    chosen = dataclasses.replace(case, shapes=shapes, params=params, dtype=dtype)
    args = [
        ("none",) if shapes.get(decl.name) is None else t(shapes[decl.name], dt)
        for decl, dt in zip(entry.inputs, entry.case_dtypes(dtype))
    ]
    return Call(harness.constructor_args(chosen), args)


# ---- mutations -----------------------------------------------------------------------------


@st.composite
def mutated(draw: st.DrawFn, op: str) -> Call:
    call = draw(seeds(op))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(
            st.sampled_from(
                [
                    "dtype",
                    "dim",
                    "rank",
                    "device",
                    "all_meta",
                    "garbage",
                    "arity",
                    "param",
                    "strided",
                    "gqa_scale",
                ]
            )
        )
        tensors = [i for i, a in enumerate(call.args) if a[0] == "tensor"]
        if kind == "arity":
            if call.args and draw(st.booleans()):
                call.args.pop()
            else:
                call.args.append(t((2,), F32))
            call.broken.append("arity")
        elif kind == "param" and call.ctor:
            name = draw(st.sampled_from(sorted(call.ctor)))
            call.ctor[name] = draw(st.sampled_from(HOSTILE_PARAMS))
        elif kind == "gqa_scale" and "dim" in call.ctor and "heads_kv" in call.ctor:
            call.ctor[draw(st.sampled_from(["sm_scale", "softcap"]))] = draw(st.sampled_from([0.5, 30.0, -1.0, "x"]))
        elif kind == "garbage" and call.args:
            at = draw(st.integers(0, len(call.args) - 1))
            call.args[at] = ("garbage", draw(st.sampled_from(GARBAGE)))
        elif kind == "all_meta" and tensors:
            call.args = [(a[0], a[1], a[2], META, a[4]) if a[0] == "tensor" else a for a in call.args]
        elif tensors:
            at = draw(st.sampled_from(tensors))
            _, shape, dtype, device, contiguous = call.args[at]
            if kind == "dtype":
                dtype = draw(st.sampled_from(DTYPES))
            elif kind == "dim" and shape:
                i = draw(st.integers(0, len(shape) - 1))
                # At most one huge dim per tensor: two would overflow torch's byte count.
                others_small = all(d <= 64 for j, d in enumerate(shape) if j != i)
                sizes = [0, 1, 2, 3, 7] + (HUGE if device == META and others_small else [])
                shape = shape[:i] + (draw(st.sampled_from(sizes)),) + shape[i + 1 :]
            elif kind == "rank":
                shape = shape[1:] if shape and draw(st.booleans()) else (draw(st.integers(1, 3)),) + shape
            elif kind == "device":
                device = META if device == CPU else CPU
                if device == CPU and any(d > 64 for d in shape):
                    device = META  # huge dims stay on meta
            elif kind == "strided":
                contiguous = False
            call.args[at] = ("tensor", shape, dtype, device, contiguous)
    return call


# ---- the structural oracle: what must be rejected whatever the shape rules say -----------


def structural_problems(op: str, call: Call) -> list[str]:
    entry = manifest.entry(op)
    problems = []
    if len(call.args) > len(entry.inputs):
        return [f"{len(call.args)} arguments for {len(entry.inputs)} inputs"]
    # forward() gives optional inputs a default of None: leaving them out is passing None.
    args = call.args + [("none",)] * (len(entry.inputs) - len(call.args))
    devices = {a[3] for a in args if a[0] == "tensor"}
    if len(devices) > 1:
        problems.append("inputs on two devices")
    dtypes: dict[str, torch.dtype] = {}
    for decl, arg in zip(entry.inputs, args):
        if arg[0] == "garbage":
            problems.append(f"{decl.name} is not a tensor")
        elif arg[0] == "none":
            if not decl.optional:
                problems.append(f"{decl.name} is required")
        else:
            dtypes[decl.name] = arg[2]
            allowed = decl.dtypes if decl.same_as is None else (dtypes.get(decl.same_as),)
            if arg[2] not in allowed:
                problems.append(f"{decl.name} has dtype {arg[2]}")
    return problems


# ---- materialising -----------------------------------------------------------------------


def tensor_of(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, contiguous: bool):
    if device == META:
        value = torch.empty(shape, dtype=dtype, device=META)
    elif dtype.is_floating_point or dtype.is_complex:
        value = torch.randn(shape, dtype=torch.float32).to(dtype)
    else:
        value = torch.zeros(shape, dtype=dtype)
    if not contiguous and value.ndim >= 1:
        # The same values, strided: a slice of a tensor twice as wide in its last dim.
        wide = torch.empty((*shape[:-1], 2 * shape[-1]), dtype=dtype, device=device)
        view = wide[..., ::2]
        view.copy_(value)
        value = view
    return value


def materialise(call: Call) -> list[Any]:
    out = []
    for arg in call.args:
        if arg[0] == "tensor":
            out.append(tensor_of(*arg[1:]))
        elif arg[0] == "none":
            out.append(None)
        else:
            out.append(arg[1])
    return out


def with_valid_indices(entry: manifest.OpEntry, args: list[Any], params: dict) -> list[Any]:
    """Offsets, lengths and page tables (what value rules read) made valid where the
    call's shapes allow it, so that a call is refused for what its mutations broke."""
    if not entry.value_rules:
        return args
    shapes = {d.name: tuple(a.shape) for d, a in zip(entry.inputs, args) if isinstance(a, torch.Tensor)}
    try:
        chosen = harness.index_inputs(entry, shapes, params, torch.Generator().manual_seed(0))
    except Exception:  # noqa: BLE001 - shapes the rules cannot fill: the zeros stay
        return args
    out = list(args)
    for i, decl in enumerate(entry.inputs[: len(args)]):
        a = args[i]
        if decl.name in chosen and isinstance(a, torch.Tensor) and a.device == CPU:
            value = chosen[decl.name]
            if value.shape == a.shape and value.dtype == a.dtype:
                a.copy_(value)  # in place: a strided view stays strided
    return out


def reference_outputs(op: str, entry: manifest.OpEntry, args: list[Any], params: dict) -> list:
    """(dtype, shape) of each output, from torch's reference on meta copies of the inputs."""
    metas = tuple(None if a is None else torch.empty(a.shape, dtype=a.dtype, device=META) for a in args)
    result = run_reference(op, references.reference(op), metas, params)
    outs = result if isinstance(result, tuple) else (result,)
    return [(o.dtype, tuple(o.shape)) for o in outs]


def call_params_of(op: Any, args: list[Any]) -> dict:
    specs = [None if a is None else a for a in args]
    return op._entry.call_params(specs, op.params)


def describe(op: str, call: Call) -> str:
    return f"{op}({call.ctor}) called with {call.args}"


# ---- the property: one call, made and judged ------------------------------------------

OPS = {cls.__name__: cls for cls in ALL_OPS}
ALLOWED = (TypeError, ValueError)


def outcome(text: str) -> None:
    """Tallied by --hypothesis-show-statistics (shows the accepted/refused mix)."""
    if currently_in_test_context():
        event(text)


def check_one(op_name: str, call: Call, recorder: Recorder) -> None:
    recorder.clear()
    cls = OPS[op_name]
    entry = manifest.entry(op_name)
    context = describe(op_name, call)
    try:
        op = cls(**call.ctor)
    except ALLOWED as error:
        assert op_name in str(error), f"{context}: constructor error does not name the op: {error}"
        outcome("refused by the constructor")
        return
    args = with_valid_indices(entry, materialise(call), op.params)
    originals = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    problems = structural_problems(op_name, call)
    scored = any(call.ctor.get(p) not in (None,) for p in ("sm_scale", "softcap"))

    try:
        result = op(*args)
    except Exception as error:  # noqa: BLE001 - classified below
        if recorder.builds:
            raise AssertionError(
                f"{context}: validation let the call through to the builder, then {type(error).__name__}: {error}"
            ) from error
        allowed = ALLOWED + ((OpNotAvailableError,) if scored else ())
        assert isinstance(error, allowed), f"{context}: {type(error).__name__}: {error}"
        assert op_name in str(error) or "forward()" in str(error), f"{context}: the error does not name the op: {error}"
        outcome(f"refused by the call: {type(error).__name__}")
        return

    outcome("accepted on " + ("meta" if any(isinstance(a, torch.Tensor) and a.device == META for a in args) else "cpu"))
    # Accepted. Optional inputs left out reach the builder and the kernel as None.
    assert problems == [], f"{context}: accepted although {problems}"
    slots = args + [None] * (len(entry.inputs) - len(args))
    assert len(recorder.builds) == 1, f"{context}: {len(recorder.builds)} builder calls"
    ((_, specs),) = recorder.builds
    assert [None if s is None else (s.device, s.dtype, tuple(s.shape)) for s in specs] == [
        None if a is None else (a.device, a.dtype, tuple(a.shape)) for a in slots
    ], f"{context}: the builder got other specs than the call's"
    assert all(all(flags) for _, flags in recorder.kernel_calls), (
        f"{context}: a kernel received a non-contiguous tensor"
    )
    params = call_params_of(op, slots)
    if op.params.get("inplace"):
        assert result is args[0], f"{context}: an in-place op returns its input"
        outs: tuple = (result,)
    else:
        expected = reference_outputs(op_name, entry, slots, params)
        outs = result if isinstance(result, tuple) else (result,)
        assert [(o.dtype, tuple(o.shape)) for o in outs] == expected, context
        assert all(o.device == next(a.device for a in args if a is not None) for o in outs)
    if outs[0].device == CPU:
        # Values too: the op layer handed the kernel the right tensors in the right slots,
        # its contiguous copies were faithful and an in-place result was written back.
        padded = originals + [None] * (len(entry.inputs) - len(originals))
        want = references.reference(op_name)(*padded, **params)
        want = want if isinstance(want, tuple) else (want,)
        for got, wanted in zip(outs, want):
            torch.testing.assert_close(got, wanted, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{context}: {m}")
    if op.params.get("inplace"):
        return

    # The same instance, now warm: a broken call must still be refused (a memo hit skips
    # validation only for signatures that passed it), and a repeat call builds nothing.
    before = len(recorder.builds)
    assert op(*args) is not None and len(recorder.builds) == before
    broken = list(args)
    broken[0] = "not a tensor"
    with pytest.raises(TypeError, match=op_name):
        op(*broken)
    assert len(recorder.builds) == before
