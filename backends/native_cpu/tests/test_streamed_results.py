"""Results of 8 MiB and more, with rows a multiple of the vector width, are written with
streaming stores (kernels/common.h: streams). The other tests' shapes are small, so this
file runs each kernel that streams at a size where it does, against torch."""

import pytest
import torch
import torch.nn.functional as F

from conftest import close, run
from test_matmul_attention_rope import rope_pairs_ref, rope_ref, tables
from test_norms import rms_ref
from tileops_native_cpu import builders as b

BIG = {torch.bfloat16: (1024, 4096), torch.float32: (512, 4096)}  # 8 MiB each
DTYPES = list(BIG)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rmsnorm_and_fused_add(dtype):
    x, r = torch.randn(1024, 4096, dtype=dtype), torch.randn(1024, 4096, dtype=dtype)
    w = torch.randn(4096, dtype=dtype)
    close(run(b.build_rms_norm, x, w, normalized_shape=(4096,), eps=1e-6), rms_ref(x, w, 1e-6))
    out, res = run(b.build_fused_add_rms_norm, x, r, w, eps=1e-6)
    assert torch.equal(res, x + r)
    close(out, rms_ref(x + r, w, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_layer_norm(dtype):
    x, r = torch.randn(BIG[dtype], dtype=dtype), torch.randn(BIG[dtype], dtype=dtype)
    w, bias = torch.randn(4096, dtype=dtype), torch.randn(4096, dtype=dtype)
    out, res = run(b.build_fused_add_layer_norm, x, r, w, bias, eps=1e-5)
    assert torch.equal(res, x + r)
    close(out, F.layer_norm((x + r).float(), (4096,), w.float(), bias.float(), 1e-5).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm(dtype):
    x = torch.randn(BIG[dtype], dtype=dtype)
    w, bias = torch.randn(4096, dtype=dtype), torch.randn(4096, dtype=dtype)
    out = run(b.build_layer_norm, x, w, bias, normalized_shape=(4096,), eps=1e-5)
    close(out, F.layer_norm(x.float(), (4096,), w.float(), bias.float(), 1e-5).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True])
def test_softmax(dtype, log):
    x = torch.randn(BIG[dtype], dtype=dtype) * 4
    out = run(b.build_log_softmax if log else b.build_softmax, x, dim=-1)
    ref = (torch.log_softmax if log else torch.softmax)(x.float(), -1).to(dtype)
    close(out, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_and_mul_with_and_without_broadcast(dtype):
    x, y = torch.randn(BIG[dtype], dtype=dtype), torch.randn(BIG[dtype], dtype=dtype)
    row = torch.randn(BIG[dtype][1], dtype=dtype)
    close(run(b.build_add, x, y, alpha=1), x + y)
    close(run(b.build_add, x, row, alpha=2), (x.float() + 2 * row.float()).to(dtype))
    close(run(b.build_mul, x, y), x * y)


def test_rope_with_position_ids():
    x = torch.randn(2048, 16, 128, dtype=torch.bfloat16)
    pos = torch.randint(0, 4096, (2048,))
    out = run(b.build_rope_neox_position_ids, x, pos, max_position=4096, base=10000.0, rotary_dim=128)
    cos, sin = tables(pos, 128, 10000.0, torch.bfloat16)
    close(out, rope_ref(x.float(), cos[:, None, :], sin[:, None, :]).to(torch.bfloat16))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_pairs(dtype):
    x = torch.randn(2, 1024, 16, 128, dtype=dtype)  # 8 MiB in bfloat16, 16 in float32
    out = run(b.BUILDERS["RopeNonNeoxFwdOp"], x, layout="2d", base=10000.0)
    cos, sin = tables(torch.arange(1024), 128, 10000.0, dtype)
    close(out, rope_pairs_ref(x.float(), cos[None, :, None, :], sin[None, :, None, :]).to(dtype))
