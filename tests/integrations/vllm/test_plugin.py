"""vLLM with the tileops plugin against vLLM's own CPU path, on real vLLM engines.

Each run is a fresh vLLM engine over a checkpoint this module writes (``run_vllm.py`` in a
subprocess: vLLM spawns its engine core and workers). With the plugin, the engine's layers
run tileops ops on the target detection picks (this environment installs one backend,
native_cpu); with ``VLLM_PLUGINS`` naming other plugins only, vLLM's own kernels.

Agreement: greedy tokens must match while the reference is sure (the agreement rule of
the transformers tests, on the top-2 log-prob margin of vLLM's own run), and the prompt's
perplexity from prompt log-probs stays within ``PPL`` of vLLM's own.

Runs only where vLLM is installed (``make test-vllm``, marker ``vllm``); it skips
elsewhere, and fails where ``TILEOPS_REQUIRE_VLLM`` is set.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest

if os.environ.get("TILEOPS_REQUIRE_VLLM"):
    import vllm  # noqa: F401  (an ImportError fails the module)
else:
    pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm builds .venv-vllm)")

from tileops.testing.agreement import check_greedy_agreement  # noqa: E402

from . import _checkpoints  # noqa: E402

pytestmark = pytest.mark.vllm

RUNNER = pathlib.Path(__file__).with_name("run_vllm.py")
# token-id prompts: two short, one longer than the Mistral checkpoint's window (24)
PROMPTS = [list(range(1, 9)), [9, 10, 11], list(range(20, 60))]
STEPS = 16
# the agreement rule's margin, in nats (log-prob top-1 minus top-2): the two paths' log-probs
# differ by up to about 0.04 on these checkpoints (bf16 rounding in different orders)
TOL = 0.1
# Perplexity: the real model is held to 1 %. The tiny random checkpoints' prompt tokens
# are improbable (log-probs -6 to -16), where one ulp of the bf16 logits is 0.03 to 0.125
# nats; the two paths' per-token log-probs differ by about that, without a trend along
# the prompt. So there, the perplexities' ratio stays within exp(0.1).
PPL = math.exp(0.1) - 1
# the real model's agreement margin: two bfloat16 steps of its logits (the test says why)
REAL_TOL = 0.3
# vLLM's plugin list without tileops: its own path
WITHOUT = "lora_filesystem_resolver"


def run(
    model, *args: str, plugins: str | None = None, env: dict | None = None, check: bool = True, in_process: bool = True
):
    """(results per prompt, the plugin's log lines) of one engine run. ``in_process``: the
    engine core and its worker in the caller's process (vLLM's uniprocess executor, without
    its engine-core process), which starts in a third of the time; the same layers and
    plugin hooks run. Else vLLM's default layout: an engine-core process and one worker
    process per rank, pinned to cores."""
    environ = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}
    environ.pop("VLLM_PLUGINS", None)
    if plugins is not None:
        environ["VLLM_PLUGINS"] = plugins
    if in_process:
        environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        args = ("--executor", "uni", *args)
    proc = subprocess.run(
        [sys.executable, str(RUNNER), str(model), "--prompts", json.dumps(PROMPTS), "--max-tokens", str(STEPS), *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    logs = [m.group(1) for m in re.finditer(r"\] (tileops: .*)", output)]
    if not check:
        return proc.returncode, output
    assert proc.returncode == 0, output[-6000:]
    result = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(result[len("RESULT ") :]), logs


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {arch: _checkpoints.write(arch, root / arch) for arch in _checkpoints.ARCHS}


_runs: dict = {}


def cached_run(model, *args: str, plugins: str | None = None):
    key = (str(model), args, plugins)
    if key not in _runs:
        _runs[key] = run(model, *args, plugins=plugins)
    return _runs[key]


def perplexity(logprobs: list[float]) -> float:
    return math.exp(-sum(logprobs) / len(logprobs))


def check_agreement(reference: list[dict], got: list[dict], tol: float = TOL) -> list[int]:
    """The agreement rule over every prompt; returns the confident steps per prompt."""
    import torch  # noqa: PLC0415

    # [steps, batch, 2]: the reference's top-2 log-probs, as logits the rule compares
    margins = torch.tensor([r["top2"] for r in reference]).transpose(0, 1)
    ref_tokens = torch.tensor([r["tokens"] for r in reference])
    tokens = torch.tensor([r["tokens"] for r in got])
    return check_greedy_agreement(margins, ref_tokens, tokens, tol)


def check_perplexity(reference: list[dict], got: list[dict], bound: float) -> None:
    for i, (ref, out) in enumerate(zip(reference, got)):
        want, have = perplexity(ref["prompt_logprobs"]), perplexity(out["prompt_logprobs"])
        assert abs(have / want - 1) <= bound, f"prompt {i}: perplexity {have:.4f} vs vLLM's {want:.4f}"


@pytest.mark.parametrize("arch", list(_checkpoints.ARCHS))
def test_outputs_match_vllms_own_path(checkpoints, arch):
    ours, logs = cached_run(checkpoints[arch])
    theirs, their_logs = cached_run(checkpoints[arch], plugins=WITHOUT)
    assert len(logs) == 1 and not their_logs, (logs, their_logs)
    confident = check_agreement(theirs, ours)
    assert sum(confident) >= 4, f"too few confident steps to compare: {confident}"
    check_perplexity(theirs, ours, PPL)


def test_the_log_line_names_target_served_and_kept(checkpoints):
    _, logs = cached_run(checkpoints["llama"])
    (line,) = logs
    assert re.match(r"tileops: target native_cpu \(\d+ threads\) serves ", line), line
    for served in ("Attention x2", "RMSNorm x5", "RotaryEmbedding x1", "SiluAndMul x2", "UnquantizedLinearMethod x8"):
        assert served in line, line
    assert "LM head x1" in line
    assert "UnquantizedFusedMoEMethod" not in line, line  # a dense model has no experts
    _, moe_logs = cached_run(checkpoints["qwen3-moe"])
    assert "UnquantizedFusedMoEMethod x2" in moe_logs[0], moe_logs
    assert "unquantized_fused_moe" not in moe_logs[0], moe_logs  # not listed as left on vLLM's kernels


def test_compiled_mode_matches_eager(checkpoints):
    """vLLM's default mode traces the model with torch.compile: the tileops ops are custom
    ops there, with the token count dynamic. The MoE model: its experts' routing (vLLM's
    router, then tileops' logits for it) is traced too; attention is vLLM's opaque op."""
    eager, _ = cached_run(checkpoints["qwen3-moe"])
    compiled, logs = cached_run(checkpoints["qwen3-moe"], "--compile")
    assert len(logs) == 1
    check_agreement(eager, compiled)


def test_tensor_parallel_2_gives_tp1_tokens(checkpoints):
    # both in vLLM's default process layout: TP 1 one worker process, TP 2 two
    tp1, _ = run(checkpoints["llama"], in_process=False)
    tp2, logs = run(checkpoints["llama"], "--tp", "2", env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"}, in_process=False)
    assert len(logs) == 2, logs  # one line per worker: each serves its shard on tileops
    check_agreement(tp1, tp2)


def test_an_unknown_target_stops_the_engine_with_the_reason(checkpoints):
    code, output = run(checkpoints["llama"], env={"TILEOPS_TARGET": "no_such_target"}, check=False, in_process=False)
    assert code != 0
    assert "TILEOPS_TARGET='no_such_target' is not a registered tileops target (registered: ['native_cpu'])" in output


def test_the_real_model_matches_vllms_own_path(tmp_path_factory):
    """SmolLM2-135M-Instruct: two chat questions and 192 tokens of a real text, 32 greedy
    tokens each; perplexity of the prompts within 1 % of vLLM's own."""
    from transformers import AutoTokenizer  # noqa: PLC0415

    from ..transformers._real_model import chat_ids, text_ids  # noqa: PLC0415

    folder = _checkpoints.write_real(tmp_path_factory.mktemp("smollm2"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    # prompts whose first steps vLLM's own path is sure of, beyond REAL_TOL (the capital of
    # France opens with a one-step margin)
    questions = ("Who wrote Romeo and Juliet?", "Name the largest planet in the solar system.")
    prompts = [chat_ids(tokenizer, q)[0].tolist() for q in questions] + [text_ids(tokenizer, 192)[0].tolist()]
    args = ("--prompts", json.dumps(prompts), "--max-tokens", "32", "--max-model-len", "1024")
    ours, logs = run(folder, *args)
    theirs, _ = run(folder, *args, plugins=WITHOUT)
    assert len(logs) == 1 and "RMSNorm x61" in logs[0], logs
    # vLLM's logits are bfloat16: for this model's top logits (16 to 32) one bfloat16 step is
    # 0.125 nat, and a margin of two steps closes when each logit rounds one step the other
    # way (the capital of France: vLLM's own first-step margin is exactly 0.125)
    confident = check_agreement(theirs, ours, tol=REAL_TOL)
    assert sum(confident) >= 24, confident
    # the perplexity of all prompt tokens together (the short chat prompts alone swing by
    # about 1.5 %: 35 tokens, several of them chat-template tokens one bfloat16 step apart)
    pooled = [{"prompt_logprobs": [lp for r in runs for lp in r["prompt_logprobs"]]} for runs in (theirs, ours)]
    check_perplexity(pooled[:1], pooled[1:], 0.01)


def test_moe_layers_the_op_cannot_run_exactly_keep_vllms_kernel_and_say_why():
    from types import SimpleNamespace  # noqa: PLC0415

    import torch  # noqa: PLC0415
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation  # noqa: PLC0415

    from tileops.integrations.vllm import moe  # noqa: PLC0415

    def layer(**changes):
        fields = dict(
            w13_weight=torch.empty(4, 32, 16, dtype=torch.bfloat16),
            w2_weight=torch.empty(4, 16, 16, dtype=torch.bfloat16),
            activation=MoEActivation.SILU,
            expert_map=None,
            apply_router_weight_on_input=False,
            custom_routing_function=None,
            scoring_func="softmax",
            routed_scaling_factor=1.0,
        )
        return SimpleNamespace(**{**fields, **changes})

    assert moe._refusal(layer()) is None
    assert moe._refusal(layer(scoring_func="sigmoid", activation=MoEActivation.GELU)) is None
    cases = {
        "float32 experts": dict(w13_weight=torch.empty(4, 32, 16), w2_weight=torch.empty(4, 16, 16)),
        "activation relu2": dict(activation=MoEActivation.RELU2),
        "expert parallelism": dict(expert_map=torch.arange(4)),
        "expert biases": dict(w13_bias=torch.zeros(4, 32)),
        "router weights applied to the input": dict(apply_router_weight_on_input=True),
        "weights may leave [0, 1]": dict(scoring_func="sqrtsoftplus"),
        "routed_scaling_factor 2.5": dict(routed_scaling_factor=2.5),
        "a clamped or scaled SwiGLU": dict(swiglu_limit=7.0),
        "not [E, 2F, H] and [E, H, F]": dict(w2_weight=torch.empty(4, 16, 8, dtype=torch.bfloat16)),
    }
    for why, changes in cases.items():
        assert why in (moe._refusal(layer(**changes)) or ""), (why, moe._refusal(layer(**changes)))


ROPES = {  # vLLM rotary class -> its constructor's arguments after (head_size, rotary_dim)
    "RotaryEmbedding": lambda neox: (4096, 10000.0, neox, "dtype"),
    "Llama3RotaryEmbedding": lambda neox: (4096, 500000.0, neox, "dtype", 8.0, 1.0, 4.0, 1024),
    "LinearScalingRotaryEmbedding": lambda neox: (1024, 10000.0, neox, 2.5, "dtype"),
    "DynamicNTKScalingRotaryEmbedding": lambda neox: (4096, 1024, 10000.0, neox, 4.0, "dtype"),
    # factor 4: cos and sin times an mscale of 1.139
    "YaRNScalingRotaryEmbedding": lambda neox: (1024, 10000.0, neox, 4.0, "dtype"),
}


@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("name", list(ROPES))
def test_rotary_layers_rotate_as_vllms_own(name, neox):
    """Each served rotary class against vLLM's own math on the same instance (its
    cos/sin table, ``RotaryEmbedding.forward_native``), partial rotary dim, positions
    across the scaled context."""
    import torch  # noqa: PLC0415
    from vllm.config import VllmConfig, set_current_vllm_config  # noqa: PLC0415
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding  # noqa: PLC0415

    from tileops.integrations.vllm import layers  # noqa: PLC0415

    cls = next(c for c in layers.LAYERS if c._vllm_name == name)
    args = [torch.bfloat16 if a == "dtype" else a for a in ROPES[name](neox)]
    head, rotary = 64, 48
    with set_current_vllm_config(VllmConfig()):
        layer = cls(head, rotary, *args)
    if layer._op is None:  # refused on GPT-J pairs only: Llama 3, linear, YaRN (a NeoX op each)
        assert not neox and name in (
            "Llama3RotaryEmbedding",
            "LinearScalingRotaryEmbedding",
            "YaRNScalingRotaryEmbedding",
        ), name
        return
    gen = torch.Generator().manual_seed(0)
    positions = torch.randint(0, layer.cos_sin_cache.shape[0], (33,), generator=gen)
    q = torch.randn(33, 4 * head, generator=gen).bfloat16()
    k = torch.randn(33, 2 * head, generator=gen).bfloat16()
    want_q, want_k = RotaryEmbedding.forward_native(layer, positions, q.clone(), k.clone())
    got_q, got_k = layer.forward_native(positions, q.clone(), k.clone())
    # both round cos and sin to bf16 and the products in bf16: at most a few bf16 ulps apart
    torch.testing.assert_close(got_q.float(), want_q.float(), atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(got_k.float(), want_k.float(), atol=3e-2, rtol=2e-2)
    # and a wrong table would be far off: the rotation moves the rotated channels by O(1)
    assert (got_q.float() - q.float())[:, :rotary].abs().max() > 0.5


def test_a_vllm_layer_no_plugin_can_replace_is_listed_as_kept(monkeypatch):
    """Phi-3's LongRoPE is a plain module in vLLM (not a custom op): register() has each
    instance recorded, so the log line lists it rather than leaving it silent."""
    from types import SimpleNamespace  # noqa: PLC0415

    import torch  # noqa: PLC0415
    from vllm.model_executor.layers.rotary_embedding import phi3_long_rope_scaled_rope as phi3  # noqa: PLC0415

    from tileops.integrations.vllm import layers, report  # noqa: PLC0415

    # the module reads the engine's max_model_len (which table it uses); no engine here
    engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=4096))
    monkeypatch.setattr(phi3, "get_current_vllm_config", lambda: engine)
    monkeypatch.setattr(
        phi3.Phi3LongRoPEScaledRotaryEmbedding, "__init__", phi3.Phi3LongRoPEScaledRotaryEmbedding.__init__
    )
    layers._listed_as_kept(phi3.Phi3LongRoPEScaledRotaryEmbedding, "not a vLLM custom op: no plugin hook")
    phi3.Phi3LongRoPEScaledRotaryEmbedding(64, 64, 8192, 4096, 10000.0, True, torch.bfloat16, [1.0] * 32, [2.0] * 32)
    line = report.summary()
    assert "Phi3LongRoPEScaledRotaryEmbedding x1 (not a vLLM custom op: no plugin hook)" in line, line
