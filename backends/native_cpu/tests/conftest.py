from __future__ import annotations

from typing import Any, NamedTuple

import pytest
import torch

from tileops_native_cpu import builders


class Spec(NamedTuple):
    """What the op layer hands a builder (tileops.backend.TensorSpec, duck-typed)."""

    device: torch.device
    dtype: torch.dtype
    shape: tuple[int, ...]


def spec(t: torch.Tensor | None) -> Spec | None:
    return None if t is None else Spec(t.device, t.dtype, tuple(t.shape))


def run(build: Any, *tensors: torch.Tensor | None, **params: Any) -> Any:
    """Build as the op layer would (specs + params), then call with the tensors."""
    kernel = build(*(spec(t) for t in tensors), **params)
    return kernel(*tensors)


TOL = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=1e-2, rtol=1e-2),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


def close(actual: torch.Tensor, expected: torch.Tensor, scale: float = 1.0) -> None:
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    tol = TOL[actual.dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol["atol"] * scale, rtol=tol["rtol"] * scale)


def sdpa_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Grouped-query attention over [B, S, H, D] in float32, through torch's SDPA."""
    group = q.shape[2] // k.shape[2]
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    kf, vf = kf.repeat_interleave(group, 1), vf.repeat_interleave(group, 1)
    return torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=causal).transpose(1, 2)


FLOATS = [torch.float32, torch.float16, torch.bfloat16]
HALVES = [torch.float16, torch.bfloat16]  # what the manifests allow RMSNorm, GEMM, Bmm and attention


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def native() -> Any:
    return builders.native()
