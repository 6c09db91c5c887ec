"""vLLM with and without the tileops plugin, side by side in one run (issue 42).

    make bench-vllm                                         # builds .venv-vllm, then runs this
    .venv-vllm/bin/python benchmarks/vllm_serving.py        # SmolLM2-135M-Instruct, bf16
    .venv-vllm/bin/python benchmarks/vllm_serving.py --rounds 1 --skip-online --json out.json

Systems: ``vllm`` (``VLLM_PLUGINS`` names another plugin: vLLM's own CPU kernels) and
``tileops`` (the plugin on the target detection picks), on the same checkpoint: the tests'
SmolLM2-135M-Instruct GGUF file dequantized to bf16 safetensors (made once under
build/vllm-bench). vLLM's default configuration (torch.compile; ``--eager`` for
``enforce_eager``), 2 threads, KV cache 2 GiB, greedy, EOS ignored.

Offline (``LLM.generate``), one fresh engine per system and round, the systems in turn
(A B A B ...), each measured ``--repeats`` times within its engine after a warm-up:
- throughput at batch 1, 8 and 32: generated tokens / wall time of one ``generate`` of
  ``--new-tokens`` tokens per prompt, prefill included (prompts: ``--prompt-tokens`` tokens
  of the text, each from its own offset);
- decode tok/s at batch 1: (n - 1) / (time of n tokens - time of 1 token), prefill excluded;
- perplexity: from the prompt log-probs of ``--ppl-tokens`` tokens of the text.
Online (``vllm serve``, OpenAI completions API on 127.0.0.1, streamed), one server per
system and round: at concurrency 1, 8 and 32, ``--requests`` requests (at least 2 x the
concurrency) whose prompt and output lengths are drawn once (seeded) from
``--online-prompt`` and ``--online-output`` ranges: output tok/s, time to first token and
time per output token (after the first), medians over requests.
Figures are medians over rounds with their ranges. The text is the transformers tests'
(tests/integrations/transformers/_real_model.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import platform
import random
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SYSTEMS = {"vllm": "lora_filesystem_resolver", "tileops": None}  # VLLM_PLUGINS per system


def environment(system: str, **extra: str) -> dict:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", **extra}
    env.pop("VLLM_PLUGINS", None)
    if SYSTEMS[system] is not None:
        env["VLLM_PLUGINS"] = SYSTEMS[system]
    return env


# --- offline: one engine in this process (run as a child with --offline-child) ----------


def offline_child(args) -> None:
    from vllm import LLM, SamplingParams  # noqa: PLC0415

    ids = json.loads(pathlib.Path(args.text_ids).read_text())
    llm = LLM(model=args.model, dtype="bfloat16", max_model_len=2048, enforce_eager=args.eager, seed=0)

    def prompts(batch: int) -> list:
        step = max(1, (len(ids) - args.prompt_tokens) // max(batch, 1))
        return [{"prompt_token_ids": ids[i * step : i * step + args.prompt_tokens]} for i in range(batch)]

    def timed(batch: int, tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, detokenize=False)
        start = time.perf_counter()
        llm.generate(prompts(batch), params, use_tqdm=False)
        return time.perf_counter() - start

    for batch in args.batches:  # warm-up: every shape once
        timed(batch, 8)
    out: dict = {"throughput": {}, "decode_b1": []}
    for _ in range(args.repeats):
        for batch in args.batches:
            out["throughput"].setdefault(str(batch), []).append(batch * args.new_tokens / timed(batch, args.new_tokens))
        out["decode_b1"].append((args.new_tokens - 1) / (timed(1, args.new_tokens) - timed(1, 1)))
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
    (res,) = llm.generate([{"prompt_token_ids": ids[: args.ppl_tokens]}], params, use_tqdm=False)
    logprobs = [next(iter(step.values())).logprob for step in res.prompt_logprobs[1:]]
    out["perplexity"] = float(pow(2.718281828459045, -sum(logprobs) / len(logprobs)))
    print("RESULT " + json.dumps(out), flush=True)


def offline_round(system: str, args, model: pathlib.Path, text_ids: pathlib.Path) -> dict:
    cmd = [sys.executable, __file__, "--offline-child", "--model", str(model), "--text-ids", str(text_ids)]
    cmd += ["--batches", *map(str, args.batches), "--new-tokens", str(args.new_tokens)]
    cmd += ["--prompt-tokens", str(args.prompt_tokens), "--repeats", str(args.repeats)]
    cmd += ["--ppl-tokens", str(args.ppl_tokens)] + (["--eager"] if args.eager else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=environment(system), timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        sys.exit(f"{system}: the offline engine failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    if proc.returncode:  # vLLM 0.32's teardown sometimes force-kills its engine core, with or without the plugin
        print(f"# {system}: the engine exited with {proc.returncode} after its result (teardown)", flush=True)
    return json.loads(lines[0][len("RESULT ") :])


# --- online: `vllm serve` and a streaming client -----------------------------------------


def start_server(system: str, model: pathlib.Path, port: int, eager: bool) -> subprocess.Popen:
    # `vllm serve` as a module: vllm-cpu 0.32's CLI looks up a distribution named vllm
    # ("No package metadata was found for vllm"); its server entry does not
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.launchers.api_server.entry",
        "--model",
        str(model),
        "--port",
        str(port),
    ]
    cmd += ["--host", "127.0.0.1", "--dtype", "bfloat16", "--max-model-len", "2048", "--seed", "0"]
    cmd += ["--max-num-seqs", "64"] + (["--enforce-eager"] if eager else [])
    log = open(ROOT / "build" / "vllm-bench" / f"serve-{system}.log", "w")  # noqa: SIM115 (the server's life)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=environment(system))


async def wait_ready(port: int, server: subprocess.Popen, timeout: float = 600) -> None:
    import aiohttp  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if server.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {server.returncode} (build/vllm-bench/serve-*.log)")
            try:
                async with session.get(f"http://127.0.0.1:{port}/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(1)
    raise TimeoutError("vllm serve did not become ready")


async def one_request(session, url: str, model: str, prompt: list, tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0.0}
    body |= {"ignore_eos": True, "stream": True}
    start = time.perf_counter()
    first = None
    chunks = 0
    async with session.post(url, json=body) as r:
        r.raise_for_status()
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if json.loads(line[6:])["choices"][0].get("text") is not None:
                chunks += 1
                first = first or time.perf_counter()
    end = time.perf_counter()
    return {"ttft": first - start, "tpot": (end - first) / max(tokens - 1, 1), "tokens": tokens, "end": end}


async def load(port: int, model: str, requests: list, concurrency: int) -> dict:
    import aiohttp  # noqa: PLC0415

    url = f"http://127.0.0.1:{port}/v1/completions"
    gate = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=3600)

    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def bounded(prompt, tokens):
            async with gate:
                return await one_request(session, url, model, prompt, tokens)

        start = time.perf_counter()
        done = await asyncio.gather(*(bounded(p, n) for p, n in requests))
    wall = max(d["end"] for d in done) - start
    return {
        "output_tok_s": sum(d["tokens"] for d in done) / wall,
        "ttft_ms": 1000 * statistics.median(d["ttft"] for d in done),
        "tpot_ms": 1000 * statistics.median(d["tpot"] for d in done),
    }


def online_round(system: str, args, model: pathlib.Path, ids: list, port: int) -> dict:
    rng = random.Random(0)
    server = start_server(system, model, port, args.eager)
    try:
        asyncio.run(wait_ready(port, server))
        out = {}
        for concurrency in args.concurrency:
            requests = []
            for _ in range(max(args.requests, 2 * concurrency)):
                length = rng.randint(*args.online_prompt)
                offset = rng.randint(0, len(ids) - length)
                requests.append((ids[offset : offset + length], rng.randint(*args.online_output)))
            asyncio.run(load(port, str(model), requests[:2], min(concurrency, 2)))  # warm-up
            out[str(concurrency)] = asyncio.run(load(port, str(model), requests, concurrency))
        return out
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()


# --- the run ------------------------------------------------------------------------------


def med(values: list[float], fmt: str = "{:.0f}") -> str:
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def prepare(args) -> tuple[pathlib.Path, list]:
    from transformers import AutoTokenizer  # noqa: PLC0415

    from tests.integrations.transformers._real_model import text_ids  # noqa: PLC0415
    from tests.integrations.vllm._checkpoints import write_real  # noqa: PLC0415

    folder = write_real(ROOT / "build" / "vllm-bench" / "smollm2-135m-instruct")
    ids = text_ids(AutoTokenizer.from_pretrained(folder), 3000)[0].tolist()
    return folder, ids


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="offline engines per system (interleaved)")
    p.add_argument("--online-rounds", type=int, default=1, help="servers per system (interleaved)")
    p.add_argument("--repeats", type=int, default=3, help="measurements per engine")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--ppl-tokens", type=int, default=1024)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--requests", type=int, default=32, help="requests per concurrency (at least 2 x it)")
    p.add_argument("--online-prompt", type=int, nargs=2, default=[32, 512], metavar=("MIN", "MAX"))
    p.add_argument("--online-output", type=int, nargs=2, default=[16, 128], metavar=("MIN", "MAX"))
    p.add_argument("--eager", action="store_true", help="enforce_eager (else vLLM's torch.compile default)")
    p.add_argument("--skip-online", action="store_true")
    p.add_argument("--port", type=int, default=18642)
    p.add_argument("--json", type=pathlib.Path, help="write the raw figures here too")
    p.add_argument("--offline-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--text-ids", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.offline_child:
        offline_child(args)
        return

    model, ids = prepare(args)
    text_ids = ROOT / "build" / "vllm-bench" / "text_ids.json"
    text_ids.write_text(json.dumps(ids))
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; model {model}", flush=True)
    offline: dict = {s: [] for s in SYSTEMS}
    for r in range(args.rounds):
        for system in SYSTEMS:
            offline[system].append(offline_round(system, args, model, text_ids))
            print(f"round {r} {system}: {json.dumps(offline[system][-1]['throughput'])}", flush=True)
    online: dict = {s: [] for s in SYSTEMS}
    if not args.skip_online:
        for r in range(args.online_rounds):
            for system in SYSTEMS:
                online[system].append(online_round(system, args, model, ids, args.port))
                print(f"online round {r} {system}: {json.dumps(online[system][-1])}", flush=True)
    report(args, offline, online)
    if args.json:
        args.json.write_text(json.dumps({"offline": offline, "online": online}, indent=1))


def report(args, offline: dict, online: dict) -> None:
    def tp(system: str, batch: int) -> list[float]:
        return [statistics.median(r["throughput"][str(batch)]) for r in offline[system]]

    def dec(system: str) -> list[float]:
        return [statistics.median(r["decode_b1"]) for r in offline[system]]

    heads = [f"batch {b} tok/s" for b in args.batches]
    print("\n| system | " + " | ".join(heads) + " | decode batch 1 tok/s | perplexity |")
    print("|---" * (len(heads) + 3) + "|")
    for system in SYSTEMS:
        cells = [med(tp(system, b)) for b in args.batches]
        ppl = statistics.median(r["perplexity"] for r in offline[system])
        print(f"| {system} | " + " | ".join(cells) + f" | {med(dec(system), '{:.1f}')} | {ppl:.3f} |")
    ratios = [med([a / b for a, b in zip(tp("tileops", n), tp("vllm", n))], "{:.2f}x") for n in args.batches]
    dec_ratio = med([a / b for a, b in zip(dec("tileops"), dec("vllm"))], "{:.2f}x")
    ppl_gap = statistics.median(r["perplexity"] for r in offline["tileops"]) / statistics.median(
        r["perplexity"] for r in offline["vllm"]
    )
    print("| tileops / vllm | " + " | ".join(ratios) + f" | {dec_ratio} | {100 * (ppl_gap - 1):+.2f} % |")
    if not online["vllm"]:
        return
    print("\n| system | concurrency | output tok/s | TTFT ms (median) | TPOT ms (median) |")
    print("|---|---|---|---|---|")
    for c in args.concurrency:
        for system in SYSTEMS:
            rows = [r[str(c)] for r in online[system]]
            cells = [
                med([x[k] for x in rows], f)
                for k, f in (("output_tok_s", "{:.0f}"), ("ttft_ms", "{:.0f}"), ("tpot_ms", "{:.1f}"))
            ]
            print(f"| {system} | {c} | " + " | ".join(cells) + " |")
        a = statistics.median(r[str(c)]["tpot_ms"] for r in online["tileops"])
        b = statistics.median(r[str(c)]["tpot_ms"] for r in online["vllm"])
        print(f"| tileops / vllm | {c} | | | {a / b:.2f}x |")


if __name__ == "__main__":
    main()
