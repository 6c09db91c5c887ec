"""What every command shares: usage errors, tables (rich on a terminal, plain text
elsewhere), ``--json``, progress on stderr, and the checks of TARGET, ``--ops`` and
``--device`` with errors that name what was expected and what arrived."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import Any


class UsageError(Exception):
    """A command line that cannot be carried out; the message says why and what to do."""


# ---- tables -----------------------------------------------------------------------------


@dataclasses.dataclass
class Table:
    """Rows of cells under named columns; what every command prints and ``--json`` writes."""

    title: str
    columns: list[str]
    rows: list[list[Any]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    key: str | None = None  # its name under "tables" in --json (default: from the title)

    def add(self, *cells: Any) -> None:
        assert len(cells) == len(self.columns), (cells, self.columns)
        self.rows.append(list(cells))

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row)) for row in self.rows]


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(cell(v) for v in value) or "-"
    return str(value)


def plain(table: Table) -> str:
    """The table as aligned plain text (for pipes, files and tests)."""
    texts = [[cell(v) for v in row] for row in table.rows]
    widths = [max([len(c)] + [len(r[i]) for r in texts]) for i, c in enumerate(table.columns)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [table.title, line(table.columns), line("-" * w for w in widths)]
    out += [line(r) for r in texts]
    out += table.notes
    return "\n".join(out)


def _rich_console() -> Any:
    if not sys.stdout.isatty() or os.environ.get("TILEOPS_PLAIN"):
        return None
    try:
        from rich.console import Console  # optional extra: tileops[cli]
    except ImportError:
        return None
    return Console()


def show(tables: Sequence[Table]) -> None:
    """Print tables: with rich on a terminal where it is installed, else plain text."""
    console = _rich_console()
    for index, table in enumerate(tables):
        if console is None:
            print(("\n" if index else "") + plain(table))
            continue
        from rich.table import Table as RichTable

        rich = RichTable(title=table.title, title_justify="left")
        for column in table.columns:
            rich.add_column(column)
        for row in table.rows:
            rich.add_row(*(cell(v) for v in row))
        console.print(rich)
        for note in table.notes:
            console.print(note, markup=False, highlight=False)


def add_selection_options(parser: argparse.ArgumentParser) -> None:
    """TARGET, --ops, --device and --scale: what check and bench run, and on what."""
    parser.add_argument("target", metavar="TARGET", help="a registered target, e.g. native_cpu")
    parser.add_argument("--ops", metavar="A,B", help="only these ops (default: every op it registers)")
    parser.add_argument(
        "--device",
        metavar="D",
        help="the device to run on, claimed by TARGET's detector or not (an explicit target "
        "skips detection; the output says when it is not claimed); default: the first "
        "device present that TARGET claims",
    )
    parser.add_argument(
        "--scale",
        choices=("tiny", "small", "cpu", "full"),
        default=None,
        help="workload sizes: 'full' as written, 'cpu' scaled to at most 2**21 elements per "
        "tensor, 'small' to 2**18, 'tiny' a few hundred (default: 'cpu' on the CPU, 'full' "
        "elsewhere)",
    )


@dataclasses.dataclass(frozen=True)
class Selection:
    """What check and bench run, and on what: add_selection_options' arguments, checked."""

    target: str
    ops: list[str]
    device: str
    scale: str
    detector: bool | str  # the target's detector's answer for the device (see claims())

    @property
    def claimed(self) -> bool:
        return self.detector is True

    def note(self) -> str | None:
        """The line that says the target runs on a device its detector does not claim."""
        return None if self.claimed else unclaimed_note(self.target, self.device, self.detector)

    def facts(self) -> dict[str, Any]:
        """The selection's fields for ``--json``."""
        return {
            "target": self.target,
            "device": self.device,
            "scale": self.scale,
            "claimed": self.claimed,
            "detector": self.detector,
        }


def selection(args: argparse.Namespace) -> Selection:
    """add_selection_options' arguments, each checked."""
    target = check_target(args.target)
    ops = check_ops(args.ops, target)
    device, detector = check_device(args.device, target)
    return Selection(target, ops, device, args.scale or default_scale(device), detector)


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        metavar="FILE",
        nargs="?",
        const="-",
        default=None,
        help="write the result as JSON: to FILE, or to stdout instead of the table when FILE is omitted",
    )


def report(args: argparse.Namespace, tables: Sequence[Table], extra: dict | None = None) -> None:
    """The command's output: the tables, and ``--json`` when asked for."""
    payload = {
        "command": args.command,
        **(extra or {}),
        "tables": {(t.key or _key(t.title)): {"title": t.title, "rows": t.records(), "notes": t.notes} for t in tables},
    }
    where = getattr(args, "json", None)
    if where == "-":
        json.dump(payload, sys.stdout, indent=2, default=str)
        print()
        return
    show(tables)
    if where is not None:
        with open(where, "w") as out:
            json.dump(payload, out, indent=2, default=str)


def _key(title: str) -> str:
    return title.split(":")[0].strip().lower().replace(" ", "_")


# ---- progress ---------------------------------------------------------------------------


class Progress:
    """``done/total label`` on stderr: redrawn in place on a terminal, else a line every
    few seconds (and the last), so a long run shows it is alive without flooding logs."""

    def __init__(self, what: str, total: int, every: float = 5.0) -> None:
        self.what, self.total, self.every = what, total, every
        self.tty = sys.stderr.isatty()
        self.last = 0.0
        self.done = 0

    def step(self, label: str) -> None:
        self.done += 1
        now = time.monotonic()
        text = f"{self.what}: {self.done}/{self.total} {label}"
        if self.tty:
            sys.stderr.write("\r\x1b[K" + text[:150])
            if self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()
        elif now - self.last >= self.every or self.done == self.total:
            self.last = now
            print(text, file=sys.stderr, flush=True)


# ---- checks of the common arguments -----------------------------------------------------


def load_note() -> str:
    from ..backend import load_failures

    failed = load_failures()
    if not failed:
        return ""
    return f" ({len(failed)} backend(s) failed to load; run `tileops doctor` to see why)"


def check_target(target: str) -> str:
    """TARGET must be registered by an installed backend."""
    from ..backend import registered_targets

    known = registered_targets()
    if target in known:
        return target
    close = difflib.get_close_matches(target, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UsageError(
        f"TARGET: no installed backend registers target {target!r}{hint}; registered targets: {known}{load_note()}"
    )


def target_ops(target: str) -> list[str]:
    """The manifest ops ``target`` has a builder for, sorted."""
    from .. import manifest
    from ..backend import registered_targets

    return sorted(op for op in manifest.all_entries() if target in registered_targets(op))


def op_names(text: str, examples: Sequence[str]) -> list[str]:
    """``--ops A,B``: manifest op names, comma-separated, each once, in order. A name no
    manifest declares is refused with the closest one; ``examples`` are the names the
    error offers."""
    from .. import manifest

    known = manifest.all_entries()
    chosen: list[str] = []
    for raw in text.split(","):
        op = raw.strip()
        if not op or op in chosen:
            continue
        if op not in known:
            close = difflib.get_close_matches(op, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UsageError(
                f"--ops: {op!r} is not an op any manifest declares{hint}; expected names such as {', '.join(examples)}"
            )
        chosen.append(op)
    if not chosen:
        raise UsageError(f"--ops names no op; give manifest op names, comma-separated, such as {examples[0]}")
    return chosen


def check_ops(text: str | None, target: str) -> list[str]:
    """``--ops A,B``: manifest op names the target registers; default every one it does."""
    from .. import manifest

    served = target_ops(target)
    if text is None:
        if not served:
            raise UsageError(f"target {target!r} registers no builder for any manifest op")
        return served
    chosen = op_names(text, served[:5] or sorted(manifest.all_entries())[:5])
    for op in chosen:
        if op not in served:
            raise UsageError(
                f"--ops: target {target!r} registers no builder for {op}; it registers: {', '.join(served) or 'none'}"
            )
    return chosen


def present_devices() -> list[str]:
    """Devices worth asking detectors about here: the CPU, each visible accelerator, meta."""
    import torch

    out = ["cpu"]
    for kind in ("cuda", "xpu"):
        module = getattr(torch, kind, None)
        try:
            count = module.device_count() if module is not None and module.is_available() else 0
        except Exception:  # noqa: BLE001 - a broken driver means: none here
            count = 0
        out += [f"{kind}:{i}" for i in range(count)]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append("mps")
    out.append("meta")
    return out


def claims(target: str, device: Any) -> bool | str:
    """The target's detector's answer for ``device``: True, False, or why it failed."""
    from .. import _C

    detect = _C.process_registry.detector(target)
    if detect is None:
        return "no detector"
    try:
        answer = detect(device)
    except Exception as error:  # noqa: BLE001 - reported, not raised
        return f"raised {type(error).__name__}: {error}"
    return answer if isinstance(answer, bool) else f"returned {answer!r}, not a bool"


def detector_said(answer: bool | str) -> str:
    """claims()' answer as words: 'answered False', 'raised ...', 'is missing'."""
    if answer is True or answer is False:
        return f"answered {answer}"
    return "is missing (the target registered none)" if answer == "no detector" else answer


def unclaimed_note(target: str, device: str, answer: bool | str, named_by: str = "the command line") -> str:
    """Why ``target`` runs on ``device`` although its detector does not claim it."""
    return (
        f"not claimed: {target}'s detect() {detector_said(answer)} for {device}; it runs there "
        f"because {named_by} names it explicitly, as target={target!r} does in a program (an "
        f"explicit target skips detection); device detection alone will not choose {target} "
        f"on {device}"
    )


def check_device(text: str | None, target: str) -> tuple[str, bool | str]:
    """``--device`` and the target's detector's answer for it: any torch device that can
    hold a tensor here, claimed or not (the protocol lets an explicit target serve any
    device, so an opt-in backend whose detector claims nothing can still be checked);
    default the first present device the detector claims."""
    import torch

    if text is None:
        for name in present_devices():
            if claims(target, torch.device(name)) is True:
                return name, True
        raise UsageError(
            f"target {target!r} claims none of the devices present here "
            f"({', '.join(present_devices())}); expected a detector that claims one, or pass "
            f"--device D to run it on D anyway (a target named explicitly needs no claim)"
        )
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError, TypeError) as error:
        raise UsageError(
            f"--device: expected a torch device such as 'cpu' or 'cuda:0', got {text!r} ({error})"
        ) from None
    # The detector's answer does not gate an explicit device, so a device absent from this
    # machine is refused here, once, rather than failing every case with the same error.
    try:
        torch.empty(0, device=device)
    except Exception as error:  # noqa: BLE001 - whatever torch raises means: not usable here
        # torch's dispatcher errors list every backend: its first line is the news
        why = re.split(r"(?<=\.)\s", str(error).strip() or "no message", maxsplit=1)[0][:200]
        raise UsageError(
            f"--device: expected a device present on this machine ({', '.join(present_devices())}"
            f" or one a backend's runtime provides), got {str(device)!r}, which cannot hold a "
            f"tensor here ({type(error).__name__}: {why}); pass a device that is present"
        ) from None
    return str(device), claims(target, device)


def default_scale(device: str) -> str:
    """Workloads as written on accelerators; scaled to CPU size on the CPU (and meta)."""
    return "cpu" if device.split(":")[0] in ("cpu", "meta") else "full"


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")
