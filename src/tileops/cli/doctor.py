"""``tileops doctor``: why is my backend not picked up?

Reports the installed backends (entry point, distribution, version, module, the targets
it registered, the protocol version it declares), each load failure with its cause and
the fix, each detector's answer for the devices present here, the default target,
builders registered under op names no manifest declares (with the closest manifest
name), and the protocol version check. Exit status 1 when a backend failed to load, a
builder is registered under an undeclared op name, or a detector misbehaves.
"""

from __future__ import annotations

import argparse
import difflib
import re

from ._common import Table, add_json_option, claims, present_devices, report


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "doctor",
        help="diagnose backend discovery: load failures, detectors, misspelt op names",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_json_option(parser)
    parser.set_defaults(run=run)


_FIXES = (
    (
        r"written for tileops backend protocol",
        "install a release of the backend written for this tileops' protocol major, or the tileops it was written for",
    ),
    (
        r"TILEOPS_PROTOCOL_VERSION must be",
        "declare TILEOPS_PROTOCOL_VERSION as a (major, minor) pair of ints, e.g. tileops.backend.PROTOCOL_VERSION",
    ),
    (
        r"ImportError: cannot import name '\w+' from 'tileops",
        "the installed tileops is older than the protocol this backend uses: upgrade tileops",
    ),
    (
        r"ModuleNotFoundError: No module named 'tileops",
        "tileops itself is missing from this environment, or shadowed: install tileops",
    ),
    (
        r"ModuleNotFoundError: No module named '([\w.]+)'",
        "install the missing module {0!r} "
        "(a vendor runtime or dependency of the backend), or fix the entry point if it names "
        "a module that does not exist",
    ),
    (r"misinstall", "two installed packages claim one target: uninstall one of them (pip list)"),
)


def fix_for(line: str) -> str:
    """The advice for one load_failures() line."""
    for pattern, fix in _FIXES:
        match = re.search(pattern, line)
        if match:
            return fix.format(*match.groups())
    return (
        "the backend's import raised: fix the cause named here in the backend, or "
        "uninstall it (tileops keeps working without it)"
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from .. import _C, manifest
    from ..backend import PROTOCOL_VERSION, default_target, load_failures
    from ..backend.discovery import backends

    found = backends()
    failures = load_failures()
    ours = f"{PROTOCOL_VERSION[0]}.{PROTOCOL_VERSION[1]}"
    problems = 0

    installed = Table(
        "backends: installed (entry point group tileops.backends)",
        ["entry point", "distribution", "version", "module", "targets", "protocol", "status"],
    )
    protocol = Table(
        f"protocol: this tileops speaks backend protocol {ours}",
        ["entry point", "declared", "check"],
    )
    for b in found:
        declared = None if b.declared_protocol is None else "{:d}.{:d}".format(*b.declared_protocol)
        status = "loaded" if b.failure is None else "FAILED to load"
        installed.add(b.name, b.distribution, b.version, b.module, list(b.targets), declared or "undeclared", status)
        protocol.add(b.name, declared or "undeclared", _protocol_verdict(b, PROTOCOL_VERSION))
    if not found:
        installed.notes.append(
            "no backend is installed: pip install one (its pyproject declares an entry point "
            "in the group tileops.backends)"
        )

    failed = Table("load failures", ["entry point", "cause", "fix"])
    for line in failures:
        failed.add(line.split(" ", 1)[0], line, fix_for(line))
        problems += 1
    if not failures:
        failed.notes.append("none: every installed backend loaded")

    devices = present_devices()
    detectors = Table("detectors: each target's answer for the devices present", ["target", *devices])
    for target in sorted(t for t, _ in _detector_targets()):
        answers = []
        for name in devices:
            answer = claims(target, torch.device(name))
            if not isinstance(answer, bool):
                problems += 1  # a detector must return a bool and never raise
            answers.append("yes" if answer is True else "no" if answer is False else answer)
        detectors.add(target, *answers)
    for row in detectors.rows:
        # Legal (an opt-in backend), but the likeliest answer to "why is it not picked up".
        if "yes" not in row[1:]:
            detectors.notes.append(
                f"{row[0]}: claims none of the devices present; its ops run only where a "
                f"program names it (target={row[0]!r} or set_default_target), and "
                f"`tileops check {row[0]} --device D` checks it on D"
            )
    for name in devices:
        claimants = [row[0] for row in detectors.rows if row[1 + devices.index(name)] == "yes"]
        if len(claimants) > 1:
            detectors.notes.append(
                f"{name}: claimed by {claimants}; ops there need target= or tileops.backend.set_default_target"
            )

    chosen = default_target()
    default = Table("default target", ["default", "meaning"])
    if chosen is None:
        default.add("none", "device detection chooses per op instance (no program set a default)")
    else:
        default.add(
            repr(chosen) if not isinstance(chosen, str) else chosen, "set by set_default_target in this process"
        )

    declared_ops = manifest.all_entries()
    stray = Table(
        "builders under op names no manifest declares (never called)",
        ["op name", "target", "builder", "did you mean"],
        key="undeclared_ops",
    )
    for op, target in _C.process_registry.builder_keys():
        if op in declared_ops or op.endswith(":layout") and op.split(".", 1)[0] in declared_ops:
            continue  # a builder, or a weight layout (register_weight_layout) of a declared op
        close = difflib.get_close_matches(op, declared_ops, n=1, cutoff=0.5)
        stray.add(
            op, target, _C.process_registry.builder_name(op, target), f"did you mean {close[0]!r}?" if close else None
        )
        problems += 1
    if not stray.rows:
        stray.notes.append("none: every builder is registered under a manifest op name")

    tables = [installed, failed, detectors, default, stray, protocol]
    report(args, tables, {"protocol_version": list(PROTOCOL_VERSION), "problems": problems})
    return 1 if problems else 0


def _detector_targets() -> list[tuple[str, object]]:
    from .. import _C
    from ..backend import registered_targets

    registry = _C.process_registry
    return [(t, registry.detector(t)) for t in registered_targets() if registry.detector(t) is not None]


def _protocol_verdict(info, ours: tuple[int, int]) -> str:
    declared = info.declared_protocol
    if info.failure is not None and "protocol" in info.failure:
        return "FAILED: " + info.failure.split(": ", 2)[-1]
    if declared is None:
        if info.failure is not None:
            return "unknown (the import failed before it could be read)"
        return "accepted (no TILEOPS_PROTOCOL_VERSION declared)"
    if declared[1] > ours[1]:
        return (
            f"loaded, but written for a newer minor ({declared[0]}.{declared[1]} > "
            f"{ours[0]}.{ours[1]}): features it expects may be missing; upgrade tileops"
        )
    return "ok"
