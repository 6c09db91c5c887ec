"""The machine probes benchmarks/native_latency.py measures against."""

import math

import pytest

KINDS = ["read", "copy", "copy_stream"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("threads", [1, 2])
def test_bandwidth_probes_report_a_rate_per_repeat(native, kind, threads):
    rates = native.probe_bandwidth(kind, 8, threads, 3)
    assert len(rates) == 3
    assert all(math.isfinite(r) and 0.1 < r < 10_000 for r in rates), rates


def test_bandwidth_probe_refusals(native):
    with pytest.raises(ValueError, match="probe_write"):
        native.probe_bandwidth("write", 8, 1, 1)
    with pytest.raises(ValueError, match="threads must be in"):
        native.probe_bandwidth("read", 8, 0, 1)
    with pytest.raises(ValueError, match="mib and repeats"):
        native.probe_bandwidth("read", 0, 1, 1)


def test_bf16_peak_probe(native):
    """Every build has one: vdpbf16ps on AVX-512 BF16, the float FMAs the bfloat16 GEMM
    widens into elsewhere."""
    one, two = native.probe_bf16_peak(1, 3, 5.0), native.probe_bf16_peak(2, 3, 5.0)
    assert all(math.isfinite(r) and 0.1 < r < 100_000 for r in one + two), (one, two)
