"""The references of the RoPE variants, checked against what each one is for rather than
restated: the bands of dims Llama-3.1's and YaRN's frequencies keep, divide or interpolate
(at the manifests' default params), NonNeox as NeoX over de-interleaved channels, and every
position-id form at positions 0..S-1 as its positional form. The frequencies and tables are
tileops.rope_tables', which backends building their own tables import too."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from tileops.ops.rope import RopeLongRopeFwdOp, RopeLongRopePositionIdsFwdOp
from tileops.rope_tables import llama31_inv_freq, longrope_factor, longrope_inv_freq, yarn_inv_freq
from tileops.testing.references import reference

HALF, BASE = 64, 10000.0
PLAIN = 1.0 / (BASE ** (torch.arange(HALF, dtype=torch.float32) / HALF))


def test_llama31_keeps_short_wavelengths_divides_long_ones_and_blends_between():
    f = llama31_inv_freq(
        HALF, BASE, scale_factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192
    )
    wavelength = 2 * math.pi / PLAIN
    short, long = wavelength < 8192 / 4.0, wavelength > 8192 / 1.0
    assert short.any() and long.any() and (~short & ~long).any()
    torch.testing.assert_close(f[short], PLAIN[short])
    torch.testing.assert_close(f[long], PLAIN[long] / 8.0)
    between = ~short & ~long
    assert ((f[between] < PLAIN[between]) & (f[between] > PLAIN[between] / 8.0)).all()
    assert (f[1:] < f[:-1]).all()  # still one frequency per dim, highest first


def test_yarn_extrapolates_below_the_fast_dim_and_interpolates_above_the_slow_one():
    f = yarn_inv_freq(HALF, BASE, scale=16.0, original_max_position=4096, beta_fast=32.0, beta_slow=1.0)
    inter = 1.0 / ((16.0 * BASE) ** (torch.arange(HALF, dtype=torch.float32) / HALF))

    def dim(rotations: float) -> float:  # over `half`, as upstream's table says
        return HALF * math.log(4096 / (2 * math.pi * rotations)) / (2 * math.log(BASE))

    low, high = math.floor(dim(32.0)), math.ceil(dim(1.0))
    assert 0 < low < high < HALF - 1
    torch.testing.assert_close(f[: low + 1], PLAIN[: low + 1])
    torch.testing.assert_close(f[high:], inter[high:])
    assert ((f[low + 1 : high] <= PLAIN[low + 1 : high]) & (f[low + 1 : high] >= inter[low + 1 : high])).all()


def test_non_neox_is_neox_over_the_channels_taken_even_first_then_odd():
    x = torch.randn(2, 7, 3, 16)
    deinterleaved = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
    neox = reference("RopeNeoxFwdOp")(deinterleaved, layout="2d", base=500.0)
    back = torch.stack((neox[..., :8], neox[..., 8:]), dim=-1).flatten(-2)
    torch.testing.assert_close(reference("RopeNonNeoxFwdOp")(x, layout="2d", base=500.0), back)


def test_longrope_divides_each_frequency_by_its_factor_and_none_keeps_them():
    factors = tuple(1.0 + k / 4 for k in range(HALF))
    torch.testing.assert_close(longrope_inv_freq(HALF, BASE, rescale_factors=factors) * torch.tensor(factors), PLAIN)
    torch.testing.assert_close(longrope_inv_freq(HALF, BASE, rescale_factors=None), PLAIN)


def test_longrope_scales_cos_and_sin_only_beyond_the_original_context():
    assert longrope_factor(4096, 4096) == longrope_factor(2048, 4096) == 1.0
    assert math.isclose(longrope_factor(131072, 4096), math.sqrt(1 + math.log(32) / math.log(4096)))
    x = torch.randn(64, 2 * HALF)
    plain = reference("RopeLongRopeFwdOp")(
        x,
        layout="1d",
        base=BASE,
        rescale_factors=None,
        max_position_embeddings=4096,
        original_max_position_embeddings=4096,
    )
    torch.testing.assert_close(plain, reference("RopeNeoxFwdOp")(x, layout="1d", base=BASE))
    longer = reference("RopeLongRopeFwdOp")(
        x,
        layout="1d",
        base=BASE,
        rescale_factors=None,
        max_position_embeddings=131072,
        original_max_position_embeddings=4096,
    )
    torch.testing.assert_close(longer, plain * longrope_factor(131072, 4096))  # a rotation, scaled


def test_longrope_takes_its_factors_as_a_tensor_list_or_tuple_and_holds_a_tuple():
    factors = [1.0 + k / 8 for k in range(HALF)]
    from_tensor = RopeLongRopeFwdOp(rescale_factors=torch.tensor(factors, dtype=torch.float64))
    from_list = RopeLongRopeFwdOp(rescale_factors=factors)
    assert from_tensor.params == from_list.params
    assert from_list.params["rescale_factors"] == tuple(factors)
    with pytest.raises(ValueError, match=r"1-D and real.*got shape \(2, 64\)"):
        RopeLongRopeFwdOp(rescale_factors=torch.ones(2, HALF))
    with pytest.raises(ValueError, match="all\\(f > 0"):
        RopeLongRopeFwdOp(rescale_factors=[0.0] * HALF)


def test_longrope_at_positions_takes_a_tensor_and_wants_one_factor_per_rotated_pair():
    factors = [1.0 + k for k in range(8)]
    op = RopeLongRopePositionIdsFwdOp(64, rotary_dim=16, rescale_factors=torch.tensor(factors))
    assert op.params["rescale_factors"] == tuple(factors)
    with pytest.raises(ValueError, match=r"len\(rescale_factors\) == rotary_dim // 2"):
        RopeLongRopePositionIdsFwdOp(64, rotary_dim=32, rescale_factors=factors)


def test_longrope_refuses_a_call_whose_head_dim_does_not_match_its_factors():
    op = RopeLongRopeFwdOp(rescale_factors=[1.0] * HALF)
    with pytest.raises(ValueError, match=r"len\(rescale_factors\) == x.shape\[-1\] // 2"):
        op(torch.randn(4, 2 * HALF + 2))


POSITIONAL_FORMS = {
    "RopeNeoxPositionIdsFwdOp": ("RopeNeoxFwdOp", {}),
    "RopeNonNeoxPositionIdsFwdOp": ("RopeNonNeoxFwdOp", {}),
    "RopeLongRopePositionIdsFwdOp": (
        "RopeLongRopeFwdOp",
        dict(
            rescale_factors=tuple(1.0 + k for k in range(16)),
            max_position_embeddings=8192,
            original_max_position_embeddings=2048,
        ),
    ),
}


@pytest.mark.parametrize("op", sorted(POSITIONAL_FORMS))
def test_a_position_id_form_at_positions_zero_to_s_is_its_positional_form(op):
    positional, params = POSITIONAL_FORMS[op]
    x = torch.randn(12, 3, 32)
    at = reference(op)(x, torch.arange(12), max_position=12, base=10000.0, rotary_dim=32, **params)
    for h in range(3):
        torch.testing.assert_close(at[:, h], reference(positional)(x[:, h], layout="1d", base=10000.0, **params))


def test_longrope_with_factors_compiles_to_one_custom_op_call_that_matches_eager(cpu_target):
    torch._dynamo.reset()
    op = RopeLongRopeFwdOp(rescale_factors=[1.0 + k / 8 for k in range(HALF)], max_position_embeddings=8192)
    x = torch.randn(16, 2 * HALF)
    compiled = torch.compile(lambda t: op(t), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), op(x))
    torch._dynamo.reset()


@pytest.mark.subprocess
def test_the_rope_tables_load_without_the_op_layer():
    """A backend's builders take their tables from here without loading the op catalog."""
    script = (
        "import sys, tileops.rope_tables; heavy = ('tileops.ops', 'tileops.manifest', 'yaml'); "
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
