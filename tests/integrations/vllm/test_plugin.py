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
# vLLM's plugin list without tileops: its own path
WITHOUT = "lora_filesystem_resolver"


def run(model, *args: str, plugins: str | None = None, env: dict | None = None, check: bool = True):
    """(results per prompt, the plugin's log lines) of one engine run."""
    environ = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}
    environ.pop("VLLM_PLUGINS", None)
    if plugins is not None:
        environ["VLLM_PLUGINS"] = plugins
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
    _, moe_logs = cached_run(checkpoints["qwen3-moe"])
    # the MoE experts stay on vLLM's kernels, and the line says so
    assert "on vLLM's own kernels: vLLM custom ops unquantized_fused_moe" in moe_logs[0], moe_logs


def test_compiled_mode_matches_eager(checkpoints):
    """vLLM's default mode traces the model with torch.compile: the tileops ops are custom
    ops there, with the token count dynamic."""
    eager, _ = cached_run(checkpoints["llama"])
    compiled, logs = cached_run(checkpoints["llama"], "--compile")
    assert len(logs) == 1
    check_agreement(eager, compiled)


def test_tensor_parallel_2_gives_tp1_tokens(checkpoints):
    tp1, _ = cached_run(checkpoints["llama"])
    tp2, logs = run(checkpoints["llama"], "--tp", "2", env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"})
    assert len(logs) == 2, logs  # one line per worker: each serves its shard on tileops
    check_agreement(tp1, tp2)


def test_an_unknown_target_stops_the_engine_with_the_reason(checkpoints):
    code, output = run(checkpoints["llama"], env={"TILEOPS_TARGET": "no_such_target"}, check=False)
    assert code != 0
    assert "TILEOPS_TARGET='no_such_target' is not a registered tileops target (registered: ['native_cpu'])" in output


def test_the_real_model_matches_vllms_own_path(tmp_path_factory):
    """SmolLM2-135M-Instruct: a chat question and 256 tokens of a real text, 32 greedy
    tokens each; perplexity of the prompts within 1 % of vLLM's own."""
    from transformers import AutoTokenizer  # noqa: PLC0415

    from ..transformers._real_model import chat_ids, text_ids  # noqa: PLC0415

    folder = _checkpoints.write_real(tmp_path_factory.mktemp("smollm2"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = [chat_ids(tokenizer, "What is the capital of France?")[0].tolist(), text_ids(tokenizer, 256)[0].tolist()]
    args = ("--prompts", json.dumps(prompts), "--max-tokens", "32", "--max-model-len", "1024")
    ours, logs = run(folder, *args)
    theirs, _ = run(folder, *args, plugins=WITHOUT)
    assert len(logs) == 1 and "RMSNorm x61" in logs[0], logs
    confident = check_agreement(theirs, ours)
    assert sum(confident) >= 16, confident
    check_perplexity(theirs, ours, 0.01)
