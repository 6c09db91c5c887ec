"""The machine probes the benchmarks measure against: tileops' own (tileops._C.machine),
reached through _C.probe_bandwidth and _C.probe_bf16_peak."""

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
    with pytest.raises(ValueError, match="kind must be 'read', 'copy' or 'copy_stream', got 'write'"):
        native.probe_bandwidth("write", 8, 1, 1)
    with pytest.raises(ValueError, match="threads must be in"):
        native.probe_bandwidth("read", 8, 0, 1)
    with pytest.raises(ValueError, match="mib must be >= 1"):
        native.probe_bandwidth("read", 0, 1, 1)
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        native.probe_bandwidth("read", 8, 1, 0)


def test_bf16_peak_probe(native):
    """Every build has one: vdpbf16ps on AVX-512 BF16, the float FMAs the bfloat16 GEMM
    widens into elsewhere."""
    one, two = native.probe_bf16_peak(1, 3, 5.0), native.probe_bf16_peak(2, 3, 5.0)
    assert all(math.isfinite(r) and 0.1 < r < 100_000 for r in one + two), (one, two)
