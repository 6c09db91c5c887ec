"""Row kernels run over pairs of vectors (kernels/common.h: load_pair, store_pair), whose
lanes AVX-512 permutes for bfloat16, then over single vectors for the rest of a row. This
file runs each such kernel at row lengths around those boundaries, on rows that start at
every alignment, against torch: a pair stored in the wrong order, or a tail that restarts
at the wrong column, fails here."""

import pytest
import torch
import torch.nn.functional as F

from conftest import close, run
from test_norms import rms_ref
from tileops_native_cpu import builders as b

LENGTHS = [1, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 96, 97, 4095, 4097]


def rows(n, dtype, scale=1.0):
    """Five rows of n values, the first starting 3 elements past an aligned allocation (so,
    with odd n, every row starts at a different alignment)."""
    return (torch.randn(5 * n + 3, dtype=torch.float32) * scale).to(dtype)[3:].view(5, n)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", LENGTHS)
def test_norms(dtype, n):
    x, r, w, bias = rows(n, dtype), rows(n, dtype), torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype)
    close(run(b.build_rms_norm, x, w, normalized_shape=(n,), eps=1e-6), rms_ref(x, w, 1e-6))
    out, res = run(b.build_fused_add_rms_norm, x, r, w, eps=1e-6)
    assert torch.equal(res, x + r)
    close(out, rms_ref(x + r, w, 1e-6))
    ln = lambda t: F.layer_norm(t.float(), (n,), w.float(), bias.float(), 1e-5).to(dtype)  # noqa: E731
    close(run(b.build_layer_norm, x, w, bias, normalized_shape=(n,), eps=1e-5), ln(x))
    out, res = run(b.build_fused_add_layer_norm, x, r, w, bias, eps=1e-5)
    assert torch.equal(res, x + r)
    close(out, ln(x + r))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n", LENGTHS)
def test_softmax_and_row_reductions(dtype, n):
    x = rows(n, dtype, scale=4.0)
    close(run(b.build_softmax, x, dim=-1), torch.softmax(x.float(), -1).to(dtype))
    close(run(b.build_log_softmax, x, dim=-1), torch.log_softmax(x.float(), -1).to(dtype))
    close(run(b.build_amax, x, dim=[-1], keepdim=False), x.amax(-1))
    close(run(b.build_sum, x, dim=[-1], keepdim=False), x.float().sum(-1).to(dtype), scale=max(1.0, n / 256))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", LENGTHS)
def test_activation_and_gated(dtype, n):
    x = rows(2 * n, dtype, scale=3.0)
    close(run(b.build_silu, x, inplace=False), F.silu(x.float()).to(dtype))
    gate, value = x[:, :n].float(), x[:, n:].float()
    close(run(b.build_silu_and_mul, x), (F.silu(gate) * value).to(dtype), scale=4.0)
