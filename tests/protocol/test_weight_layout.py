"""A kernel that reads a weight in a layout of its own registers it
(``register_weight_layout``): ``op.prepare_weight`` (upstream's ``repack`` for W4A16) applies
it once where the weight is loaded, the kernel receives the prepared tensor, and the
conformance harness prepares its inputs the same way."""

from __future__ import annotations

import pytest
import torch

from tileops.backend import BackendError, register_detector, register_kernel_builder, register_weight_layout
from tileops.ops import GemmW4A16FwdOp
from tileops.quant import int4
from tileops.testing import harness

TARGET = "swapped"


def _swap_nibbles(packed: torch.Tensor, *, group_size: int) -> torch.Tensor:
    return (packed >> 4) | (packed << 4)


def _kernel_reading_swapped(group_size: int):
    def kernel(activation, packed, scale, zero):
        w = int4.dequantize(_swap_nibbles(packed, group_size=group_size), scale, zero, group_size)
        return (activation.float() @ w.t()).to(activation.dtype)

    return kernel


@pytest.fixture
def swapped():
    register_detector(TARGET, lambda device: device.type == "cpu")
    register_kernel_builder("GemmW4A16FwdOp", TARGET, lambda *specs, group_size: _kernel_reading_swapped(group_size))
    register_weight_layout("GemmW4A16FwdOp", TARGET, "packed_weight", _swap_nibbles)


def _weights():
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(0)) * 0.02
    return int4.quantize(w, group_size=32)


def test_repack_gives_the_targets_layout_and_its_kernel_computes_from_it(swapped):
    packed, scale, zero = _weights()
    op = GemmW4A16FwdOp(group_size=32, target=TARGET)
    prepared = op.repack(packed)
    assert torch.equal(prepared, _swap_nibbles(packed, group_size=32))
    x = torch.randn(2, 64)
    want = x @ int4.dequantize(packed, scale, zero, 32).t()
    assert torch.allclose(op(x, prepared, scale, zero), want)


def test_without_a_layout_of_its_own_a_target_gets_the_tensor_itself():
    register_detector("plain", lambda device: device.type == "cpu")
    register_kernel_builder("GemmW4A16FwdOp", "plain", lambda *specs, group_size: None)
    packed, _, _ = _weights()
    assert GemmW4A16FwdOp(group_size=32, target="plain").repack(packed) is packed


def test_a_layout_that_changes_the_shape_or_an_unknown_input_is_refused(swapped):
    register_detector("bad", lambda device: device.type == "cpu")
    register_weight_layout("GemmW4A16FwdOp", "bad", "packed_weight", lambda t, **p: t[:, :2])
    packed, _, _ = _weights()
    with pytest.raises(BackendError, match="must return a tensor of the shape, dtype and device it was given"):
        GemmW4A16FwdOp(group_size=32, target="bad").repack(packed)
    with pytest.raises(ValueError, match="expected one of its inputs .* got 'weight'"):
        GemmW4A16FwdOp(group_size=32, target=TARGET).prepare_weight("weight", packed)


def test_the_conformance_harness_prepares_the_targets_inputs(swapped):
    cases = harness.cases(TARGET, device="cpu", scale="tiny", ops=["GemmW4A16FwdOp"])
    assert cases
    outcomes = [harness.measure(case) for case in cases]
    assert all(o.passed for o in outcomes), [o.message for o in outcomes if not o.passed]


def test_the_transformers_integration_prepares_a_stack_of_4_bit_linears_once_and_reads_it(swapped):
    """Stacked projections (fused/fusion.py) hand the kernel the stack in the target's layout:
    the whole GEMM and each projection's part compute from it."""
    hf = pytest.importorskip("tileops.integrations.transformers")
    from tileops.integrations.transformers.fused.fusion import StackedLinear  # noqa: PLC0415

    gen = torch.Generator().manual_seed(2)
    linears = [
        hf.W4A16Linear(*int4.quantize(torch.randn(n, 64, generator=gen) * 0.02, group_size=32), group_size=32)
        for n in (16, 8)
    ]
    stack = StackedLinear(linears, GemmW4A16FwdOp(group_size=32, target=TARGET), add=None)
    stack.apply()
    assert torch.equal(stack.served[0], _swap_nibbles(stack.weights[0], group_size=32))
    x = torch.randn(3, 64, generator=gen)
    want = x @ torch.cat([m.dequantized() for m in linears]).t()
    assert torch.allclose(stack(x), want)
    assert all(torch.allclose(p, w) for p, w in zip(stack.parts(x), want.split([16, 8], dim=-1)))
