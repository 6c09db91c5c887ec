import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import close, run, spec
from tileops_native_cpu import builders as b


@pytest.fixture
def fallback(native):
    native.force_fallback(True)
    yield native
    native.force_fallback(False)


def test_the_exchange_api_is_used_when_torch_offers_it(native):
    assert native.uses_exchange_api() == hasattr(torch.Tensor, "__dlpack_c_exchange_api__")


def test_kernels_give_the_same_results_through_the_dlpack_method_and_torch_empty_fallback(fallback):
    assert not fallback.uses_exchange_api()
    x, w = torch.randn(5, 96, dtype=torch.bfloat16), torch.randn(96, dtype=torch.bfloat16)
    out = run(b.build_rms_norm, x, w, normalized_shape=(96,), eps=1e-6)
    close(out, torch.nn.functional.rms_norm(x, (96,), w, 1e-6))
    r = torch.randn(5, 96, dtype=torch.bfloat16)
    out, res = run(b.build_fused_add_rms_norm, x, r, w, eps=1e-6)
    assert torch.equal(res, x + r)
    i, j = torch.randint(-9, 9, (4, 1), dtype=torch.int16), torch.randint(-9, 9, (3,), dtype=torch.int16)
    assert torch.equal(run(b.build_add, i, j, alpha=2), torch.add(i, j, alpha=2))
    assert run(b.build_sum, torch.ones(3, 4), dim=(1,), keepdim=True).shape == (3, 1)


def test_a_kernel_refuses_a_strided_tensor_asking_for_contiguous():
    x = torch.randn(8, 64).T
    kernel = b.build_relu(spec(x), inplace=False)
    with pytest.raises(ValueError, match="contiguous"):
        kernel(x)


def test_a_kernel_refuses_a_tensor_of_another_dtype_than_it_was_built_for():
    x = torch.randn(8, 64)
    kernel = b.build_relu(spec(x), inplace=False)
    with pytest.raises(TypeError, match="built for float32; got input of dtype bfloat16"):
        kernel(x.bfloat16())


def test_a_kernel_is_sized_to_torchs_thread_count_when_built():
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = b.build_silu(spec(torch.empty(4)), inplace=False)
        torch.set_num_threads(2)
        two = b.build_silu(spec(torch.empty(4)), inplace=False)
    finally:
        torch.set_num_threads(old)
    assert (one.threads, two.threads) == (1, 2)


def test_a_builder_refuses_tensors_on_another_device():
    s = spec(torch.empty(2, 8))._replace(device=torch.device("meta"))
    with pytest.raises(ValueError, match="x on meta"):
        b.build_softmax(s, dim=-1)


SMOKE = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    from tileops_native_cpu import builders as b
    from conftest import run, close
    assert b.native().isa() == "{isa}", b.native().isa()
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.randn(7, 45, dtype=dt) * 3
        close(run(b.build_softmax, x, dim=-1), torch.softmax(x.float(), -1).to(dt))
        close(run(b.build_gelu, x, approximate="none"), F.gelu(x.float()).to(dt))
        close(run(b.build_sum, x, dim=(0,), keepdim=False), x.float().sum(0).to(dt), scale=2)
        close(run(b.build_silu_and_mul, x[:, :44].contiguous()),
              (F.silu(x[:, :22].float()) * x[:, 22:44].float()).to(dt))
        xr = torch.randn(3, 5, 2, 34, dtype=dt)  # RoPE pairs: a pair swap within each vector
        ang = torch.outer(torch.arange(5).float(), 1.0 / 10000.0 ** (torch.arange(17).float() / 17))
        c, s = ang.cos().to(dt).float()[:, None], ang.sin().to(dt).float()[:, None]
        ev, od = xr.float()[..., 0::2], xr.float()[..., 1::2]
        close(run(b.BUILDERS["RopeNonNeoxFwdOp"], xr, layout="2d", base=10000.0),
              torch.stack([ev * c - od * s, od * c + ev * s], -1).flatten(-2).to(dt))
        xn = torch.randn(5, 77, dtype=dt); xn[2, 70] = float("nan")
        assert torch.equal(run(b.build_amax, xn, dim=(1,), keepdim=False).isnan(), xn.amax(1).isnan())
        assert torch.equal(run(b.build_amax, xn, dim=(0,), keepdim=False).isnan(), xn.amax(0).isnan())
    for dt in (torch.float16, torch.bfloat16):  # what the manifests allow RMSNorm, GEMM and attention
        x = torch.randn(7, 45, dtype=dt) * 3
        w = torch.randn(45, dtype=dt)
        close(run(b.build_rms_norm, x, w, normalized_shape=(45,), eps=1e-6),
              F.rms_norm(x.float(), (45,), w.float(), 1e-6).to(dt))
        a = torch.randn(19, 40, dtype=dt)
        close(run(b.build_gemm, a, x[:, :40].contiguous(), trans_a=False, trans_b=True),
              (a.float() @ x[:, :40].float().T).to(dt), scale=10)
        for m in (1, 2, 3):  # the skinny (GEMV) path, NT and NN, K and N off the vector width
            # (NT reads B one row at a time for m <= 2, AVX2 bfloat16 in pairs; blocks of rows at m = 3)
            a1, w1 = torch.randn(m, 37, dtype=dt), torch.randn(29, 37, dtype=dt)
            close(run(b.build_gemm, a1, w1, trans_a=False, trans_b=True), (a1.float() @ w1.float().T).to(dt), scale=10)
            w2 = w1.T.contiguous()
            close(run(b.build_gemm, a1, w2, trans_a=False, trans_b=False), (a1.float() @ w2.float()).to(dt), scale=10)
        q = torch.randn(1, 20, 4, 16, dtype=dt); k = torch.randn(1, 20, 2, 16, dtype=dt)
        out = run(b.build_gqa, q, k, k, is_causal=True)
        assert out.shape == q.shape and torch.isfinite(out.float()).all()
        qd = torch.randn(2, 8, 40, dtype=dt)
        kd, vd = torch.randn(2, 37, 2, 40, dtype=dt), torch.randn(2, 37, 2, 40, dtype=dt)
        ref = F.scaled_dot_product_attention(qd.float()[:, :, None], kd.float().transpose(1, 2).repeat_interleave(4, 1),
                                             vd.float().transpose(1, 2).repeat_interleave(4, 1))[:, :, 0]
        close(run(b.build_gqa_decode, qd, kd, vd), ref.to(dt), scale=3)
    from test_moe import moe_inputs, moe_loop, moe_params
    for dt in (torch.float16, torch.bfloat16):
        for t in (2, 9):  # the MoE block's decode and prefill paths, H and F off the vector width
            x, g, wgu, wd = moe_inputs(t, 8, 37, 24, dt)
            out = run(b.build_fused_moe, x, g, wgu, wd, None, **moe_params(8, 2, 37, 24, t))
            torch.testing.assert_close(out.float(), moe_loop(x, g, wgu, wd, top_k=2), rtol=2e-2, atol=2e-2)
    _, ids = run(b.build_fused_topk, torch.tensor([[1.0, 3.0, 3.0, 0.0]]), None, top_k=2)
    assert ids.tolist() == [[1, 2]]
    print("ok")
    """
)


@pytest.mark.parametrize("isa", ["baseline", "avx2"])
def test_the_portable_and_avx2_builds_compute_the_same_results(isa):
    if isa == "avx2" and b.native().isa() == "baseline":
        pytest.skip("this CPU has no AVX2")
    env = dict(os.environ, TILEOPS_NATIVE_CPU_ISA=isa)
    here = os.path.dirname(__file__)
    done = subprocess.run(
        [sys.executable, "-c", SMOKE.format(isa=isa)], cwd=here, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


def test_importing_the_package_registers_every_op_and_compiles_nothing():
    code = textwrap.dedent(
        """
        import sys
        try:
            import tileops.backend as tb
            tb.register_detector
        except (ImportError, AttributeError):
            print("skip"); raise SystemExit
        import tileops_native_cpu
        assert "tileops_native_cpu._C" not in sys.modules
        from tileops_native_cpu.builders import BUILDERS
        from tileops import manifest
        missing = [op for op in BUILDERS if "native_cpu" not in tb.registered_targets(op)]
        unknown = sorted(set(BUILDERS) - set(manifest.all_entries()))
        assert not missing and not unknown and BUILDERS, (missing, unknown)
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.stdout.strip() == "skip":
        pytest.skip("tileops.backend is not importable here")
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
