"""``tileops bench TARGET``: how close are the target's kernels to the machine's limit?

For every op the target registers (or --ops) and each manifest workload (scaled to CPU
size on the CPU), the op runs with target=TARGET and the baseline runs beside it,
interleaved round by round so that a noisy machine slows both alike. Reported per case:
the median time per call and its interquartile range; GB/s and GFLOP/s from the
manifest's roofline (bytes and FLOP of one call); the share of this machine's roofline,
min(peak, intensity x bandwidth), from the machine profile (tileops profile-machine, or
a shipped GPU profile); and the speed-up over the baseline.

Baselines: 'eager' is the op's reference in PyTorch eager (tileops.testing.references,
the manifest's ref_api) computed in the inputs' dtype, as a user's call would be;
'compile' is that under torch.compile; any other name is another registered target.
Exit status 1 when a case fails to run.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from ._common import (
    Progress,
    Table,
    UsageError,
    add_json_option,
    add_selection_options,
    claims,
    dtype_name,
    report,
    selection,
    unclaimed_note,
)


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "bench",
        help="time a target's kernels against the roofline and a baseline",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_selection_options(parser)
    parser.add_argument(
        "--baseline",
        default="eager",
        metavar="eager|compile|TARGET",
        help="what the speed-up is against (default: eager)",
    )
    parser.add_argument(
        "--profile",
        metavar="F.yaml|NAME",
        help="machine profile: a file, or a shipped one (h200, h20); default: the "
        "one profile-machine wrote, or the shipped profile of the GPU present",
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument(
        "--min-time",
        type=float,
        default=0.02,
        metavar="S",
        help="seconds each side is timed per round, at least 3 calls (default 0.02)",
    )
    parser.add_argument("--csv", metavar="F", help="write CSV: one metric per row")
    parser.add_argument("--plot", metavar="F.png", help="draw a roofline chart (needs matplotlib)")
    add_json_option(parser)
    parser.set_defaults(run=run)


def _check_plot(path: str | None) -> None:
    if path is None:
        return
    try:
        import matplotlib  # noqa: F401 - optional extra: tileops[cli]
    except ImportError:
        raise UsageError(
            "--plot needs matplotlib, which is not installed here; pip install 'tileops[cli]' "
            "(or matplotlib), or leave out --plot"
        ) from None
    if not path.lower().endswith(".png"):
        raise UsageError(f"--plot: expected a .png file name, got {path!r}")


def _sync_for(device: str) -> Callable[[], None]:
    import torch

    kind = device.split(":")[0]
    module = getattr(torch, kind, None)
    if kind != "cpu" and module is not None and hasattr(module, "synchronize"):
        return module.synchronize
    return lambda: None


def _baseline(name: str, case: Any, target: str) -> tuple[str, Callable[..., Any]]:
    """(label, callable over the case's inputs)."""
    from .. import manifest, ops
    from ..backend import TensorSpec
    from ..testing import harness, references

    entry = manifest.entry(case.op)
    if name in ("eager", "compile"):
        op = getattr(ops, case.op)(**harness.constructor_args(case), target=target)
        inputs = harness.make_inputs(case, full=True)
        specs = [None if t is None else TensorSpec(t.device, t.dtype, tuple(t.shape)) for t in inputs]
        params = entry.call_params(specs, op.params)
        fn = references.reference(case.op)
        if name == "compile":
            import torch

            fn = torch.compile(fn, dynamic=False)
        return name, lambda *tensors: fn(*tensors, **params)
    op = getattr(ops, case.op)(**harness.constructor_args(case), target=name)
    return name, op


def _time(fn: Callable[..., Any], inputs: list, sync: Callable[[], None], min_time: float) -> list[float]:
    """Seconds of single calls over about ``min_time`` (at least 3)."""
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < 3 or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn(*inputs)
        sync()
        samples.append(time.perf_counter() - t0)
        if len(samples) >= 10_000:
            break
    return samples


def _quartiles(samples: list[float]) -> tuple[float, float, float]:
    if len(samples) < 2:
        return samples[0], samples[0], samples[0]
    q1, q2, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return q1, q2, q3


def measure(case: Any, target: str, baseline: str, rounds: int, min_time: float) -> dict[str, Any]:
    from .. import manifest, ops
    from ..backend import TensorSpec
    from ..testing import harness

    entry = manifest.entry(case.op)
    op = getattr(ops, case.op)(**harness.constructor_args(case), target=target)
    inputs = harness.make_inputs(case, full=True)
    base_label, base = _baseline(baseline, case, target)
    base_inputs = [None if t is None else t.clone() for t in inputs]
    sync = _sync_for(case.device)
    # warm-up: builds (and compiles) outside the timing
    op(*inputs)
    base(*base_inputs)
    sync()
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(rounds):
        ours += _time(op, inputs, sync, min_time)
        theirs += _time(base, base_inputs, sync, min_time)
    specs = [None if t is None else TensorSpec(t.device, t.dtype, tuple(t.shape)) for t in inputs]
    flops, nbytes = entry.roofline(specs, op.params)
    q1, median, q3 = _quartiles(ours)
    return {
        "median_s": median,
        "iqr_s": q3 - q1,
        "flops": flops,
        "bytes": nbytes,
        "baseline": base_label,
        "baseline_median_s": statistics.median(theirs),
        "calls": len(ours),
    }


def run(args: argparse.Namespace) -> int:
    from .. import manifest
    from ..backend import registered_targets
    from ..testing import harness, references
    from . import _profile

    chosen = selection(args)
    target, ops, device, scale = chosen.target, chosen.ops, chosen.device, chosen.scale
    _check_plot(args.plot)
    if args.rounds < 1 or not args.min_time > 0:
        raise UsageError(f"--rounds and --min-time must be positive, got {args.rounds}, {args.min_time}")
    if args.baseline not in ("eager", "compile"):
        if args.baseline not in registered_targets():
            raise UsageError(
                f"--baseline: expected 'eager', 'compile' or a registered target "
                f"({', '.join(registered_targets())}), got {args.baseline!r}"
            )
        if args.baseline == target:
            raise UsageError(f"--baseline: {target!r} is the target itself; choose another")
        missing = [op for op in ops if args.baseline not in registered_targets(op)]
        if missing:
            raise UsageError(
                f"--baseline: target {args.baseline!r} registers no builder for "
                f"{', '.join(missing)}; pass --ops with ops both targets serve"
            )
    profile = _profile.load(args.profile) if args.profile else _profile.for_device(device)
    cases = [
        harness.Case(op, workload, dict(shapes), dict(params), dtype, target, device)
        for op in ops
        for workload, shapes, params, dtype in manifest.entry(op).workload_cases(scale)
    ]
    progress = Progress("bench", len(cases))
    results: list[dict[str, Any]] = []
    # the baselines compute in the inputs' dtype, as a PyTorch user's call does (the
    # references' float32 math is for judging numerics, not for timing)
    with references.in_input_dtype():
        _bench(cases, target, args, profile, progress, results)
    table = _table(target, device, scale, args.baseline, profile, results)
    notes = [chosen.note(), _baseline_note(args.baseline, device)]
    table.notes[:0] = [n for n in notes if n]
    if args.csv:
        _write_csv(args.csv, target, device, results)
    if args.plot:
        _plot(args.plot, target, device, profile, results)
        table.notes.append(f"roofline chart written to {args.plot}")
    if args.csv:
        table.notes.append(f"CSV written to {args.csv}")
    failed = sum("error" in r for r in results)
    report(
        args,
        [table],
        {
            **chosen.facts(),
            "baseline": args.baseline,
            "profile": None
            if profile is None
            else {
                "name": profile.name,
                "source": profile.source,
                "path": profile.path,
                "bandwidth_gbps": profile.bandwidth,
                "peak_gflops": profile.peak_gflops,
            },
            "failed": failed,
            "results": results,
        },
    )
    return 1 if failed else 0


def _baseline_note(baseline: str, device: str) -> str | None:
    """A baseline target runs on ``device`` as TARGET does: named, claimed or not."""
    import torch

    if baseline in ("eager", "compile"):
        return None
    answer = claims(baseline, torch.device(device))
    if answer is True:
        return None
    return "baseline " + unclaimed_note(baseline, device, answer, named_by="--baseline")


def _bench(
    cases: list, target: str, args: argparse.Namespace, profile: Any, progress: Progress, results: list[dict[str, Any]]
) -> None:
    for case in cases:
        row: dict[str, Any] = {
            "op": case.op,
            "workload": case.workload,
            "dtype": dtype_name(case.dtype),
            "shapes": " ".join(f"{k}{list(v)}" for k, v in case.shapes.items() if v is not None),
        }
        try:
            row.update(measure(case, target, args.baseline, args.rounds, args.min_time))
        except Exception as error:  # noqa: BLE001 - reported per case
            row["error"] = f"{type(error).__name__}: {error}"
        results.append(_derive(row, profile))
        progress.step(f"{case.op} {case.workload} {row['dtype']}")


def _derive(row: dict[str, Any], profile: Any) -> dict[str, Any]:
    if "error" in row:
        return row
    t = row["median_s"]
    row["gbps"] = row["bytes"] / t / 1e9
    row["gflops"] = row["flops"] / t / 1e9
    row["speedup"] = row["baseline_median_s"] / t
    row["roofline_pct"] = None
    if profile is not None:
        bandwidth = profile.bandwidth
        roof_name, peak = profile.compute(row["dtype"])
        # the seconds the roofline allows: the slower of moving the bytes and doing the FLOP
        memory_s = row["bytes"] / (bandwidth * 1e9) if bandwidth and row["bytes"] else 0.0
        compute_s = row["flops"] / (peak * 1e9) if peak and row["flops"] else 0.0
        if memory_s or compute_s:
            row["roofline_pct"] = 100.0 * max(memory_s, compute_s) / t
            row["bound"] = "memory" if memory_s >= compute_s else "compute"
        row["compute_roof"] = roof_name
    return row


def _table(target, device, scale, baseline, profile, results) -> Table:
    table = Table(
        f"bench: target {target} on {device} (workloads scaled: {scale}; baseline: {baseline})",
        [
            "op",
            "workload",
            "dtype",
            "median us",
            "IQR us",
            "GB/s",
            "GFLOP/s",
            "% roofline",
            "bound",
            f"{baseline} us",
            "speed-up",
        ],
    )
    for r in results:
        if "error" in r:
            table.add(r["op"], r["workload"], r["dtype"], "ERROR", None, None, None, None, None, None, r["error"][:120])
            continue
        table.add(
            r["op"],
            r["workload"],
            r["dtype"],
            r["median_s"] * 1e6,
            r["iqr_s"] * 1e6,
            r["gbps"],
            r["gflops"],
            None if r["roofline_pct"] is None else f"{r['roofline_pct']:.0f}%",
            r.get("bound"),
            r["baseline_median_s"] * 1e6,
            f"{r['speedup']:.2f}x",
        )
    if profile is None:
        table.notes.append(
            "no machine profile: % roofline left out; run `tileops profile-machine` (or pass --profile) to get it"
        )
    else:
        _, bf16 = profile.compute("bfloat16")
        _, fp32 = profile.compute("float32")
        table.notes.append(
            f"roofline of {profile.name} ({profile.source}{', ' + profile.path if profile.path else ''}): "
            f"{_fmt(profile.bandwidth)} GB/s, fp32 {_fmt(fp32)} GFLOP/s, bf16 {_fmt(bf16)} GFLOP/s"
        )
    ok = [r for r in results if "error" not in r]
    if any((r.get("roofline_pct") or 0) > 100 for r in ok):
        table.notes.append(
            "above 100%: the workload fits in a cache, whose bandwidth is above the profile's "
            "(measured past the caches, or the datasheet's memory bandwidth)"
        )
    if ok:
        geo = math.exp(statistics.fmean(math.log(r["speedup"]) for r in ok))
        table.notes.append(f"geometric mean speed-up over {baseline}: {geo:.2f}x ({len(ok)} cases)")
    return table


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


_METRICS = (  # (result key, metric name, unit, scale)
    ("median_s", "median", "us", 1e6),
    ("iqr_s", "iqr", "us", 1e6),
    ("gbps", "bandwidth", "GB/s", 1.0),
    ("gflops", "compute", "GFLOP/s", 1.0),
    ("roofline_pct", "roofline", "%", 1.0),
    ("baseline_median_s", "baseline_median", "us", 1e6),
    ("speedup", "speedup", "x", 1.0),
)


def _write_csv(path: str, target: str, device: str, results: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(
            ["target", "device", "op", "workload", "dtype", "shapes", "baseline", "metric", "value", "unit"]
        )
        for r in results:
            head = [target, device, r["op"], r["workload"], r["dtype"], r["shapes"], r.get("baseline")]
            if "error" in r:
                writer.writerow([*head, "error", r["error"], ""])
                continue
            for key, metric, unit, factor in _METRICS:
                value = r.get(key)
                if value is not None:
                    writer.writerow([*head, metric, f"{value * factor:.6g}", unit])


def _plot(path: str, target: str, device: str, profile: Any, results: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [r for r in results if "error" not in r and r["flops"] and r["bytes"]]
    names = sorted({r["op"] for r in points})
    fig, ax = plt.subplots(figsize=(10 + 3 * (len(names) > 12), 6.5))
    intensities = [r["flops"] / r["bytes"] for r in points] or [1.0]
    lo, hi = min(intensities) / 4, max(intensities) * 4
    if profile is not None and profile.bandwidth:
        roofs = [("fp32", profile.compute("float32")[1]), ("bf16", profile.compute("bfloat16")[1])]
        ridges = [peak / profile.bandwidth for _, peak in roofs if peak]
        hi = max([hi, *(4 * r for r in ridges)])  # show where each roof turns flat
        xs = [lo * (hi / lo) ** (i / 127) for i in range(128)]
        for label, peak in roofs:
            if peak:
                ax.plot(
                    xs,
                    [min(peak, x * profile.bandwidth) for x in xs],
                    label=f"roof: {profile.bandwidth:.0f} GB/s, {label} {peak:.0f} GFLOP/s",
                )
    markers = "os^vD<>ph*"
    for index, op in enumerate(names):
        mine = [r for r in points if r["op"] == op]
        ax.scatter(
            [r["flops"] / r["bytes"] for r in mine],
            [r["gflops"] for r in mine],
            label=op,
            s=24,
            marker=markers[index // 10 % len(markers)],
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte, manifest roofline)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title(f"tileops bench: {target} on {device}" + (f" ({profile.name})" if profile else ""))
    ax.grid(True, which="both", alpha=0.3)
    if len(names) > 12:  # beside the chart, in columns, so no point hides behind it
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=1 + len(names) // 30)
    else:
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
