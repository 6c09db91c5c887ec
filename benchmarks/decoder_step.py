"""A Llama-style decoder step on the CPU: tileops (target native_cpu) vs torch eager.

    .venv-demo/bin/python benchmarks/decoder_step.py              # ~30 s on 2 cores
    .venv-demo/bin/python benchmarks/decoder_step.py --rounds 9 --steps 64 --threads 1

Runs ``examples/llama_step.py`` (imported by path): ``TileopsDecoder`` built from tileops
ops with ``set_default_target("native_cpu")`` and ``EagerDecoder`` in plain torch eager,
bfloat16, batch 1. The two are interleaved for several rounds (A, B, B, A, ...); each round
generates ``--steps`` tokens from position ``--start``. Reported: tokens/s per round, the
median and the best of each, and the ratio of medians (target >= 1.5x). The machine may be
shared: the spread between rounds is printed so a reader can judge the noise.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import torch

from tileops.backend import set_default_target

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
import llama_step  # noqa: E402

TARGET_RATIO = 1.5


def tokens_per_s(decoder, cfg: llama_step.Config, steps: int, start: int) -> float:
    t0 = time.perf_counter()
    llama_step.generate(decoder, cfg, steps, start=start)
    return steps / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=48, help="tokens generated per round")
    ap.add_argument("--start", type=int, default=128, help="first position (KV cache length at the first step)")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads for both sides (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    set_default_target("native_cpu")
    cfg = llama_step.Config()
    if args.start + args.steps > cfg.max_seq:
        ap.error(f"--start + --steps must be at most max_seq={cfg.max_seq}")
    weights = llama_step.make_weights(cfg)
    decoders = {
        "tileops/native_cpu": llama_step.TileopsDecoder(cfg, weights),
        "torch eager": llama_step.EagerDecoder(cfg, weights),
    }
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}; decoder hidden {cfg.hidden}, "
        f"heads {cfg.heads}/{cfg.heads_kv} x {cfg.head_dim}, mlp {cfg.mlp}, layers {cfg.layers}, {cfg.dtype}, batch 1"
    )
    # warm up (kernels are built on first use) and check the two agree
    outs = {name: llama_step.generate(d, cfg, 8, start=args.start) for name, d in decoders.items()}
    a, b = outs.values()
    diff = (a.float() - b.float()).abs().max().item()
    print(f"max |difference| over 8 tokens: {diff:.2e}")
    names = list(decoders)
    rates: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            rates[n].append(tokens_per_s(decoders[n], cfg, args.steps, args.start))
        print(f"round {r + 1}: " + ", ".join(f"{n} {rates[n][-1]:7.1f} tok/s" for n in names), flush=True)
    print()
    print(f"{'':<20} {'median tok/s':>12} {'best tok/s':>11} {'worst tok/s':>12} {'ms/token':>9}")
    for n in names:
        med = statistics.median(rates[n])
        print(f"{n:<20} {med:12.1f} {max(rates[n]):11.1f} {min(rates[n]):12.1f} {1e3 / med:9.3f}")
    ratio = statistics.median(rates[names[0]]) / statistics.median(rates[names[1]])
    per_round = sorted(x / y for x, y in zip(rates[names[0]], rates[names[1]]))
    print(
        f"\nspeed-up (ratio of medians) {ratio:.2f}x; per-round ratios {per_round[0]:.2f}..{per_round[-1]:.2f}; "
        f"target >= {TARGET_RATIO}x: {'ok' if ratio >= TARGET_RATIO else 'MISS'}"
    )
    native = sys.modules.get("tileops_native_cpu.builders")
    if native is not None and hasattr(native.native(), "pool_stats"):
        rounds, chunks, caller, on_team, stalls, alone = native.native().pool_stats()
        if rounds:
            print(
                f"native_cpu parallel regions: {rounds}, {on_team / rounds:.0%} on torch's OpenMP team, "
                f"{stalls} stalled, {alone} on the calling thread alone after a stall; "
                f"calling thread ran {caller / max(chunks, 1):.0%} of the chunks"
            )
    set_default_target(None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
