"""Where an enabled Hugging Face model's time goes: each tileops op class's share of a
decode step and of a prefill, and what is left outside the ops (the Python of
transformers' modules and of the integration).

    .venv-demo/bin/python benchmarks/hf_profile.py                # P64 decode, P512 prefill
    .venv-demo/bin/python benchmarks/hf_profile.py --prompt 512 --steps 16

The model is hf_generate.py's Llama (155.7M, bf16, random weights) enabled on native_cpu.
Every op class's ``__call__`` is wrapped with a timer for the measured forwards only; the
wrapper's own cost (about a microsecond a call) lands in "outside the ops". GEMMs are
split by shape, with the bandwidth their weight bytes imply (one row: a GEMV) or their
GFLOP/s. The time outside the ops is split by where it falls (GAPS below). For scale,
the same decode step of a model as deep but tiny (hidden 128: the same op calls and the
same Python, on warm caches), and the machine's read bandwidth. Decode steps are timed
twice, replayed from a captured graph of op launches (the default: docs/transformers.md) and
through the fused loop; the per-op profile runs through the loop, since a replayed step
makes no op calls. Then the captured graph is replayed alone with each launch timed by
the graph (``replay_timed``), per kernel and argument shapes: the kernels' own share of a
replayed step, without the Python around them. Last for the decode, ``generate``'s step
per token split into transformers' generate loop, the integration's Python and the replay
(``generate_split``: transformers' loop, which ``type(model).generate`` runs), for the
model and for the tiny one: the Python's cost on caches the weights flushed, against the
same Python on warm ones. Then the enabled model's own greedy ``generate``, whose decode
steps after the first replay from C++ with no Python between them (_generate.py), against
transformers' loop over the same replayed steps, alternated (``search_side_by_side``).
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import time
import warnings

import torch
import transformers
from hf_generate import CONFIG, TARGET, measure, never_stop, read_bandwidth_gbs, weight_bytes_per_step

from tileops import ops
from tileops.integrations.transformers import enable

# Where the time outside the ops goes: the Python that runs before a forward's first op
# (transformers' model forward, the integration's head), between two ops (split by what
# ran before: a GEMM streams megabytes of weights through the caches, so the Python after
# it runs cold), and after the last op (transformers' output). One `with timer:` block is
# one forward.
GAPS = ("before the first op", "between ops, after a GEMM", "between ops, after another op", "after the last op")


class OpTimer:
    """Wraps every op class's __call__ while active; accumulates seconds per key, and the
    time between the ops per GAPS class."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter[str] = collections.Counter()
        self.gaps: dict[str, float] = dict.fromkeys(GAPS, 0.0)
        self.gap_counts: collections.Counter[str] = collections.Counter()
        self.classes = [getattr(ops, n) for n in dir(ops) if n.endswith("Op") and isinstance(getattr(ops, n), type)]
        self.saved: dict[type, object] = {}
        self.last_end, self.last_was_gemm = 0.0, None  # None: no op yet in this forward

    def __enter__(self) -> OpTimer:
        for cls in self.classes:
            self.saved[cls] = cls.__call__
            cls.__call__ = self._timed(cls, cls.__call__)
        self.last_end, self.last_was_gemm = time.perf_counter(), None
        return self

    def __exit__(self, *exc: object) -> None:
        self._gap(GAPS[3], time.perf_counter())
        for cls, call in self.saved.items():
            cls.__call__ = call

    def _gap(self, kind: str, now: float) -> None:
        self.gaps[kind] += now - self.last_end
        self.gap_counts[kind] += 1

    def _timed(self, cls: type, call):
        def timed(op, *args, **kwargs):
            t0 = time.perf_counter()
            self._gap(GAPS[0] if self.last_was_gemm is None else GAPS[1] if self.last_was_gemm else GAPS[2], t0)
            out = call(op, *args, **kwargs)
            key = cls.__name__
            if key == "GemmFwdOp":  # x [M, K] @ weight [N, K]^T
                key += f" m{args[0].shape[0]} n{args[1].shape[0]} k{args[1].shape[1]}"
            self.last_end = time.perf_counter()
            self.last_was_gemm = cls.__name__ == "GemmFwdOp"
            self.seconds[key] += self.last_end - t0
            self.calls[key] += 1
            return out

        return timed


def report(title: str, timer: OpTimer, total: float, per: int) -> None:
    print(f"\n{title}: {total / per * 1e3:.2f} ms each")
    for key, sec in sorted(timer.seconds.items(), key=lambda kv: -kv[1]):
        extra = ""
        if key.startswith("GemmFwdOp"):
            m, n, k = (int(w[1:]) for w in key.split()[1:])
            per_call = sec / timer.calls[key]
            extra = (
                f"  {n * k * 2 / per_call / 1e9:6.1f} GB/s of weight"
                if m == 1
                else f"  {2 * m * n * k / per_call / 1e9:6.1f} GFLOP/s"
            )
        print(f"  {key:<52} {sec / per * 1e3:8.3f} ms  {timer.calls[key] / per:5.1f} calls{extra}")
    inside = sum(timer.seconds.values())
    print(f"  {'ops':<52} {inside / per * 1e3:8.3f} ms")
    print(f"  {'outside the ops (transformers, integration, wrapper)':<52} {(total - inside) / per * 1e3:8.3f} ms")
    for kind in GAPS:
        n = timer.gap_counts[kind]
        mean = f"  {timer.gaps[kind] / n * 1e6:6.1f} us each" if n else ""
        print(f"    {kind:<50} {timer.gaps[kind] / per * 1e3:8.3f} ms  {n / per:5.1f} gaps{mean}")


def report_graph(graph, replays: int) -> None:
    """The recorded decode step replayed alone (no model Python around it), each call timed
    by the graph; per kernel and argument shapes: medians over the replays, summed over the
    step's calls."""
    names = graph.descriptions()
    runs = [graph.replay_timed() for _ in range(replays)]
    per_call = [statistics.median(run[i] for run in runs) for i in range(len(names))]
    total = statistics.median(sum(run) for run in runs)
    groups: dict[str, list[float]] = collections.defaultdict(list)
    for name, sec in zip(names, per_call):
        groups[name.removeprefix(f"{TARGET} ")].append(sec)
    print(
        f"\ndecode step replayed alone from its captured graph ({len(names)} calls, medians of {replays} replays): "
        f"{total * 1e3:.2f} ms"
    )
    for name, secs in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        kernel, calls = name.split(": ", 1)  # "GemmFwdOp(...)", "[1, 1024], [5632, 1024] -> [1, 5632]"
        inputs = calls.split(" -> ")[0]
        shapes = [[int(d) for d in re.findall(r"\d+", s)] for s in re.findall(r"\[[\d, ]*\]", inputs)]
        extra = ""
        if kernel.startswith("GemmFwdOp") and len(shapes) >= 2 and shapes[0][0] == 1:
            n, k = shapes[1]
            extra = f"  {n * k * 2 / statistics.median(secs) / 1e9:6.1f} GB/s of weight"
        label = f"{kernel.split('(', 1)[0]} {inputs}"
        print(f"  {label:<64.64} {sum(secs) * 1e3:8.3f} ms  {len(secs):3d} calls{extra}")


TINY = dict(
    CONFIG, vocab_size=512, hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1
)


def tiny_model() -> torch.nn.Module:
    """CONFIG's model at hidden 128 (same depth and head_dim, so the same op calls and
    Python per step), enabled the same way: its steps run on warm caches."""
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).to(torch.bfloat16).eval()
    enable(model, target=TARGET)
    return never_stop(model)


@torch.no_grad()
def tiny_decode_step(ids: torch.Tensor, steps: int, replay: bool) -> float:
    """Median seconds of a decode step of the tiny model; its steps replayed from a kernel
    graph or run through the loop."""
    model = tiny_model()
    if not replay:
        model.model._tileops.fused.replay = None
    out = model(ids % TINY["vocab_size"], use_cache=True)
    cache, tok, times = out.past_key_values, out.logits[:, -1:].argmax(-1), []
    for i in range(steps + 4):
        t0 = time.perf_counter()
        out = model(tok, past_key_values=cache, use_cache=True, position_ids=torch.tensor([[ids.shape[1] + i]]))
        times.append(time.perf_counter() - t0)
        tok = out.logits[:, -1:].argmax(-1)
    return statistics.median(times[4:])


# A generate decode step, outermost first: what each measured stretch holds that the one
# inside it does not (generate_split).
SPLIT = (
    ("transformers' generate loop outside the model's forward", "inputs, logits processing, argmax, stopping"),
    ("the integration's causal LM forward around its decode step", "embedding, argument checks, the output object"),
    ("the integration's decode step around the replay", "copies in, the cache's bookkeeping, the logits' copy"),
    ("the kernels: the step's graph replayed", ""),
)


@torch.no_grad()
def generate_split(model: torch.nn.Module, ids: torch.Tensor, new: int) -> list[float]:
    """Median seconds per token of ``model.generate``'s decode steps (greedy, batch 1), and
    of each stretch of SPLIT, from timers around the model's forward, the fused model's
    decode step and its graph's replay (``DecodeReplay.replay_seconds``)."""
    replay = model.model._tileops.fused.replay
    times: dict[str, list[float]] = {"token": [], "forward": [], "step": [], "replay": []}
    forward, step = model.forward, replay.step

    def timed(fn, key):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            times[key].append(time.perf_counter() - t0)
            if key == "step":
                times["replay"].append(replay.replay_seconds)
            return out

        return run

    class Tokens(transformers.generation.streamers.BaseStreamer):
        def put(self, value):
            times["token"].append(time.perf_counter())

        def end(self):
            pass

    patched = "forward" in vars(model)  # enable() patches a causal LM's forward per instance
    model.forward, replay.step = timed(forward, "forward"), timed(step, "step")
    try:
        for _ in range(2):  # the first generate builds the kernels
            for v in times.values():
                v.clear()
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new,
                do_sample=False,
                streamer=Tokens(),
                pad_token_id=0,
            )
    finally:
        del replay.step  # the class's method again
        if patched:
            model.forward = forward
        else:
            del model.forward
    last = new // 2  # replayed steps only (the first decode steps build the kernels and capture the graph)
    token = [b - a for a, b in zip(times["token"][1:], times["token"][2:])][-last:]
    fwd, stp, rep = (times[k][-last:] for k in ("forward", "step", "replay"))
    return [
        statistics.median(token),
        statistics.median(t - f for t, f in zip(token, fwd)),
        statistics.median(f - s for f, s in zip(fwd, stp)),
        statistics.median(s - r for s, r in zip(stp, rep)),
        statistics.median(rep),
    ]


@torch.no_grad()
def search_side_by_side(model: torch.nn.Module, ids: torch.Tensor, new: int, rounds: int = 5) -> dict[str, float]:
    """Median seconds per decode step of greedy ``generate`` with its steps replayed from C++
    (the enabled model's own generate: _generate.py) and of transformers' loop over the
    same replayed steps (``type(model).generate``), alternated over ``rounds``: each is
    hf_generate.measure's decode step (generate resumed from the prompt's cache for ``new``
    tokens minus for 1, over new - 1 steps)."""
    loops = {
        "the search in C++": model.generate,
        "transformers' loop": lambda *a, **k: type(model).generate(model, *a, **k),
    }
    times: dict[str, list[float]] = {name: [] for name in loops}
    for r in range(rounds + 1):  # round 0 warms up
        for name in list(loops) if r % 2 else list(loops)[::-1]:
            _, step = measure(model, ids, torch.ones_like(ids), new, loops[name])
            if r:
                times[name].append(step)
    return {name: statistics.median(v) for name, v in times.items()}


def report_split(title: str, split: list[float], weight_bytes: int | None = None, gbs: float | None = None) -> None:
    """SPLIT's stretches; with the step's weight bytes and the read bandwidth, the share of
    hf_generate.py's decode limit (weights / bandwidth per step) the step reached, and the
    most it could reach with the kernels at the probe's rate: with all this Python, and
    with transformers' generate loop's alone (the part no integration can remove)."""
    print(f"\n{title}: {split[0] * 1e3:.2f} ms per token (medians over the replayed steps)")
    for (what, holds), sec in zip(SPLIT, split[1:]):
        print(f"  {what:<62} {sec * 1e3:7.3f} ms  {holds}")
    if weight_bytes is not None and gbs is not None:
        floor = weight_bytes / (gbs * 1e9)  # the kernels at the read probe's rate
        python = sum(split[1:4])
        print(
            f"  at the read probe's {gbs:.1f} GB/s the weights take {floor * 1e3:.2f} ms: this step reached "
            f"{100 * floor / split[0]:.0f}% of the limit, the replay alone {100 * floor / split[4]:.0f}%; with this "
            f"Python ({python * 1e3:.2f} ms) around kernels at the probe's rate, "
            f"at most {100 * floor / (floor + python):.0f}%; "
            f"with transformers' loop alone ({split[1] * 1e3:.2f} ms), at most {100 * floor / (floor + split[1]):.0f}%"
        )


@torch.no_grad()
def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", type=int, default=64, help="prompt length before the decode steps")
    ap.add_argument("--steps", type=int, default=32, help="decode steps timed")
    ap.add_argument("--prefill", type=int, default=512, help="prompt length of the timed prefill")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).to(torch.bfloat16).eval()
    print(enable(model, target=TARGET))
    ids = torch.randint(1, CONFIG["vocab_size"], (1, args.prompt))

    def decode(steps: int, timer: OpTimer | None) -> float:
        out = model(ids, use_cache=True)
        cache, tok, total = out.past_key_values, out.logits[:, -1:].argmax(-1), 0.0
        for i in range(steps):
            pos = torch.tensor([[args.prompt + i]])
            t0 = time.perf_counter()
            if timer is None:
                out = model(tok, past_key_values=cache, use_cache=True, position_ids=pos)
            else:
                with timer:
                    out = model(tok, past_key_values=cache, use_cache=True, position_ids=pos)
            total += time.perf_counter() - t0
            tok = out.logits[:, -1:].argmax(-1)
        return total

    fused = model.model._tileops.fused
    replay = fused.replay
    decode(4, None)  # kernels built
    replayed = decode(args.steps, None) / args.steps
    graph = replay.recording.graph if replay is not None and replay.recording is not None else None
    fused.replay = None  # the loop: a replayed step makes no op calls for the timers to see
    plain = decode(args.steps, None) / args.steps
    warm = [tiny_decode_step(ids, args.steps, r) for r in (True, False)]
    timer = OpTimer()
    timed = decode(args.steps, timer)
    fused.replay = replay
    print(
        f"\ndecode step without the timers: {replayed * 1e3:.2f} ms replayed from a captured graph, "
        f"{plain * 1e3:.2f} ms through the loop; "
        f"the same step of a tiny model as deep (the op calls and Python alone, caches warm): "
        f"{warm[0] * 1e3:.2f} ms replayed, {warm[1] * 1e3:.2f} ms through the loop"
    )
    report(f"decode step through the loop (prompt {args.prompt}, batch 1)", timer, timed, args.steps)
    if graph is not None:
        report_graph(graph, args.steps)
    if replay is not None:
        never_stop(model)
        split = generate_split(model, ids, 2 * args.steps)
        report_split(
            f"generate's decode step (prompt {args.prompt}, batch 1, greedy)",
            split,
            weight_bytes_per_step(model),
            read_bandwidth_gbs(),
        )
        report_split(
            "the same for the tiny model (the same Python on warm caches)",
            generate_split(tiny_model(), ids % TINY["vocab_size"], 2 * args.steps),
        )
        side = search_side_by_side(model, ids, args.steps + 1)
        floor = weight_bytes_per_step(model) / (read_bandwidth_gbs() * 1e9)
        print(
            f"\ngreedy generate per decode step, alternated (prompt {args.prompt}, batch 1, {args.steps} steps): "
            f"at the read probe's rate now the weights take {floor * 1e3:.2f} ms"
        )
        for name, sec in side.items():
            print(f"  {name:<24} {sec * 1e3:7.2f} ms  {1 / sec:6.1f} tok/s  {100 * floor / sec:5.1f}% of the limit")

    long_ids = torch.randint(1, CONFIG["vocab_size"], (1, args.prefill))
    for _ in range(2):
        model(long_ids, use_cache=True, logits_to_keep=1)
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        model(long_ids, use_cache=True, logits_to_keep=1)
        runs.append(time.perf_counter() - t0)
    timer = OpTimer()
    t0 = time.perf_counter()
    with timer:
        model(long_ids, use_cache=True, logits_to_keep=1)
    timed = time.perf_counter() - t0
    print(f"\nprefill without the timers: median {statistics.median(runs) * 1e3:.1f} ms")
    report(f"prefill (prompt {args.prefill}, batch 1)", timer, timed, 1)
    print(
        f"\nread bandwidth now: {read_bandwidth_gbs():.1f} GB/s (weights read per decode step: "
        f"{weight_bytes_per_step(model) / 1e6:.1f} MB)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
