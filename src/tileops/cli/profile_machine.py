"""``tileops profile-machine``: what this CPU sustains, measured.

Runs tileops' own C++ micro-kernels (tileops._C.machine) on every thread at once: a read
pass and a copy pass over a buffer larger than the caches (GB/s; a copy counts the bytes
read and written), and fp32 fused multiply-adds and bfloat16 dot products (vdpbf16ps) on
independent accumulator chains (GFLOP/s). Each figure is the best of its repeats: a
shared machine can evidently do at least that. A probe the CPU cannot run (no AVX-512
BF16) is reported as unavailable, not as an error. The profile is written to --out
(default $TILEOPS_MACHINE_PROFILE, else ~/.cache/tileops/machine.yaml), where
`tileops bench` finds it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
from pathlib import Path

from ._common import Progress, Table, UsageError, add_json_option, report
from ._profile import Profile, default_path


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "profile-machine",
        help="measure this CPU's bandwidth and peak FLOP/s into a profile for bench",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--out", metavar="F.yaml", default=None, help=f"where to write the profile (default: {default_path()})"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="threads to run on (default: every CPU this process may use)"
    )
    parser.add_argument(
        "--mib", type=int, default=256, help="bandwidth buffer size in MiB (default 256: past the caches)"
    )
    parser.add_argument("--repeats", type=int, default=7, help="repeats per probe (default 7)")
    parser.add_argument(
        "--ms", type=float, default=50.0, help="milliseconds per repeat of a compute probe (default 50)"
    )
    add_json_option(parser)
    parser.set_defaults(run=run)


def _threads(requested: int | None) -> int:
    if requested is None:
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:
            return os.cpu_count() or 1
    if requested < 1:
        raise UsageError(f"--threads: expected a positive number of threads, got {requested}")
    return requested


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def run(args: argparse.Namespace) -> int:
    from .. import _C

    probes = _C.machine
    threads = _threads(args.threads)
    if args.mib < 1 or args.repeats < 1 or not args.ms > 0:
        raise UsageError(f"--mib, --repeats and --ms must be positive, got {args.mib}, {args.repeats}, {args.ms}")
    out = Path(args.out) if args.out else default_path()
    progress = Progress("profile-machine", 4)
    table = Table(
        f"profile-machine: {cpu_name()}, {threads} thread(s)",
        ["probe", "best", "median", "unit", "how"],
    )
    bandwidth: dict[str, float | None] = {}
    peaks: dict[str, float | None] = {}
    unavailable: dict[str, str] = {}
    for kind in ("read", "copy"):
        rates = probes.bandwidth(kind, args.mib, threads, args.repeats)
        bandwidth[kind] = round(max(rates), 2)
        table.add(
            f"{kind} bandwidth",
            max(rates),
            statistics.median(rates),
            "GB/s",
            f"{args.mib} MiB, {'bytes read + written' if kind == 'copy' else 'bytes read'}",
        )
        progress.step(f"{kind} bandwidth")
    rates = probes.fp32_fma_peak(threads, args.repeats, args.ms)
    peaks["fp32_fma"] = round(max(rates), 2)
    table.add(
        "fp32 FMA peak", max(rates), statistics.median(rates), "GFLOP/s", f"{probes.fp32_fma_isa()}, an FMA is 2 FLOP"
    )
    progress.step("fp32 FMA")
    missing = probes.bf16_dot_missing()
    if missing:
        peaks["bf16_dot"] = None
        unavailable["bf16_dot"] = missing
        table.add("bf16 dot peak", None, None, "GFLOP/s", f"unavailable: {missing}")
    else:
        rates = probes.bf16_dot_peak(threads, args.repeats, args.ms)
        peaks["bf16_dot"] = round(max(rates), 2)
        table.add(
            "bf16 dot peak",
            max(rates),
            statistics.median(rates),
            "GFLOP/s",
            "avx512bf16 vdpbf16ps, 64 FLOP per instruction",
        )
    progress.step("bf16 dot")
    profile = Profile(
        name=cpu_name(),
        kind="cpu",
        source="measured",
        bandwidth_gbps=bandwidth,
        peak_gflops=peaks,
        calibration={"bandwidth": 1.0, "compute": 1.0},
        unavailable=unavailable,
        details={
            "threads": threads,
            "mib": args.mib,
            "repeats": args.repeats,
            "fp32_fma_isa": probes.fp32_fma_isa(),
            "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(),
        },
    )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(profile.to_yaml())
    except OSError as error:
        raise UsageError(f"--out: cannot write the profile to {str(out)!r}: {error}") from None
    table.notes.append(f"profile written to {out}")
    report(
        args,
        [table],
        {"profile": str(out), "bandwidth_gbps": bandwidth, "peak_gflops": peaks, "unavailable": unavailable},
    )
    return 0
