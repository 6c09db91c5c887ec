"""``tileops check TARGET``: are the target's kernels right?

Every op the target registers (or ``--ops``) runs through the public op API with
``target=TARGET`` over its manifest workloads — scaled to CPU size on the CPU, as written
on an accelerator — plus the edge cases (one row, odd sizes, strided inputs), and is
compared with the manifest's reference at the tolerance of its dtype
(``tileops.testing.harness``). One row per op x dtype: cases passed, the worst absolute
error, and the first failure. Exit status 1 when any case fails.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections.abc import Sequence

from ._common import (
    Progress,
    Table,
    UsageError,
    add_json_option,
    add_selection_options,
    dtype_name,
    report,
    selection,
)


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "check",
        help="check a target's kernels against the manifest references",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_selection_options(parser)
    parser.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report (one testcase per case)")
    add_json_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..testing import harness

    chosen = selection(args)
    target, device = chosen.target, chosen.device
    cases = harness.cases(target, device=device, scale=chosen.scale, ops=chosen.ops)
    if not cases:
        raise UsageError(f"the manifest gives no workload for {', '.join(chosen.ops)}")
    progress = Progress("check", len(cases))
    outcomes = []
    for case in cases:
        outcomes.append(harness.measure(case))
        progress.step(str(case))
    table = summarise(target, device, chosen.scale, outcomes)
    if chosen.note():
        table.notes.insert(0, chosen.note())
    if args.junit:
        write_junit(args.junit, target, outcomes)
    failed = sum(not o.passed for o in outcomes)
    report(args, [table], {**chosen.facts(), "cases": len(outcomes), "failed": failed})
    return 1 if failed else 0


def summarise(target: str, device: str, scale: str, outcomes: Sequence) -> Table:
    from ..testing import references

    groups: dict[tuple[str, str], list] = {}
    for outcome in outcomes:
        groups.setdefault((outcome.case.op, dtype_name(outcome.case.dtype)), []).append(outcome)
    table = Table(
        f"check: target {target} on {device} (workloads scaled: {scale})",
        ["op", "dtype", "result", "cases", "worst abs error", "tolerance (rtol, atol)", "first failure"],
    )
    for (op, dtype), group in sorted(groups.items()):
        passed = sum(o.passed for o in group)
        errors = [o.max_abs_error for o in group if o.max_abs_error is not None]
        first = next((o.message for o in group if not o.passed), None)
        rtol, atol = references.tolerance(group[0].case.dtype, group[0].case.op)
        table.add(
            op,
            dtype,
            "pass" if passed == len(group) else "FAIL",
            f"{passed}/{len(group)}",
            max(errors) if errors else None,
            f"{rtol:g}, {atol:g}",
            _short(first),
        )
    failed = sum(not o.passed for o in outcomes)
    table.notes.append(
        f"{len(outcomes) - failed} passed, {failed} failed ({len(outcomes)} cases, {len(groups)} op x dtype)"
    )
    return table


def _short(message: str | None, limit: int = 160) -> str | None:
    if message is None:
        return None
    one = " ".join(message.split())
    return one if len(one) <= limit else one[: limit - 3] + "..."


def write_junit(path: str, target: str, outcomes: Sequence) -> None:
    failed = sum(not o.passed for o in outcomes)
    suite = ET.Element(
        "testsuite",
        name=f"tileops check {target}",
        tests=str(len(outcomes)),
        failures=str(failed),
        errors="0",
    )
    for outcome in outcomes:
        case = ET.SubElement(suite, "testcase", classname=f"{target}.{outcome.case.op}", name=str(outcome.case))
        if not outcome.passed:
            failure = ET.SubElement(case, "failure", message=_short(outcome.message, 400) or "")
            failure.text = outcome.message
    root = ET.Element("testsuites", tests=str(len(outcomes)), failures=str(failed))
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
