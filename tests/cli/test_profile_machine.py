"""`tileops profile-machine`: tileops' own C++ probes into a profile bench reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tileops import _C, cli

from ._kit import as_json, output, run_cli


@pytest.mark.subprocess
def test_profile_machine_writes_a_profile_bench_can_read(tmp_path):
    out = tmp_path / "machine.yaml"
    run = run_cli("profile-machine", "--out", str(out), "--mib", "8", "--repeats", "2", "--ms", "5", "--json")
    assert run.returncode == 0, output(run)
    payload = as_json(run)
    profile = yaml.safe_load(out.read_text())
    assert profile["source"] == "measured" and profile["kind"] == "cpu"
    assert profile["bandwidth_gbps"]["read"] > 0 and profile["bandwidth_gbps"]["copy"] > 0
    assert profile["peak_gflops"]["fp32_fma"] > 0
    assert payload["peak_gflops"] == profile["peak_gflops"]
    from tileops.cli import _profile

    loaded = _profile.load(out)
    assert loaded.bandwidth == profile["bandwidth_gbps"]["copy"]


def _has_avx512_bf16() -> bool:
    try:
        return "avx512_bf16" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


def test_the_bf16_probe_is_available_exactly_where_the_cpu_has_avx512_bf16():
    missing = _C.machine.bf16_dot_missing()
    assert (missing == "") == _has_avx512_bf16(), missing
    if missing:
        with pytest.raises(RuntimeError, match="AVX-512 BF16"):
            _C.machine.bf16_dot_peak(1, 1, 1.0)
    else:
        assert _C.machine.bf16_dot_peak(1, 1, 1.0)[0] > 0


@pytest.mark.parametrize("kind", ["read", "copy", "copy_stream"])
@pytest.mark.parametrize("threads", [1, 3])
def test_each_bandwidth_probe_reports_a_rate_per_repeat(kind, threads):
    # 3 MiB: buffers of a part of a huge page; 3 threads: shares of unequal length
    rates = _C.machine.bandwidth(kind, 3, threads, 2)
    assert len(rates) == 2 and all(0 < r < 1e5 for r in rates), rates


def test_the_fp32_probe_runs_the_widest_instructions_or_the_ones_named():
    assert _C.machine.fp32_fma_isa() in ("avx512f", "avx2+fma", "scalar")
    assert _C.machine.fp32_fma_peak(1, 1, 1.0, "scalar")[0] > 0
    assert _C.machine.fp32_fma_peak(1, 1, 1.0, _C.machine.fp32_fma_isa())[0] > 0
    with pytest.raises(ValueError, match=r"'avx512f', 'avx2\+fma' or 'scalar', got 'sse'"):
        _C.machine.fp32_fma_peak(1, 1, 1.0, "sse")


def test_the_probes_refuse_bad_arguments_naming_them():
    with pytest.raises(ValueError, match="'read', 'copy' or 'copy_stream', got 'write'"):
        _C.machine.bandwidth("write", 1, 1, 1)
    with pytest.raises(ValueError, match=r"threads must be in \[1, 1024\], got 0"):
        _C.machine.fp32_fma_peak(0, 1, 1.0)


class _NoBf16:
    """The machine probes of a CPU without AVX-512 BF16."""

    bandwidth = staticmethod(lambda kind, mib, threads, repeats: [10.0] * repeats)
    fp32_fma_peak = staticmethod(lambda threads, repeats, ms: [50.0] * repeats)
    fp32_fma_isa = staticmethod(lambda: "avx2+fma")
    bf16_dot_missing = staticmethod(lambda: "this CPU has no AVX-512 BF16 (vdpbf16ps)")

    @staticmethod
    def bf16_dot_peak(threads, repeats, ms):
        raise AssertionError("profile-machine must not run a probe the CPU lacks")


def test_a_cpu_without_avx512_bf16_gets_bf16_reported_unavailable_not_an_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(_C, "machine", _NoBf16)
    out = tmp_path / "m.yaml"
    assert cli.main(["profile-machine", "--out", str(out), "--repeats", "1", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["peak_gflops"] == {"fp32_fma": 50.0, "bf16_dot": None}
    assert payload["unavailable"] == {"bf16_dot": "this CPU has no AVX-512 BF16 (vdpbf16ps)"}
    profile = yaml.safe_load(out.read_text())
    assert profile["peak_gflops"]["bf16_dot"] is None
    assert profile["unavailable"]["bf16_dot"].startswith("this CPU has no AVX-512 BF16")
