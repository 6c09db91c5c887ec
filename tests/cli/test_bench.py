"""`tileops bench TARGET`: medians, IQR, GB/s and FLOP/s from the manifest roofline, the
share of the machine's roofline, and the speed-up over a baseline run beside it."""

from __future__ import annotations

import csv
import json

import pytest
from _fake_backends import good

from tileops import cli, manifest

from ._kit import MIXED, OTHER, as_json, block, output, run_cli

PROFILE = """\
name: test machine
kind: cpu
source: measured
bandwidth_gbps: {read: 8.0, copy: 10.0}
peak_gflops: {fp32_fma: 100.0, bf16_dot: null}
calibration: {bandwidth: 1.0, compute: 1.0}
"""

TINY = ["--scale", "tiny", "--rounds", "1", "--min-time", "0.001"]


@pytest.mark.subprocess
def test_bench_against_another_target_writes_a_roofline_png_and_one_metric_per_csv_row(kit_site, tmp_path):
    profile, png, table = tmp_path / "machine.yaml", tmp_path / "roofline.png", tmp_path / "bench.csv"
    profile.write_text(PROFILE)
    run = run_cli(
        "bench",
        "acme_cpu",
        "--ops",
        "RMSNormFwdOp",
        "--baseline",
        "other_cpu",
        *TINY,
        "--profile",
        str(profile),
        "--csv",
        str(table),
        "--plot",
        str(png),
        "--json",
        site=kit_site,
    )
    assert run.returncode == 0, output(run)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    payload = as_json(run)
    results = payload["results"]
    workloads = manifest.entry("RMSNormFwdOp").workload_cases("tiny")
    assert len(results) == len(workloads)
    for r in results:
        assert r["baseline"] == "other_cpu" and r["iqr_s"] >= 0
        assert r["gbps"] == pytest.approx(r["bytes"] / r["median_s"] / 1e9)
        assert r["speedup"] == pytest.approx(r["baseline_median_s"] / r["median_s"])
        # RMSNorm is memory-bound on this profile: its roof is the 10 GB/s copy bandwidth
        assert r["bound"] == "memory"
        assert r["roofline_pct"] == pytest.approx(100 * r["bytes"] / 10e9 / r["median_s"])
    with table.open() as f:
        written = list(csv.DictReader(f))
    assert {row["metric"] for row in written} == {
        "median",
        "iqr",
        "bandwidth",
        "compute",
        "roofline",
        "baseline_median",
        "speedup",
    }
    assert len(written) == 7 * len(results)
    assert all(row["target"] == "acme_cpu" and row["baseline"] == "other_cpu" for row in written)


@pytest.mark.subprocess
def test_bench_plot_without_matplotlib_is_refused_before_anything_runs(kit_site, tmp_path):
    blocked = block(tmp_path / "blocked", "matplotlib")
    run = run_cli("bench", "acme_cpu", "--plot", str(tmp_path / "r.png"), site=kit_site, path=(blocked,))
    assert run.returncode == 2, output(run)
    assert run.stderr.startswith(
        "tileops bench: error: --plot needs matplotlib, which is not installed here; pip install 'tileops[cli]'"
    ), output(run)
    assert not (tmp_path / "r.png").exists()


def _install(site):
    site.install("tileops-backend-acme", {"acme_cpu": "tileops_acme"}, {"tileops_acme": MIXED})
    site.install("tileops-backend-other", {"other_cpu": "tileops_other"}, {"tileops_other": OTHER})


def test_without_a_machine_profile_bench_leaves_the_roofline_share_out_and_says_how_to_get_it(
    site, capsys, monkeypatch, tmp_path
):
    _install(site)
    monkeypatch.setenv("TILEOPS_MACHINE_PROFILE", str(tmp_path / "none.yaml"))
    assert cli.main(["bench", "acme_cpu", "--ops", "RMSNormFwdOp", *TINY, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["profile"] is None and payload["baseline"] == "eager"
    assert all(r["roofline_pct"] is None and r["speedup"] > 0 for r in payload["results"])
    (notes,) = [t["notes"] for t in payload["tables"].values()]
    assert any("run `tileops profile-machine`" in n for n in notes)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--baseline", "nope"],
            "--baseline: expected 'eager', 'compile' or a registered target (acme_cpu, other_cpu), got 'nope'",
        ),
        (
            ["--baseline", "other_cpu"],
            "--baseline: target 'other_cpu' registers no builder for "
            "SoftmaxFwdOp; pass --ops with ops both targets serve",
        ),
        (
            ["--profile", "h2000"],
            "--profile: expected a profile YAML file or a shipped profile name (h20, h200), got 'h2000'",
        ),
        (["--plot", "chart.svg"], "--plot: expected a .png file name, got 'chart.svg'"),
    ],
)
def test_bench_refuses_bad_input_naming_what_was_expected(site, capsys, args, expected):
    _install(site)
    assert cli.main(["bench", "acme_cpu", *args]) == 2
    assert capsys.readouterr().err.startswith(f"tileops bench: error: {expected}")


def test_the_shipped_gpu_profiles_hold_datasheet_peaks_and_calibration():
    from tileops.cli import _profile

    h200, h20 = _profile.load("h200"), _profile.load("H20")
    assert h200.bandwidth_gbps["copy"] == 4800 and h20.bandwidth_gbps["copy"] == 4000
    assert h200.peak_gflops["bf16_dot"] > h20.peak_gflops["bf16_dot"]
    for p in (h200, h20):
        assert 0 < p.calibration["bandwidth"] <= 1 and 0 < p.calibration["compute"] <= 1
        assert p.bandwidth == pytest.approx(p.bandwidth_gbps["copy"] * p.calibration["bandwidth"])


def test_the_eager_baseline_computes_in_the_inputs_dtype_as_a_users_call_does():
    import torch

    from tileops.testing import references

    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)).bfloat16()
    gate, value = x[:, :128], x[:, 128:]
    ref = references.reference("SiluAndMulFwdOp")
    with references.in_input_dtype():
        same = ref(x)
    assert torch.equal(same, torch.nn.functional.silu(gate) * value)  # rounded twice, in bf16
    upcast = ref(x)  # outside: float32 math, rounded once
    assert torch.equal(upcast, (torch.nn.functional.silu(gate.float()) * value.float()).bfloat16())
    assert not torch.equal(same, upcast)


def test_bench_runs_targets_on_a_device_their_detectors_do_not_claim_and_says_so(site, capsys, tmp_path):
    # two opt-in backends (detectors claim nothing): one benched, one its baseline
    site.backend("opt_cpu", good("opt_cpu"))
    site.backend("opt_base", good("opt_base"))
    report = tmp_path / "bench.json"
    assert (
        cli.main(["bench", "opt_cpu", "--device", "cpu", "--baseline", "opt_base", *TINY, "--json", str(report)]) == 0
    )
    out = capsys.readouterr().out
    ours = (
        "not claimed: opt_cpu's detect() answered False for cpu; it runs there because "
        "the command line names it explicitly, as target='opt_cpu' does in a program"
    )
    theirs = (
        "baseline not claimed: opt_base's detect() answered False for cpu; it runs there "
        "because --baseline names it explicitly"
    )
    assert ours in out and theirs in out  # the table's lines
    payload = json.loads(report.read_text())
    assert payload["claimed"] is False and payload["detector"] is False
    assert payload["failed"] == 0 and payload["results"]
    assert all(r["speedup"] > 0 and r["baseline"] == "opt_base" for r in payload["results"])
    (notes,) = [t["notes"] for t in payload["tables"].values()]
    assert any(ours in n for n in notes) and any(theirs in n for n in notes)


def test_an_unclaimed_target_whose_kernel_raises_fails_bench_with_exit_1(site, capsys):
    site.backend(
        "opt_cpu",
        good("opt_cpu").replace(
            "return lambda x, w: torch.nn.functional.rms_norm(x, tuple(normalized_shape), w, eps)",
            "return lambda x, w: (_ for _ in ()).throw(RuntimeError('opt_cpu: no kernel here'))",
        ),
    )
    assert cli.main(["bench", "opt_cpu", "--device", "cpu", *TINY, "--json"]) == 1
    payload = json.loads(capsys.readouterr().out)
    assert payload["claimed"] is False and payload["failed"] == len(payload["results"]) > 0
    assert all("RuntimeError: opt_cpu: no kernel here" in r["error"] for r in payload["results"])
