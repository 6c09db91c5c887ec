"""Hugging Face generate on the CPU: HF eager, HF + torch.compile, HF + tileops native_cpu.

    .venv-demo/bin/python benchmarks/hf_generate.py                 # all four workloads
    .venv-demo/bin/python benchmarks/hf_generate.py --prompts 64 --batches 1 --new 32 --rounds 3
    .venv-demo/bin/python benchmarks/hf_generate.py --compile       # adds HF + torch.compile

Model (issue 12): a Llama config with vocab 32000, hidden 1024, 8 layers, 16 query heads,
4 KV heads, head_dim 64, MLP 2816, untied head, bf16, random weights (no download). The
same weights serve every system: the model as loaded (eager), and a copy of it with
tileops.integrations.transformers.enable(copy, target="native_cpu"). The systems
interleave A, B, B, A over the rounds and the figures are medians; round 0 warms up.

Per workload (prompt length P, batch B), with greedy decoding:
- prefill tok/s: B * P / the time of generate(max_new_tokens=1) (the prompt's forward);
- decode tok/s: B / the time of one decode step: generate resumed from the prompt's cache
  for `--new` tokens minus resumed for 1, over new - 1 steps (``measure``: no prefill in
  it; no end-of-sequence token, so every run decodes them all: ``never_stop``);
- the decode bandwidth limit: weight bytes read per step / the machine's measured read
  bandwidth (native_cpu's probe, run between the rounds of each workload, median: the
  bandwidth of a shared machine moves from minute to minute), times B tokens per step;
  and the share of it reached; beside them the rate the decode streamed its weights at
  (weight bytes per step x steps per second), and the probes' range, since the share
  moves with the probe as much as with the decode;
- tileops' speed-ups over HF eager, prefill and decode;
- prefill's share of the machine's bfloat16 peak: the prompt's FLOPs (every layer's
  projections and causal attention, the head for the last token: ``prefill_flops``) per
  second, over native_cpu's bfloat16 peak probe (vdpbf16ps throughput on AVX-512 BF16,
  float FMAs elsewhere; the best of 9 at the start).
HF + tileops is the enabled model's own ``generate``: for these greedy searches, the
prefill and the first decode step run the model and every later step replays from C++
(docs/transformers.md, "Greedy search with its decode steps in C++"); hf_profile.py
times it against transformers' loop over the same replayed steps. At the end: how many of
tileops' decode steps were replayed from a captured graph of op launches, and how many of those
by the search's loop in C++.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings

import torch
import transformers

from tileops.integrations.transformers import enable
from tileops.testing.agreement import check_greedy_agreement

TARGET = "native_cpu"
CONFIG = dict(
    vocab_size=32000,
    hidden_size=1024,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=64,
    intermediate_size=2816,
    tie_word_embeddings=False,
    max_position_embeddings=4096,
)


def read_bandwidth_gbs(repeats: int = 5) -> float:
    from tileops_native_cpu import builders  # noqa: PLC0415

    return statistics.median(builders.native().probe_bandwidth("read", 256, torch.get_num_threads(), repeats))


def peak_probe() -> str:
    """What native_cpu's bfloat16 peak probe times in the build this CPU runs
    (csrc/bind/probe.cc)."""
    from tileops_native_cpu import builders  # noqa: PLC0415

    return "vdpbf16ps" if builders.native().isa() == "avx512" else "float FMA"


def bf16_peak_gflops(repeats: int = 9) -> float:
    from tileops_native_cpu import builders  # noqa: PLC0415

    return max(builders.native().probe_bf16_peak(torch.get_num_threads(), repeats))


def weight_bytes_per_step(model: torch.nn.Module) -> int:
    """Bytes of weights a decode step reads: every parameter but the embedding table (one
    row of it is read)."""
    emb = model.get_input_embeddings().weight
    return sum(p.numel() * p.element_size() for p in model.parameters() if p is not emb)


def prefill_flops(config: dict, batch: int, prompt: int) -> float:
    """Multiply-adds x 2 of a prefill: each layer's q/k/v/o and MLP projections for every
    token, causal attention (scores and P V over keys 0..i for query i), and the head for
    each sequence's last token (generate keeps only those logits)."""
    hidden, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads, heads_kv, dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    proj = hidden * (heads + 2 * heads_kv) * dim + heads * dim * hidden + 3 * hidden * inter
    attention = 2 * heads * dim * prompt * (prompt + 1) / 2
    return 2 * batch * (layers * (prompt * proj + attention) + hidden * config["vocab_size"])


def never_stop(model: torch.nn.Module) -> torch.nn.Module:
    """No end-of-sequence token for ``generate``: random weights may emit one, and every run
    must decode exactly the tokens asked for. (``min_new_tokens`` would force the length
    too, but its two logits processors run a vocabulary-wide ``torch.isin`` each per step,
    in every system, which is no part of decoding.)"""
    model.generation_config.eos_token_id = None
    return model


@torch.no_grad()
def measure(model, ids, mask, new: int, generate=None) -> tuple[float, float]:
    """(prefill seconds, seconds per decode step), each timed apart from the other.

    The prefill is generate of 1 token: the prompt's forward and its sampling; its cache
    comes back (``return_dict_in_generate``). generate then resumes from that cache, once
    for `new` tokens and, after another prefill, once for 1; the difference is new - 1
    decode steps, without any prompt's forward and without generate's own per-call setup.
    (Generate of `new` tokens from the prompt minus generate of 1 put the difference of two
    prefills into the decode figure, which at long prompts is a large part of what all the
    decode steps take; docs/performance.md.) The model must not stop early (``never_stop``).
    ``generate``: another way to call the model's generate (default ``model.generate``)."""
    generate = model.generate if generate is None else generate
    kw = dict(do_sample=False, pad_token_id=0)
    resumed_mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)

    def prefill_then_resume(steps: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        first = generate(ids, attention_mask=mask, max_new_tokens=1, return_dict_in_generate=True, **kw)
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        cache = "cache" if "cache" in first else "past_key_values"  # the name before transformers 5.24
        out = generate(
            first.sequences, attention_mask=resumed_mask, **{cache: first[cache]}, max_new_tokens=steps, **kw
        )
        resumed = time.perf_counter() - t0
        if out.shape[1] != first.sequences.shape[1] + steps:
            raise RuntimeError(
                f"generate stopped after {out.shape[1] - first.sequences.shape[1]} of {steps} tokens (call never_stop)"
            )
        return prefill, resumed

    prefill, many = prefill_then_resume(new)
    _, one = prefill_then_resume(1)
    return prefill, max(many - one, 1e-9) / (new - 1)


def agreement(ref, got, prompt: int) -> str:
    """The tests' rule (tileops.testing.agreement): tokens must agree while the reference's
    top-2 margin exceeds the bf16 logits tolerance (0.004 + 2% of the largest logit)."""
    logits = torch.stack(ref.logits)
    tol = 0.004 + 0.02 * float(logits.float().abs().max())
    ref_tokens, tokens = ref.sequences[:, prompt:], got.sequences[:, prompt:]
    same = int((ref_tokens == tokens).all(dim=0).int().cumprod(0).sum())
    try:
        sure = check_greedy_agreement(logits, ref_tokens, tokens, tol)
    except AssertionError as e:
        return f"DISAGREE where the reference is sure: {e}"
    return (
        f"the first {same} of {tokens.shape[1]} agree; the reference is sure for {min(sure)} steps "
        f"(margin > {tol:.3f}): agree"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--new", type=int, default=64, help="tokens generated per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="also HF + torch.compile (slow to compile)")
    ap.add_argument(
        "--target",
        default=TARGET,
        help="the target HF + tileops runs on (default native_cpu); "
        "TILEOPS_DECODE_REPLAY=0 turns the decode replay off, for its share of the speed",
    )
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = never_stop(transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).to(torch.bfloat16).eval())
    params = sum(p.numel() for p in model.parameters())
    step_bytes = weight_bytes_per_step(model)
    bw, peak = read_bandwidth_gbs(), bf16_peak_gflops()
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, threads {torch.get_num_threads()}; "
        f"Llama {params / 1e6:.1f}M params bf16; weights read per decode step {step_bytes / 1e6:.1f} MB; "
        f"read bandwidth at start {bw:.1f} GB/s (each workload's limit uses the probes between its rounds); "
        f"bf16 peak {peak:.0f} GFLOP/s ({peak_probe()} probe)"
    )

    on_tileops = copy.deepcopy(model)
    enable(on_tileops, target=args.target)
    systems = {"HF eager": model, "HF + tileops": on_tileops}
    if args.compile:
        systems["HF + torch.compile"] = torch.compile(copy.deepcopy(model))
    print(
        f"\n{'workload':<14} {'system':<20} {'prefill tok/s':>13} {'% of peak':>9} {'decode tok/s':>12} "
        f"{'weights GB/s':>12} {'read GB/s':>9} {'limit tok/s':>11} {'% of limit':>10}"
    )
    for prompt in args.prompts:
        for batch in args.batches:
            gen = torch.Generator().manual_seed(prompt + batch)
            ids = torch.randint(1, CONFIG["vocab_size"], (batch, prompt), generator=gen)
            mask = torch.ones_like(ids)
            results: dict[str, list[tuple[float, float]]] = {n: [] for n in systems}
            tokens: dict[str, torch.Tensor] = {}
            probes: list[float] = []
            for r in range(args.rounds + 1):  # round 0 warms up (kernels built, compile)
                probes.append(read_bandwidth_gbs(3))
                order = list(systems) if r % 2 == 0 else list(systems)[::-1]
                for name in order:
                    m = systems[name]
                    res = measure(m, ids, mask, args.new)
                    if r == 0:
                        with torch.no_grad():
                            tokens[name] = m.generate(
                                ids,
                                attention_mask=mask,
                                max_new_tokens=16,
                                do_sample=False,
                                pad_token_id=0,
                                output_logits=True,
                                return_dict_in_generate=True,
                            )
                    else:
                        results[name].append(res)
            bw = statistics.median(probes)
            limit = bw * 1e9 / step_bytes * batch
            figures = {}
            for name in systems:
                pre = statistics.median(batch * prompt / p for p, _ in results[name])
                dec = statistics.median(batch / d for _, d in results[name])
                figures[name] = (pre, dec)
                share = prefill_flops(CONFIG, batch, prompt) / (batch * prompt / pre) / 1e9 / peak
                streamed = dec / batch * step_bytes / 1e9
                print(
                    f"P{prompt:<4} B{batch:<7} {name:<20} {pre:13.1f} {100 * share:8.1f}% {dec:12.1f} "
                    f"{streamed:12.1f} {bw:9.1f} {limit:11.1f} {100 * dec / limit:9.1f}%",
                    flush=True,
                )
            (pe, de), (pt, dt) = figures["HF eager"], figures["HF + tileops"]
            print(f"{'':<14} tileops vs HF eager: prefill {pt / pe:.2f}x, decode {dt / de:.2f}x")
            print(f"{'':<14} read probe between rounds: median {bw:.1f} GB/s, {min(probes):.1f}-{max(probes):.1f}")
            print(f"{'':<14} greedy tokens vs eager: {agreement(tokens['HF eager'], tokens['HF + tileops'], prompt)}")
    fused = getattr(getattr(on_tileops.model, "_tileops", None), "fused", None)
    replay = getattr(fused, "replay", None)
    if replay is not None:  # decode steps replayed from a captured graph (docs/transformers.md)
        refused = f"; not replayed at batch sizes {replay.refused}" if replay.refused else ""
        print(
            f"\nHF + tileops decode steps replayed from a captured graph: {replay.replays}, of which {replay.searched} "
            f"by greedy search's loop in C++{refused}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
