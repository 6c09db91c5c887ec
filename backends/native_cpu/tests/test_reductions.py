import pytest
import torch

from conftest import FLOATS, close, run, spec
from tileops_native_cpu import builders as b


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(
    "shape,dim",
    [((4, 4096), -1), ((3, 1000), 1), ((1, 17), -1), ((5, 7, 9), 1), ((6, 33), 0), ((40,), None), ((4, 5, 6), None)],
)
def test_softmax_matches_torch_along_any_dim(dtype, shape, dim):
    x = torch.randn(shape, dtype=dtype) * 4
    resolved = dim if dim is not None else (0 if len(shape) in (0, 1, 3) else 1)
    out = run(b.build_softmax, x, dim=dim)
    close(out, torch.softmax(x.float(), resolved).to(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,dim", [((4, 4096), -1), ((3, 999), 1), ((5, 7, 9), 1), ((6, 33), 0)])
def test_log_softmax_matches_torch_along_any_dim(dtype, shape, dim):
    x = torch.randn(shape, dtype=dtype) * 4
    out = run(b.build_log_softmax, x, dim=dim)
    close(out, torch.log_softmax(x.float(), dim).to(dtype), scale=2)


def test_softmax_gives_zero_weight_to_minus_infinity():
    x = torch.randn(3, 50)
    x[:, 10:20] = float("-inf")
    out = run(b.build_softmax, x, dim=-1)
    assert torch.all(out[:, 10:20] == 0)
    close(out, torch.softmax(x, -1))


REDUCE_CASES = [
    ((2048 // 8, 4096 // 8), None, False),
    ((64, 333), (1,), True),
    ((37, 45), (0,), False),
    ((4, 12, 40), (0, 2), False),
    ((4, 12, 40), (1,), True),
    ((3, 4, 5, 6), (0, 2), True),
    ((3, 4, 5, 6), (1, 3), False),
    ((1, 1, 7), (0, 1), False),
    ((100001,), (0,), False),
    # kept rows of 2048 columns and more fold four reduced rows per pass: whole blocks,
    # single rows after them, a column tail; over two reduced axes; in two parts (42 rows)
    ((9, 2100), (0,), False),
    ((3, 5, 2050), (0, 1), True),
    ((42, 2100), (0,), False),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,dim,keepdim", REDUCE_CASES)
@pytest.mark.parametrize("name", ["sum", "mean", "amax"])
def test_reductions_match_torch_over_any_axes(dtype, shape, dim, keepdim, name):
    x = torch.randn(shape, dtype=dtype)
    build = {"sum": b.build_sum, "mean": b.build_mean, "amax": b.build_amax}[name]
    out = run(build, x, dim=dim, keepdim=keepdim)
    ref_dim = dim if dim is not None else tuple(range(len(shape)))
    ref = getattr(torch, name)(x.float(), dim=ref_dim, keepdim=keepdim).to(dtype)
    n = x.numel() // max(ref.numel(), 1)
    close(out, ref, scale=1 if name != "sum" else max(1.0, n**0.5 / 8))


def test_sum_of_a_zero_dim_tensor_is_itself():
    x = torch.tensor(3.5)
    out = run(b.build_sum, x, dim=None, keepdim=False)
    assert out.shape == () and out.item() == 3.5


def test_amax_over_an_empty_axis_is_refused_at_build_naming_the_shape():
    x = torch.empty(3, 0)
    with pytest.raises(ValueError, match=r"\(3, 0\)"):
        b.build_amax(spec(x), dim=(1,), keepdim=False)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(
    "shape,dim,at",
    [
        ((6, 333), (1,), (2, 100)),  # innermost axis reduced, NaN mid-vector
        ((6, 333), (1,), (5, 332)),  # NaN in the tail lane
        ((37, 45), (0,), (36, 3)),  # innermost kept: column accumulation
        ((4, 12, 40), (0, 2), (3, 7, 0)),  # mixed axes
        ((300000,), None, (123456,)),  # one long run split over threads
        ((300000,), None, (0,)),  # NaN in the first lane of the first part
        ((7, 2100), (0,), (2, 2099)),  # wide kept rows: in a block of four, in the column tail
        ((7, 2100), (0,), (5, 100)),  # wide kept rows: in a single row after the blocks
    ],
)
def test_amax_propagates_nan_like_torch(dtype, shape, dim, at):
    x = torch.randn(shape, dtype=dtype)
    x[at] = float("nan")
    out = run(b.build_amax, x, dim=dim, keepdim=False)
    ref = x.amax(dim=dim) if dim is not None else x.amax()
    assert torch.equal(out.isnan(), ref.isnan()), (out, ref)
    assert out.isnan().any()
    close(out[~out.isnan()], ref[~ref.isnan()])


@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax_of_a_row_with_nan_is_nan_like_torch(dtype):
    x = torch.randn(3, 100, dtype=dtype)
    x[1, 50] = float("nan")
    out = run(b.build_softmax, x, dim=-1)
    assert out[1].isnan().all() and not out[0].isnan().any() and not out[2].isnan().any()
