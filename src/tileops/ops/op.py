"""The Op base: everything the op layer does for every target, once.

An op class declares its manifest entry (by its class name) and one method, ``_fetch``,
the op's single kernel fetch site: it calls ``get_or_build_kernel`` with the tensors it
is about to hand the kernel. The base class generates ``forward`` from the manifest's
input list, so a call is one thin Python frame and then the C++ dispatcher:

* memo hit  -> C++ reads the key off the tensors, finds the kernel, launches it;
* memo miss -> ``_on_miss`` (here): arity, types and devices, manifest validation,
  settling the target, ``_fetch`` -> ``get_or_build_kernel`` -> builder; C++ launches;
* tracers   -> ``_on_trace``: the op's torch.library custom op (see ``_library``).
"""

from __future__ import annotations

import inspect
import math
import threading
import types
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch

from .. import _C, manifest
from ..backend import dispatch
from ..backend.errors import BackendError, OpNotAvailableError
from ..backend.types import BUILTIN, Target, TensorSpec, _Builtin
from ..kernels import in_tree_kernel
from . import _library, _runtime

_MAX_TENSOR_BYTES = 2**63 - 1

# Dynamo treats this as True while tracing; in eager it is one cheap call.
_compiling = torch.compiler.is_dynamo_compiling


def _weak(instance: Op, method: str) -> Callable[..., Any]:
    """A callback for the C++ dispatcher that does not keep the op alive (no cycle)."""
    ref = weakref.ref(instance)

    def call(*args: Any) -> Any:
        op = ref()
        if op is None:
            raise ReferenceError("the op instance was garbage-collected")
        return getattr(op, method)(*args)

    return call


def _spec(value: Any) -> Any:
    """The TensorSpec of a tensor; anything else as it came, for the manifest to refuse."""
    if not isinstance(value, torch.Tensor):
        return value
    return TensorSpec(value.device, value.dtype, tuple(value.shape))


def _make_forward(cls: type[Op], names: Sequence[str], optional: Sequence[bool], unused: Sequence[str] = ()) -> None:
    """forward(self, <inputs>) with the manifest's input names; optional ones default to None
    when no required one follows (otherwise they are passed, as None when absent).
    ``unused``: upstream's trailing forward arguments, accepted and not needed."""
    trailing = len(optional)
    while trailing and optional[trailing - 1]:
        trailing -= 1
    params = ", ".join(
        [f"{n}=None" if i >= trailing else n for i, n in enumerate(names)] + [f"{n}=None" for n in unused]
    )
    args = ", ".join(names)
    checks = "".join(f"    if {n} is not None:\n        self._check_unused({n!r}, {n})\n" for n in unused)
    source = (
        f"def forward(self, {params}):\n"
        f"{checks}"
        f"    if _compiling():\n"
        f"        return self._traced({args})\n"
        f"    return self._dispatch({args})\n"
    )
    scope: dict[str, Any] = {"_compiling": _compiling}
    exec(compile(source, f"<tileops forward of {cls.__name__}>", "exec"), scope)  # noqa: S102
    forward = scope["forward"]
    forward.__qualname__ = f"{cls.__qualname__}.forward"
    forward.__doc__ = f"Run {cls.__name__} on ({args}); see the manifest entry for the rules."
    cls.forward = forward
    cls.__call__ = forward


def _make_init(cls: type[Op], params: Sequence[Any]) -> None:
    """__init__(self, <manifest params>, *, target=None, kernel_map=None, tune=False)."""
    positional, keyword = [], []
    seen_default = False
    for p in params:
        # A required param after a defaulted one cannot be positional: make it keyword-only.
        if p.kw_only or (p.required and seen_default):
            keyword.append(p)
        else:
            positional.append(p)
            seen_default = seen_default or not p.required

    def text(p: Any) -> str:
        return p.name if p.required else f"{p.name}=_defaults[{p.name!r}]"

    signature = [text(p) for p in positional] + ["*"] + [text(p) for p in keyword]
    signature += ["target=None", "kernel_map=None", "tune=False"]
    collected = ", ".join(f"{p.name!r}: {p.name}" for p in params)
    source = (
        f"def __init__(self, {', '.join(signature)}):\n"
        f"    self._setup({{{collected}}}, target=target, kernel_map=kernel_map, tune=tune)\n"
    )
    scope: dict[str, Any] = {"_defaults": {p.name: p.default for p in params if not p.required}}
    exec(compile(source, f"<tileops __init__ of {cls.__name__}>", "exec"), scope)  # noqa: S102
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    upstream = cls._entry.upstream
    if upstream is not None and upstream.signature is not None:
        init = _either_form(init, upstream)
    cls.__init__ = init


def _either_form(ours: Callable[..., None], upstream: manifest.Upstream) -> Callable[..., None]:
    """__init__ taking our form (manifest params) or upstream TileOPs' (its shape and dtype
    arguments, positionally as its API writes them; manifest ``upstream:``)."""
    signature = inspect.signature(ours)
    names = set(signature.parameters) - {"self"}
    positional = sum(p.kind is p.POSITIONAL_OR_KEYWORD for p in signature.parameters.values()) - 1

    def __init__(self: Op, *args: Any, **kwargs: Any) -> None:
        if not upstream.claims(args, kwargs, names, positional):
            ours(self, *args, **kwargs)
            return
        bound = upstream.bind(args, kwargs)
        self._setup(bound.params, extras=bound.checked, **bound.framework)

    __init__.__qualname__ = ours.__qualname__
    __init__.__signature__ = signature  # type: ignore[attr-defined]
    __init__.__doc__ = f"{signature}, or upstream TileOPs' form {upstream.form()}"
    return __init__


class Op:
    """Base of every tileops op.

    A subclass is named after its manifest entry. Its constructor (the manifest params,
    then keyword-only ``target``, ``kernel_map``, ``tune``; or upstream TileOPs' form where
    the entry declares ``upstream:``) and its ``forward`` (the manifest inputs) are
    generated from the manifest unless it writes them; it overrides ``_fetch`` when it has
    several kernel roles to choose from.
    """

    _entry: ClassVar[manifest.OpEntry]
    _roles: ClassVar[dict[str, int]]
    #: Constructor arguments that are not manifest params but shape the op (GQA's dims).
    _extra_args: ClassVar[dict[str, str]] = {}
    #: Whether the manifest's ``mutated`` inputs are written only by an in-place form
    #: (``inplace=True``, returning the input); otherwise every call writes them.
    _inplace_form: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("_abstract", False):
            return
        try:
            entry = manifest.entry(cls.__name__)
        except LookupError:
            # A subclass under another name is the same op (e.g. a test-only variant of a
            # fetch site): it keeps its parent's manifest entry and registers as itself.
            if not hasattr(cls, "_entry"):
                raise
            entry = cls._entry
        cls._entry = entry
        cls._roles = {role: index for index, role in enumerate(entry.kernel_map)}
        unused = entry.upstream.forward if entry.upstream is not None else ()
        _make_forward(cls, entry.input_names(), [i.optional for i in entry.inputs], unused)
        if "__init__" not in cls.__dict__:
            _make_init(cls, entry.params)
        elif entry.upstream is not None and entry.upstream.signature is not None:
            raise TypeError(
                f"{cls.__name__} writes its own __init__, so its manifest entry's upstream: may "
                f"declare the checks of its arguments (dims, limits, dtypes), not an init"
            )
        _library.define_custom_op(cls)

    # ---- construction ---------------------------------------------------------------

    def _setup(
        self,
        params: Mapping[str, Any],
        *,
        target: Target | None,
        kernel_map: Mapping[str, Callable[..., Any]] | None,
        tune: bool,
        extras: Mapping[str, Any] | None = None,
    ) -> None:
        entry = self._entry
        self._requested = dispatch.request(target)  # discovery runs here, on the first op
        self._target_arg = target
        self.params: dict[str, Any] = entry.init_params(dict(params))
        self.extras: dict[str, Any] = dict(extras or {})
        self.kernel_map = self._check_kernel_map(kernel_map)
        self.tune = bool(tune)
        self._settled: Target | None = None
        self._fetch_target = threading.local()
        # In-tree kernels shared between signatures with one compile key; weak, so the
        # memo's bound and eviction stay the only thing keeping a kernel alive.
        self._in_tree_by_key: weakref.WeakValueDictionary[Any, Any] = weakref.WeakValueDictionary()
        self._dispatcher = _C.Dispatcher(
            type(self).__name__,
            len(entry.inputs),
            [i.mutated for i in entry.inputs],
            _weak(self, "_on_miss"),
            _weak(self, "_on_trace"),
            _weak(self, "_on_first_result"),
        )
        if entry.value_rules:
            slots = {name: index for index, name in enumerate(entry.input_names())}
            try:
                rules = [rule.compiled(self.params, slots) for rule in entry.value_rules]
            except (TypeError, ValueError) as error:
                raise type(error)(f"{type(self).__name__}: {error}") from None
            self._dispatcher.set_value_rules(rules, list(entry.input_names()))
        self._dispatch = self._dispatcher.entry()  # what forward calls: vectorcall, no tuple
        self._configure_return()

    def _check_kernel_map(self, kernel_map: Mapping[str, Any] | None) -> dict[str, Any]:
        chosen = dict(self._entry.kernel_map)
        for role, kernel in (kernel_map or {}).items():
            if role not in chosen:
                raise ValueError(f"{type(self).__name__}: kernel_map role {role!r} is not one of {sorted(chosen)}")
            chosen[role] = kernel
        return chosen

    def _configure_return(self) -> None:
        """In-place ops return the caller's own input tensor (a declared alias)."""

    # ---- weights in a target's own layout ---------------------------------------------

    def prepare_weight(self, input: str, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor``, for this op's ``input``, in the layout its target's kernels read
        (``tileops.backend.register_weight_layout``; the tensor itself where the target has
        none). Call it once, where the weight is loaded, and pass what it returns."""
        if input not in self._entry.input_names():
            raise ValueError(
                f"{type(self).__name__}.prepare_weight: expected one of its inputs "
                f"{list(self._entry.input_names())}, got {input!r}"
            )
        target = self._settled
        if target is None:
            target = dispatch.settle(self._requested, tensor.device)
        if isinstance(target, _Builtin):
            return tensor
        prepare = dispatch.weight_layout(type(self).__name__, input, target)
        if prepare is None:
            return tensor
        prepared = prepare(tensor, **self.params)
        same = isinstance(prepared, torch.Tensor) and (prepared.shape, prepared.dtype, prepared.device) == (
            tensor.shape,
            tensor.dtype,
            tensor.device,
        )
        if not same:
            got = (
                (tuple(prepared.shape), prepared.dtype, prepared.device)
                if isinstance(prepared, torch.Tensor)
                else prepared
            )
            raise BackendError(
                f"{target}'s weight layout for {type(self).__name__}.{input} must return a tensor of the shape, dtype "
                f"and device it was given ({tuple(tensor.shape)}, {tensor.dtype}, {tensor.device}); got {got!r}"
            )
        return prepared

    # ---- introspection --------------------------------------------------------------

    @property
    def settled_target(self) -> Target | None:
        """The target serving this instance: None before its first call, BUILTIN for in-tree."""
        return self._settled

    #: The same, under the name upstream's example-backend tests read.
    _settled_target = settled_target

    def built_kernels(self, role: str) -> Mapping[tuple, Any]:
        """Read-only view of what is memoized for ``role`` (for tests and introspection).

        Keys are ``(torch.device, slot, slot, ...)`` with each slot ``(dtype, shape)`` or None.
        """
        index = self._role_index(role)
        out: dict[tuple, Any] = {}
        for words, item_role, kernel in self._dispatcher.items():
            if item_role == index:
                out[_decode_key(words)] = kernel
        return types.MappingProxyType(out)

    def kernel_cache_stats(self) -> dict[str, int]:
        """Hits, misses, builds, evictions and size of this instance's memo."""
        return self._dispatcher.stats()

    def roofline(self, *inputs: torch.Tensor | None) -> tuple[int, int]:
        """(flops, bytes) of a call on these inputs, from the manifest."""
        specs = [_spec(t) for t in inputs]
        return self._entry.roofline(specs, self._entry.call_params(specs, self.params))

    def _role_index(self, role: str) -> int:
        try:
            return self._roles[role]
        except KeyError:
            raise ValueError(
                f"{type(self).__name__} has no kernel role {role!r}; roles: {sorted(self._roles)}"
            ) from None

    # ---- the miss path ----------------------------------------------------------------

    def _on_miss(self, *tensors: Any) -> Any:
        # The manifest is the one place a call is validated (arity, types, devices, rules).
        specs = [_spec(t) for t in tensors]
        self._entry.check_inputs(specs, self.params, self.extras)
        if self._entry.value_rules:  # per call on hits (in C++); here before any build
            self._dispatcher.check_values(*tensors)
        self._check_output_sizes(specs)
        device = next((t.device for t in tensors if t is not None), None)
        if device is None:
            # A call with no tensor decides nothing.
            raise TypeError(f"{type(self).__name__} needs at least one input tensor")
        target = self._target_for(device)
        self._fetch_target.value = target
        try:
            self._check_extras(tensors, target)
            kernel = self._fetch(*tensors)
        finally:
            self._fetch_target.value = None
        if self._settled is None:
            self._settled = target  # settled only by a first call that succeeded
            self._dispatcher.set_target_label("" if target is BUILTIN else target)
        return kernel

    def _check_output_sizes(self, specs: Sequence[TensorSpec | None]) -> None:
        """Valid inputs can still describe an output no tensor can hold (E2)."""
        entry = self._entry
        outputs = entry.output_meta(specs, entry.call_params(specs, self.params))
        for decl, (dtype, shape) in zip(entry.outputs, outputs):
            size = math.prod(shape) * dtype.itemsize
            if size > _MAX_TENSOR_BYTES:
                raise ValueError(
                    f"{type(self).__name__}: output {decl.name!r} would have shape "
                    f"{tuple(shape)} ({size} bytes), more than a tensor can hold"
                )

    def _target_for(self, device: torch.device) -> Target:
        if self._settled is None:
            return dispatch.settle(self._requested, device)
        # A target named at construction skips detection on every call, as on the first
        # (its builders see the device in the specs and refuse what they do not serve).
        explicit = self._requested[0] == "named"
        if not explicit and not isinstance(self._settled, _Builtin) and not dispatch.claims(self._settled, device):
            raise BackendError(_C.messages.wrong_device(type(self).__name__, self._settled, str(device)))
        return self._settled

    def _check_extras(self, tensors: Sequence[torch.Tensor | None], target: Target) -> None:
        """Ops with constructor-only arguments check them against the call here."""

    def _check_unused(self, name: str, value: Any) -> None:
        """Upstream's trailing forward arguments (manifest ``upstream.forward``) are bounds the
        op's params and value rules already enforce, so only their type is checked."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TypeError(
                f"{type(self).__name__}: forward()'s {name} (upstream's, not needed here) must be "
                f"a positive int or left out, got {_short_repr(value)}"
            )

    def _fetch(self, *tensors: torch.Tensor | None) -> Any:
        """The kernel fetch site of a one-role op; ops with several roles override it."""
        (role,) = self._roles
        return self.get_or_build_kernel(
            role, tensors, key=self._in_tree_key(tensors), build=self._in_tree(role, tensors)
        )

    def _in_tree_key(self, tensors: Sequence[torch.Tensor | None]) -> tuple:
        """What an in-tree kernel is compiled for: by default the whole input signature."""
        return tuple(None if t is None else (t.dtype, tuple(t.shape)) for t in tensors)

    def _in_tree(self, role: str, tensors: Sequence[torch.Tensor | None], **compile_time: Any) -> Callable[[], Any]:
        """``build`` for the in-tree kernel of ``role``: constructed from specs only."""
        kernel = self.kernel_map[role]
        specs = {d.name: _spec(t) for d, t in zip(self._entry.inputs, tensors)}
        params = dict(self.params)
        if not isinstance(kernel, str):  # a caller's kernel_map entry
            return lambda: kernel(specs, **params, **compile_time)
        shipped = in_tree_kernel(kernel)
        device = next(t.device for t in tensors if t is not None)

        def build() -> Any:
            # G1's second sentence says whether some target's backend claims this device.
            elsewhere = dispatch.any_target_claims(device)
            return shipped(specs, served_elsewhere=elsewhere, **params, **compile_time)

        return build

    def get_or_build_kernel(
        self,
        name: str,
        tensors: Sequence[torch.Tensor | None] | None,
        *,
        key: Any = None,
        build: Callable[[], Any] | None = None,
    ) -> Any:
        """The one place an op's forward obtains its kernel (D1).

        ``tensors`` are the slots the kernel will be called with, in manifest order, None
        for an absent optional input. ``key`` and ``build`` serve the in-tree kernels only.
        """
        role = self._role_index(name)
        target = getattr(self._fetch_target, "value", None)
        if target is None:
            raise RuntimeError("get_or_build_kernel is called from an op's _fetch only")
        op = type(self).__name__
        slots = tuple(tensors) if tensors else ()
        if isinstance(target, _Builtin):
            if build is None:
                raise OpNotAvailableError(_C.messages.no_in_tree_kernel(op, name, dispatch.targets_for(op)))
            return self._dispatcher.fetch(role, slots, lambda: self._build_in_tree(key, build))
        builder = dispatch.builder(op, target)
        if builder is None:
            raise OpNotAvailableError(_C.messages.no_builder(target, op, dispatch.targets_for(op)))
        if not slots:
            raise OpNotAvailableError(_C.messages.not_wired(target, op, name))
        return self._dispatcher.fetch(role, slots, lambda: self._build_external(target, builder, name, slots))

    def _build_in_tree(self, key: Any, build: Callable[[], Any]) -> Any:
        kernel = self._in_tree_by_key.get(key) if key is not None else None
        if kernel is not None:
            return kernel
        kernel = build()
        if key is not None:
            try:
                self._in_tree_by_key[key] = kernel
            except TypeError:  # not weak-referenceable: simply not shared
                pass
        return kernel

    def _build_external(self, target: str, builder: Callable[..., Any], role: str, slots: tuple) -> Any:
        specs = tuple(_spec(t) for t in slots)
        params = self._entry.call_params(specs, self.params)
        try:
            kernel = builder(*specs, **params)
        except Exception as error:
            _note(error, _C.messages.builder_raised(target, type(self).__name__))
            raise
        if not callable(kernel):
            raise OpNotAvailableError(_C.messages.not_callable(target, type(self).__name__, role, _short_repr(kernel)))
        return kernel

    def _on_first_result(self, kernel: Any, result: Any, *args: Any) -> None:
        """Checks a freshly built kernel's first result against the manifest (E6)."""
        try:
            self._check_result(result, args)
        except BackendError:
            self._dispatcher.forget(*args)  # a wrong kernel is not kept
            raise

    def _check_result(self, result: Any, args: tuple[Any, ...]) -> None:
        if self._returns_input():
            return
        entry, name = self._entry, type(self).__name__
        specs = [_spec(t) for t in args]
        expected = entry.output_meta(specs, entry.call_params(specs, self.params))
        outputs = result if isinstance(result, tuple) else (result,)
        who = "the in-tree kernel" if self._settled is BUILTIN else f"target {self._settled!r}"
        messages = _C.messages
        if len(outputs) != len(expected) or not all(isinstance(o, torch.Tensor) for o in outputs):
            names = ", ".join(o.name for o in entry.outputs)
            raise BackendError(messages.wrong_result_count(name, who, _short_repr(result), len(expected), names))
        for decl, out, (dtype, shape) in zip(entry.outputs, outputs, expected):
            if out.dtype != dtype or tuple(out.shape) != tuple(shape):
                got, declared = f"{out.dtype} {tuple(out.shape)}", f"{dtype} {tuple(shape)}"
                raise BackendError(messages.wrong_result_meta(name, who, decl.name, got, declared))
            for arg in args:
                if isinstance(arg, torch.Tensor) and _aliases(out, arg):
                    raise BackendError(messages.result_aliases_input(name, who, decl.name))

    def _returns_input(self) -> bool:
        return False

    # ---- tracing ----------------------------------------------------------------------

    def _traced(self, *args: Any) -> Any:
        return _library.call_custom_op(self, args)

    def _on_trace(self, *args: Any) -> Any:
        return _library.call_custom_op(self, args)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in {**self.params, **self.extras}.items())
        return f"{type(self).__name__}({shown})"


Op._abstract = True  # type: ignore[attr-defined]


def _aliases(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    try:
        pointer = a.untyped_storage().data_ptr()
        return pointer != 0 and pointer == b.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # tensors without storage (subclasses)
        return False


def _note(error: BaseException, text: str) -> None:
    if hasattr(error, "add_note"):
        error.add_note(text)


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _decode_key(words: Sequence[int]) -> tuple:
    device = _runtime.decode_device(words[0], words[1])
    slots: list[Any] = []
    at = 2
    while at < len(words):
        if words[at] == -1:
            slots.append(None)
            at += 1
            continue
        dtype, ndim = words[at], words[at + 1]
        slots.append((_runtime.decode_dtype(dtype), tuple(words[at + 2 : at + 2 + ndim])))
        at += 2 + ndim
    return (device, *slots)
