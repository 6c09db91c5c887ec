"""``tileops new-backend``: a backend package from the template.

    tileops new-backend NAME [--device-type TYPE] [--ops OP,...] [--dest DIR]

writes ``DIR/tileops-backend-NAME/``: a backend package (module ``tileops_NAME``,
target ``NAME``) laid out like ``backends/example``, with a detector for TYPE and, for
each chosen op, a builder stub whose signature is the op's manifest signature. The stubs
raise an error naming the op, the target and what they received, so the package installs
and its four test files pass as generated; writing the kernels is what is left.
"""

from __future__ import annotations

import argparse
import keyword
import os
import re
import shutil
import string
import uuid
from collections.abc import Sequence
from pathlib import Path

from ._common import UsageError, op_names

TEMPLATES = Path(__file__).resolve().parents[1] / "templates" / "new_backend"

#: Template file (relative to TEMPLATES) -> file written, relative to the new package's
#: folder; ``{module}`` is the backend's module name.
LAYOUT = {
    "pyproject.toml.tmpl": "pyproject.toml",
    "README.md.tmpl": "README.md",
    "gitignore.tmpl": ".gitignore",
    "package/__init__.py.tmpl": "src/{module}/__init__.py",
    "package/kernels.py.tmpl": "src/{module}/kernels.py",
    "tests/conftest.py.tmpl": "tests/conftest.py",
    "tests/test_discovery.py.tmpl": "tests/test_discovery.py",
    "tests/test_errors.py.tmpl": "tests/test_errors.py",
    "tests/test_takeover.py.tmpl": "tests/test_takeover.py",
    "tests/test_memoization.py.tmpl": "tests/test_memoization.py",
}

DEFAULT_OPS = ("RMSNormFwdOp",)
_LOWER_IDENTIFIER = re.compile(r"[a-z][a-z0-9_]*")


# ---- validation ----------------------------------------------------------------------


def check_name(name: str) -> str:
    """A backend NAME: a lowercase Python identifier (it becomes ``tileops_NAME``)."""
    if not _LOWER_IDENTIFIER.fullmatch(name) or keyword.iskeyword(name):
        raise UsageError(
            f"NAME must be a lowercase Python identifier — a letter, then letters, digits "
            f"or underscores, not a keyword — because it becomes the module tileops_NAME "
            f"and the target name; got {name!r}"
        )
    return name


def check_device_type(device_type: str) -> str:
    """A torch device type as ``torch.device(...).type`` spells it (``cuda``, ``meta``, ...)."""
    if not _LOWER_IDENTIFIER.fullmatch(device_type):
        raise UsageError(
            f"--device-type must be a torch device type such as 'cuda', 'xpu', 'meta' or "
            f"'privateuseone' (lowercase letters, digits, underscores), got {device_type!r}"
        )
    return device_type


def check_ops(text: str | None) -> tuple[str, ...]:
    """The ``--ops`` list: manifest op names, comma-separated, each once (any op: a new
    backend may stub what no target serves yet)."""
    from .. import manifest

    if text is None:
        return DEFAULT_OPS
    return tuple(op_names(text, sorted(manifest.all_entries())))


# ---- code generated from the manifest ------------------------------------------------


def builder_name(op: str) -> str:
    """``RMSNormFwdOp`` -> ``build_rms_norm_fwd``."""
    stem = op.removesuffix("Op")
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", stem).lower()
    return f"build_{snake}"


def _input_rule(decl) -> str:
    from ..manifest._types import dtype_rule_text

    rule = f"same_as({decl.same_as})" if decl.same_as else dtype_rule_text(decl.dtypes)
    flags = [flag for flag, on in (("optional", decl.optional), ("mutated", decl.mutated)) if on]
    return rule + (f"  [{', '.join(flags)}]" if flags else "")


def builder_stub(op: str) -> str:
    """The stub builder of ``op``: its manifest signature, a comment quoting the manifest,
    and a body that raises the "no kernel yet" error."""
    from .. import manifest

    entry = manifest.entry(op)
    lines = [f"# {op} ({entry.source.name})", "#   inputs, in the order they arrive:"]
    for decl in entry.inputs:
        lines.append(f"#     {decl.name}: {_input_rule(decl)}")
    if entry.params:
        lines.append("#   params, by name, as concrete values (defaults and None resolved):")
        for p in entry.params:
            default = "required" if p.required else f"default {p.default!r}"
            lines.append(f"#     {p.name}: {p.type}  ({default})")
    lines.append(f"#   kernel roles in tileops (never handed over): {', '.join(entry.kernel_map)}")

    args = [f"{d.name}: TensorSpec | None" if d.optional else f"{d.name}: TensorSpec" for d in entry.inputs]
    params = [p.name for p in entry.params]
    if params:
        args += ["*", *params]
    head = f"def {builder_name(op)}({', '.join(args)}):"
    if len(head) > 88:
        head = f"def {builder_name(op)}(\n" + "".join(f"    {a},\n" for a in args) + "):"
    specs = ", ".join(f'"{d.name}": {d.name}' for d in entry.inputs)
    values = ", ".join(f'"{p}": {p}' for p in params)
    lines += [
        head,
        f"    specs = {{{specs}}}",
        f"    params = {{{values}}}",
        f'    raise _no_kernel_yet("{op}", specs, params)',
    ]
    return "\n".join(lines)


def registration(op: str) -> str:
    return f'register_kernel_builder(op="{op}", target=TARGET, build_kernel={builder_name(op)})'


# ---- writing the package -------------------------------------------------------------


def _values(name: str, device_type: str, ops: Sequence[str]) -> dict[str, str]:
    from .. import manifest
    from ..backend import PROTOCOL_VERSION

    module = f"tileops_{name}"
    others = [op for op in sorted(manifest.all_entries()) if op not in ops]
    other_op = "SoftmaxFwdOp" if "SoftmaxFwdOp" in others else (others[0] if others else None)
    return {
        "name": name,
        "target": name,
        "module": module,
        "dist": f"tileops-backend-{name}",
        "device_type": device_type,
        "protocol_version": repr(tuple(PROTOCOL_VERSION)),
        "ops_literal": repr(list(ops)),
        "other_op_literal": repr(other_op),
        "class_prefix": name.title().replace("_", ""),
        "ops_table": "\n".join(f"| `{op}` | `{builder_name(op)}` | `{manifest.entry(op).source.name}` |" for op in ops),
        "builders": "\n\n\n".join(builder_stub(op) for op in ops),
        "registrations": "\n".join(registration(op) for op in ops),
    }


def render(template: str, values: dict[str, str]) -> str:
    return string.Template((TEMPLATES / template).read_text()).substitute(values)


def new_backend(
    name: str,
    *,
    device_type: str | None = None,
    ops: Sequence[str] | None = None,
    dest: str | os.PathLike[str] = ".",
) -> Path:
    """Write the package ``dest/tileops-backend-NAME`` and return its folder.

    Everything is written into a temporary sibling first and renamed into place, so a
    failure leaves no half-written package behind.
    """
    check_name(name)
    device_type = check_device_type(device_type if device_type is not None else name)
    ops = check_ops(",".join(ops)) if ops is not None else DEFAULT_OPS
    parent = Path(dest)
    if parent.exists() and not parent.is_dir():
        raise UsageError(f"--dest {str(parent)!r} is a file, not a directory")
    folder = parent / f"tileops-backend-{name}"
    if folder.exists() or folder.is_symlink():
        raise UsageError(f"{str(folder)!r} already exists; refusing to overwrite it. Remove it, or pass another --dest")
    values = _values(name, device_type, ops)
    parent.mkdir(parents=True, exist_ok=True)
    staging = parent / f".{folder.name}.partial-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        for template, target in LAYOUT.items():
            path = staging / target.format(module=values["module"])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render(template, values))
        os.rename(staging, folder)  # fails rather than merging if folder appeared meanwhile
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder


# ---- command line --------------------------------------------------------------------


def add_parser(commands: argparse._SubParsersAction) -> None:
    new = commands.add_parser(
        "new-backend",
        help="write a new backend package from the template",
        description=(
            "Write DEST/tileops-backend-NAME: a backend package (module tileops_NAME, target "
            "NAME) whose builders are stubs with each op's manifest signature. It installs "
            "with `pip install -e .` and its tests pass as generated."
        ),
    )
    new.add_argument("name", metavar="NAME", help="target name, lowercase identifier (e.g. acme)")
    new.add_argument(
        "--device-type",
        metavar="TYPE",
        default=None,
        help="the torch device type the detector claims (default: NAME)",
    )
    new.add_argument(
        "--ops",
        metavar="OP,...",
        default=None,
        help=f"manifest ops to write builder stubs for (default: {','.join(DEFAULT_OPS)})",
    )
    new.add_argument(
        "--dest",
        metavar="DIR",
        default=".",
        help="folder in which tileops-backend-NAME is created (default: current folder)",
    )
    new.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    ops = check_ops(args.ops)
    folder = new_backend(args.name, device_type=args.device_type, ops=ops, dest=args.dest)
    module = f"tileops_{args.name}"
    print(
        f"wrote {folder}\n"
        f"  target {args.name!r}, module {module}, builder stubs for: {', '.join(ops)}\n"
        f"next:\n"
        f"  cd {folder}\n"
        f"  pip install -e . --no-deps     # into an environment that has tileops\n"
        f"  python -m pytest -q            # passes as generated\n"
        f"then write the kernels in src/{module}/kernels.py and return them from the builders."
    )
    return 0
