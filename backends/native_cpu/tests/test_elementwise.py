import pytest
import torch
import torch.nn.functional as F

from conftest import FLOATS, close, run, spec
from tileops_native_cpu import builders as b

ALL_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64] + FLOATS


def sample(shape, dtype):
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, dtype=dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize(
    "a_shape,b_shape",
    [((33, 70), (33, 70)), ((4, 1, 5), (3, 1)), ((2, 6, 5, 5), (6, 1, 1)), ((1,), (17,)), ((), (3, 2))],
)
def test_add_and_mul_match_torch_with_broadcasting_for_every_dtype(dtype, a_shape, b_shape):
    x, y = sample(a_shape, dtype), sample(b_shape, dtype)
    for build, ref in ((b.build_add, torch.add(x, y)), (b.build_mul, torch.mul(x, y))):
        out = run(build, x, y) if build is b.build_mul else run(build, x, y, alpha=1)
        if dtype.is_floating_point:
            close(out, ref)
        else:
            assert torch.equal(out, ref), build.__name__


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.float32, torch.bfloat16])
def test_add_scales_other_by_alpha(dtype):
    x, y = sample((5, 9), dtype), sample((5, 9), dtype)
    out = run(b.build_add, x, y, alpha=3)
    ref = torch.add(x, y, alpha=3)
    if dtype.is_floating_point:
        close(out, ref)
    else:
        assert torch.equal(out, ref)


def test_add_refuses_a_fractional_alpha_for_integers_naming_it():
    x = torch.ones(3, dtype=torch.int32)
    with pytest.raises(ValueError, match="alpha=0.5"):
        b.build_add(spec(x), spec(x), alpha=0.5)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("numel", [1, 15, 16, 17, 1000, 70001])
@pytest.mark.parametrize("name", ["silu", "gelu", "gelu_tanh", "relu"])
def test_activations_match_torch_on_lengths_off_the_vector_width(dtype, numel, name):
    x = (torch.randn(numel) * 4).to(dtype)
    if name == "silu":
        out, ref = run(b.build_silu, x, inplace=False), F.silu(x.float())
    elif name == "gelu":
        out, ref = run(b.build_gelu, x, approximate="none"), F.gelu(x.float())
    elif name == "gelu_tanh":
        out, ref = run(b.build_gelu, x, approximate="tanh"), F.gelu(x.float(), approximate="tanh")
    else:
        out, ref = run(b.build_relu, x, inplace=False), F.relu(x.float())
    close(out, ref.to(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", ["silu", "gelu", "gelu_tanh"])
def test_activations_hold_their_tolerance_over_a_wide_range_and_in_the_tails(dtype, name):
    # the kernels use an exp polynomial, reciprocal estimates and (float16/bfloat16) a
    # shorter polynomial: compare with float64 over [-30, 30], where the tails are tiny
    x = torch.linspace(-30, 30, 60001).to(dtype)
    if name == "silu":
        out, ref = run(b.build_silu, x, inplace=False), F.silu(x.double())
    elif name == "gelu":
        out, ref = run(b.build_gelu, x, approximate="none"), F.gelu(x.double())
    else:
        out = run(b.build_gelu, x, approximate="tanh")
        xd = x.double()
        ref = xd * torch.sigmoid(2 * 0.7978845608028654 * (xd + 0.044715 * xd**3))
    close(out, ref.to(dtype))
    if dtype == torch.float32:
        torch.testing.assert_close(out.double(), ref, atol=1e-6, rtol=2e-6)


@pytest.mark.parametrize("build,ref", [(b.build_silu, F.silu), (b.build_relu, F.relu)])
def test_inplace_activation_writes_input_and_returns_that_same_tensor(build, ref):
    x = torch.randn(3, 77, dtype=torch.bfloat16)
    expected = ref(x.float()).to(torch.bfloat16)
    out = run(build, x, inplace=True)
    assert out is x
    close(x, expected)


def test_out_of_place_activation_leaves_input_untouched():
    x = torch.randn(100)
    before = x.clone()
    out = run(b.build_silu, x, inplace=False)
    assert torch.equal(x, before) and out.data_ptr() != x.data_ptr()


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(1, 2 * 37), (5, 256), (3, 2 * 100)])
def test_silu_and_mul_gates_the_second_half_with_the_first(dtype, shape):
    x = torch.randn(shape, dtype=dtype)
    gate, value = x.float().chunk(2, dim=-1)
    out = run(b.build_silu_and_mul, x)
    close(out, (F.silu(gate) * value).to(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("with_min,with_max", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("shapes", [((40, 33), (40, 33), (40, 33)), ((6, 5), (5,), (6, 1))])
def test_clamp_matches_torch_with_either_bound_absent(dtype, with_min, with_max, shapes):
    x = torch.randn(shapes[0], dtype=dtype) * 2
    lo = (torch.randn(shapes[1]) - 0.5).to(dtype) if with_min else None
    hi = (torch.randn(shapes[2]) + 0.5).to(dtype) if with_max else None
    out = run(b.build_clamp, x, lo, hi)
    assert torch.equal(out, torch.clamp(x, lo, hi))


def test_clamp_without_any_bound_is_refused():
    x = torch.randn(4)
    with pytest.raises(ValueError, match="min=None, max=None"):
        b.build_clamp(spec(x), None, None)


@pytest.mark.parametrize("n", [2000, 2013])
def test_silu_and_mul_with_a_large_result_streams_it_out_correctly(n):
    # >= 8 MiB of bfloat16 output takes the streaming-store path; rows of 2000 (4000 bytes)
    # start off a 64-byte boundary every other row, 2013 leaves tails in every block
    x = torch.randn(2200, 2 * n, dtype=torch.bfloat16)
    out = run(b.build_silu_and_mul, x)
    ref = F.silu(x[:, :n].float()) * x[:, n:].float()
    close(out, ref.to(torch.bfloat16))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", ["silu", "relu"])
def test_activation_with_a_large_result_streams_it_out_correctly(dtype, name):
    # >= 8 MiB of output takes the streaming-store path (AVX-512); an odd length leaves
    # every thread's chunk off the store alignment and a tail at the end
    x = torch.randn((8 << 20) // torch.finfo(dtype).bits * 8 + 7, dtype=dtype)
    build, ref = (b.build_silu, F.silu) if name == "silu" else (b.build_relu, F.relu)
    close(run(build, x, inplace=False), ref(x.float()).to(dtype))
