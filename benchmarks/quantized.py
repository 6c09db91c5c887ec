"""A GGUF file on tileops and on llama.cpp, side by side in one run (issue 41).

    make bench-quantized                                  # builds .venv-llama once (~10 min), then runs this
    .venv-llama/bin/python benchmarks/quantized.py        # SmolLM2-135M-Instruct's Q4_1 file
    .venv-llama/bin/python benchmarks/quantized.py --decode-tokens 16 --repeats 1 --ppl-tokens 128 --prefill-tokens 64
    .venv-llama/bin/python benchmarks/quantized.py --gguf other.gguf --systems llama blocks --json out.json

Systems (``--systems``), all on the same file, the same token ids and the same threads (2):
- ``llama``: llama.cpp through llama-cpp-python, its low-level API (``Llama.eval``), no sampler,
  flash attention on as llama.cpp's own tools choose on a CPU (``--llama-flash-attn off``:
  llama-cpp-python's default; here it decodes a few % slower, and its perplexity of 1,024
  tokens of the text is 0.6 % lower: 19.28 against 19.40 with flash attention);
- ``blocks``: tileops' ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=..., target=...)``,
  the quantized matrices kept in their GGML blocks, activations in bf16;
- ``dequantized``: the same with ``dequantize=True``: transformers' loader, every weight in
  bf16, enabled;
- ``int8`` (not by default): the ``dequantized`` model with ``weights="int8"``: its Linear
  weights quantized once to Q8_0 blocks (the tied head too, into blocks of its own);
- ``eager`` (not by default): transformers' own model of the file in bf16, not enabled; the
  perplexity's reference for a bf16 model.
llama-cpp-python is an optional benchmark dependency (``tileops[bench-llama]``; make
bench-quantized builds it for this CPU); without it the tileops rows run alone.

Per system, greedy at batch 1:
- decode tok/s: after the chat prompt, the seconds per token of ``--decode-tokens`` greedy
  steps, prefill excluded. tileops: hf_generate.py's ``measure`` (generate resumed from the
  prompt's cache for n tokens minus for 1). llama.cpp: the prompt's ``eval``, then n
  single-token ``eval``s, each after the argmax of the last logits, timed alone;
- prefill tok/s: ``--prefill-tokens`` of the text in one forward, only the last token's
  logits (generate of 1 token; llama.cpp's ``eval`` without logits_all);
- perplexity: exp of the mean cross entropy of tokens 2..n of ``--ppl-tokens`` of the text
  given the ones before, from one forward over all of them (the tests' formula;
  llama.cpp: ``logits_all=True``);
- weights in memory: tileops, the model's parameters and buffers (each storage once: the
  tied head shares the embedding's blocks); llama.cpp, ``llama_model_size`` (its tensors'
  bytes, mapped from the file);
- weights read per token: the same less the token embedding, of which a decode step reads
  one row (unless the head is tied to it and reads it whole);
- the read-bandwidth limit of decode: read bandwidth / weights read per token, with the
  bandwidth of native_cpu's read probe run between the rounds (median; a shared machine's
  bandwidth moves from minute to minute), and each decode's share of that limit.
The text is tests/integrations/transformers/_real_model.py's (the GPL-3 text Debian ships),
tokenized by transformers' tokenizer of the file; llama.cpp evaluates the same ids.
Round 0 warms up (kernels built, caches filled) and measures the perplexities and greedy
tokens; then ``--repeats`` rounds run the systems in turn (A B C A B C ...). Figures are
medians with their ranges.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' dequantizing loader's bar, before tqdm is imported

import torch  # noqa: E402
import transformers  # noqa: E402
from hf_generate import measure, never_stop, read_bandwidth_gbs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the text and the model's path come from the tests' helper

from tests.integrations.transformers._real_model import GGUF, TEXT, chat_ids, text_ids  # noqa: E402

QUESTION = "What is the capital of France? Answer in one sentence."
LABELS = {
    "llama": "llama.cpp, the GGUF file",
    "blocks": "tileops, GGUF blocks kept",
    "dequantized": "tileops, dequantized to bf16",
    "int8": "tileops, bf16 quantized to int8 (Q8_0)",
    "eager": "HF eager, dequantized to bf16",
}
LLAMA_HOWTO = (
    "llama-cpp-python is not importable here, so llama.cpp's row is left out. It is an optional benchmark "
    "dependency: `make bench-quantized` builds .venv-llama for this CPU (about 10 minutes) and runs this with it; "
    "elsewhere `CMAKE_ARGS=-DGGML_NATIVE=ON pip install 'tileops[bench-llama]'`."
)
ISA_FLAGS = ("avx2", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8")


def machine() -> str:
    """The CPU's name and the ISA extensions the kernels of either system may pick."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    isa = " ".join(f for f in ISA_FLAGS if f in flags) or "none of " + " ".join(ISA_FLAGS)
    return f"{name}, {os.cpu_count()} CPUs; ISA: {isa}"


class OthersLoad:
    """The share of the CPUs other processes kept busy while a block ran (Linux's
    /proc/stat less this process's own CPU time). On a shared 2-core machine one busy
    neighbour slowed llama.cpp's decode 5-20x (its threads spin at a barrier after every op
    for a thread that is descheduled) and tileops' about 2x: the comparison holds only
    where this stays near 0."""

    def __init__(self) -> None:
        self.shares: list[float] = []

    @staticmethod
    def _busy_seconds() -> float:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle, iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> OthersLoad:
        self._t, self._cpu, self._busy = time.perf_counter(), time.process_time(), self._safe_busy()
        return self

    def __exit__(self, *exc) -> None:
        busy = self._safe_busy()
        if busy is None or self._busy is None:
            return
        wall, mine = time.perf_counter() - self._t, time.process_time() - self._cpu
        self.shares.append(max(0.0, (busy - self._busy - mine) / (wall * (os.cpu_count() or 1))))

    def _safe_busy(self) -> float | None:
        try:
            return self._busy_seconds()
        except (OSError, ValueError, IndexError):
            return None  # not Linux: nothing to say


def unique_bytes(tensors) -> dict[int, int]:
    """Bytes per storage address: a tensor shared (the tied head) or viewed (stacked
    projections' parts) is counted once."""
    return {t.data_ptr(): t.numel() * t.element_size() for t in tensors}


def tileops_weight_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """(resident bytes of the parameters and buffers, bytes a decode step reads): the
    embedding table is read a row a step unless the head reads the same storage."""
    held = unique_bytes([*model.parameters(), *model.buffers()])

    def table(module):
        return None if module is None else getattr(module, "weight_blocks", getattr(module, "weight", None))

    embed, head = table(model.get_input_embeddings()), table(model.get_output_embeddings())
    tied = head is not None and embed is not None and head.data_ptr() == embed.data_ptr()
    per_token = sum(held.values()) - (0 if tied or embed is None else held.get(embed.data_ptr(), 0))
    return sum(held.values()), per_token


def perplexity(logits: torch.Tensor, ids: torch.Tensor) -> float:
    """The tests' formula: logits [n, vocab] of positions 1..n, ids [1, n]."""
    return float(torch.nn.functional.cross_entropy(logits[:-1].float(), ids[0, 1:]).exp())


class TileopsSystem:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = never_stop(model)  # every run decodes all the tokens asked for
        self.resident, self.per_token = tileops_weight_bytes(model)

    @torch.no_grad()
    def decode(self, ids: torch.Tensor, new: int) -> float:
        return measure(self.model, ids, torch.ones_like(ids), new)[1]

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> float:
        # generate of one token: the prompt's forward with the last token's logits only,
        # as measure's prefill
        t0 = time.perf_counter()
        self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False, pad_token_id=0)
        return time.perf_counter() - t0

    @torch.inference_mode()
    def greedy(self, ids: torch.Tensor, new: int) -> list[int]:
        out = self.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False, pad_token_id=0
        )
        return out[0, ids.shape[1] :].tolist()

    @torch.inference_mode()
    def perplexity(self, ids: torch.Tensor) -> float:
        return perplexity(self.model(input_ids=ids, use_cache=False).logits[0], ids)


class LlamaSystem:
    """llama.cpp on the file: one context for decode and prefill (logits of the last token
    only, as generate computes them), and one made for the perplexity (logits of every
    position) and closed after it."""

    def __init__(self, llama_cpp, path: Path, threads: int, n_ctx: int, flash_attn: bool) -> None:
        import numpy as np  # noqa: PLC0415 - llama-cpp-python's own dependency

        self.np, self.lib, self.path, self.threads, self.flash_attn = np, llama_cpp, path, threads, flash_attn
        self.llm = self._open(n_ctx, logits_all=False)
        self.resident = int(llama_cpp.llama_model_size(self.llm.model))
        self.per_token = self.resident - self._untied_embedding_bytes(path)

    def _open(self, n_ctx: int, logits_all: bool):
        return self.lib.Llama(
            model_path=str(self.path),
            n_ctx=n_ctx,
            n_batch=512,  # llama.cpp's default batch: a 512-token prefill is one decode call
            n_threads=self.threads,
            n_threads_batch=self.threads,
            logits_all=logits_all,
            flash_attn=self.flash_attn,
            verbose=False,
        )

    @staticmethod
    def _untied_embedding_bytes(path: Path) -> int:
        """The token embedding's bytes where the file has its own output matrix (then a step
        reads one row of the embedding); 0 where the head is the embedding."""
        import gguf  # noqa: PLC0415

        tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(path).tensors}
        return tensors.get("token_embd.weight", 0) if "output.weight" in tensors else 0

    def _next(self) -> int:
        logits = self.lib.llama_get_logits_ith(self.llm.ctx, -1)
        return int(self.np.ctypeslib.as_array(logits, shape=(self.llm.n_vocab(),)).argmax())

    def _steps(self, ids: torch.Tensor, new: int) -> tuple[list[int], float]:
        self.llm.reset()
        self.llm.eval(ids[0].tolist())
        tokens = [self._next()]
        t0 = time.perf_counter()
        for _ in range(new - 1):
            self.llm.eval(tokens[-1:])
            tokens.append(self._next())
        return tokens, (time.perf_counter() - t0) / max(new - 1, 1)

    def decode(self, ids: torch.Tensor, new: int) -> float:
        # new - 1 steps after the prompt's token, as measure times
        return self._steps(ids, new)[1]

    def prefill(self, ids: torch.Tensor) -> float:
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(ids[0].tolist())
        self._next()
        return time.perf_counter() - t0

    def greedy(self, ids: torch.Tensor, new: int) -> list[int]:
        return self._steps(ids, new)[0]

    def perplexity(self, ids: torch.Tensor) -> float:
        llm = self._open(ids.shape[1], logits_all=True)
        try:
            llm.eval(ids[0].tolist())
            logits = torch.from_numpy(self.np.array(llm.scores[: ids.shape[1]]))
        finally:
            llm.close()
        return perplexity(logits, ids)


def load(name: str, path: Path, args, llama_cpp, n_ctx: int):
    from tileops.integrations.transformers import AutoModelForCausalLM  # noqa: PLC0415

    folder, file = str(path.parent), path.name
    if name == "llama":
        return LlamaSystem(llama_cpp, path, args.threads, n_ctx, args.llama_flash_attn == "on")
    if name == "blocks":
        return TileopsSystem(AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, target=args.target))
    if name == "dequantized":
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=file, target=args.target, dequantize=True, dtype=torch.bfloat16
        )
        return TileopsSystem(model)
    if name == "int8":  # the dequantized bf16 model's Linear weights quantized once: enable(weights="int8")
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=file, target=args.target, dequantize=True, dtype=torch.bfloat16, weights="int8"
        )
        return TileopsSystem(model)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.bfloat16)
    return TileopsSystem(model.eval())


def spread(values: list[float]) -> str:
    """median (min-max), with a decimal below 100."""
    digits = 1 if statistics.median(values) < 100 else 0
    med = f"{statistics.median(values):,.{digits}f}"
    return med if len(values) == 1 else f"{med} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


def agreeing(a: list[int], b: list[int]) -> int:
    """How many greedy tokens agree before the first difference."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, default=GGUF, help=f"the GGUF file (default {GGUF})")
    ap.add_argument(
        "--systems",
        nargs="+",
        choices=list(LABELS),
        default=["llama", "blocks", "dequantized"],
        help="the rows, in this order (default: llama blocks dequantized; int8 and eager add rows)",
    )
    ap.add_argument("--threads", type=int, default=2, help="torch's, native_cpu's and llama.cpp's (default 2)")
    ap.add_argument("--target", default="native_cpu", help="the target tileops' rows run on")
    ap.add_argument("--decode-tokens", type=int, default=128, help="greedy tokens timed per decode run")
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--ppl-tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds after the warm-up")
    ap.add_argument(
        "--llama-flash-attn", choices=["on", "off"], default="on", help="(default on, as llama.cpp's tools on a CPU)"
    )
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON ('-': stdout)")
    args = ap.parse_args()
    if args.decode_tokens < 2:
        ap.error("--decode-tokens must be at least 2 (a decode step is timed between two)")
    if not args.gguf.is_file():
        ap.error(f"no GGUF file at {args.gguf}: `make model` unpacks SmolLM2-135M-Instruct's, or pass --gguf PATH")
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)  # native_cpu sizes its kernels to this when it builds them

    llama_cpp, systems = None, list(args.systems)
    if "llama" in systems:
        try:
            import llama_cpp  # noqa: PLC0415 - optional: tileops[bench-llama]
        except ImportError:
            print(LLAMA_HOWTO + "\n")
            systems.remove("llama")
    if not systems:
        return 1

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.gguf.parent, gguf_file=args.gguf.name)
    prompt = chat_ids(tokenizer, QUESTION)
    prefill_ids, ppl_ids = text_ids(tokenizer, args.prefill_tokens), text_ids(tokenizer, args.ppl_tokens)
    n_ctx = max(prompt.shape[1] + args.decode_tokens + 1, args.prefill_tokens)
    from tileops_native_cpu import builders  # noqa: PLC0415 - the tileops rows need native_cpu anyway

    header = [
        f"machine: {machine()}; native_cpu kernels: {builders.native().isa()}",
        f"torch {torch.__version__}, transformers {transformers.__version__}"
        + (f", llama-cpp-python {llama_cpp.__version__}" if llama_cpp else "")
        + f"; {args.threads} threads; {args.gguf.name} ({args.gguf.stat().st_size / 1e6:.1f} MB)",
        f"decode: {args.decode_tokens} greedy tokens after a {prompt.shape[1]}-token chat prompt; prefill: "
        f"{args.prefill_tokens} tokens; perplexity: {args.ppl_tokens} tokens of {TEXT}; timed rounds: {args.repeats}",
    ]
    if llama_cpp:
        # "CPU : SSE3 = 1 | AVX2 = 1 | ...": what its build compiled in (GGML_NATIVE picks this CPU's)
        parts = llama_cpp.llama_print_system_info().decode().replace("CPU :", "").split("|")
        on = [p.split("=")[0].strip() for p in parts if p.strip().endswith("= 1")]
        header.append(
            f"llama.cpp built with: {' '.join(on) or 'no CPU features reported'}; n_batch 512, f16 KV cache, "
            f"flash attention {args.llama_flash_attn}"
        )
    print("\n".join(header), flush=True)

    loaded = {}
    for name in systems:
        t0 = time.perf_counter()
        loaded[name] = load(name, args.gguf, args, llama_cpp, n_ctx)
        print(f"loaded {LABELS[name]} in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)

    # Round 0: kernels built and caches warm; the perplexities and greedy tokens (no timing)
    ppl, tokens = {}, {}
    for name, system in loaded.items():
        system.decode(prompt, args.decode_tokens)
        system.prefill(prefill_ids)
        tokens[name] = system.greedy(prompt, args.decode_tokens)
        ppl[name] = system.perplexity(ppl_ids)
        print(f"warm-up: {LABELS[name]}, perplexity {ppl[name]:.3f}", file=sys.stderr, flush=True)

    decode = {n: [] for n in loaded}
    prefill = {n: [] for n in loaded}
    others = {n: OthersLoad() for n in loaded}
    probes = []
    for r in range(args.repeats):
        probes.append(read_bandwidth_gbs(3))
        for name, system in loaded.items():  # A B C A B C: drift in the machine's load hits them all alike
            with others[name]:
                decode[name].append(1 / system.decode(prompt, args.decode_tokens))
            with others[name]:
                prefill[name].append(args.prefill_tokens / system.prefill(prefill_ids))
        print(f"round {r + 1} of {args.repeats} done", file=sys.stderr, flush=True)
    bandwidth = statistics.median(probes)

    rows = {}
    for name, system in loaded.items():
        limit = bandwidth * 1e9 / system.per_token
        rows[name] = {
            "decode_tok_s": decode[name],
            "prefill_tok_s": prefill[name],
            "perplexity": ppl[name],
            "resident_weight_bytes": system.resident,
            "weight_bytes_per_token": system.per_token,
            "read_limit_tok_s": limit,
            "share_of_read_limit": statistics.median(decode[name]) / limit,
            "greedy_tokens": tokens[name],
            "others_cpu_share": others[name].shares,
        }
    report(args, rows, bandwidth, probes, tokens)
    if args.json:
        doc = {
            "machine": header,
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "read_bandwidth_gbs": probes,
            "systems": {LABELS[n]: row for n, row in rows.items()},
        }
        text = json.dumps(doc, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 0


def report(args, rows: dict, bandwidth: float, probes: list[float], tokens: dict) -> None:
    print(
        f"\n| {args.gguf.stem} | decode tok/s | % of read limit | prefill {args.prefill_tokens} tok/s "
        f"| weights in memory | weights read / token | perplexity ({args.ppl_tokens:,} tokens) |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        print(
            f"| {LABELS[name]} | {spread(row['decode_tok_s'])} | {100 * row['share_of_read_limit']:.0f} % "
            f"of {row['read_limit_tok_s']:,.0f} | {spread(row['prefill_tok_s'])} "
            f"| {row['resident_weight_bytes'] / 1e6:.1f} MB | {row['weight_bytes_per_token'] / 1e6:.1f} MB "
            f"| {row['perplexity']:.3f} |"
        )
    print(
        f"\nread bandwidth (native_cpu's probe, {args.threads} threads, between rounds): median {bandwidth:.1f} GB/s"
        + (f", {min(probes):.1f}-{max(probes):.1f}" if len(probes) > 1 else "")
        + "; read limit = that / weights read per token"
    )
    if "llama" in rows:
        base = rows["llama"]
        for name, row in rows.items():
            if name == "llama":
                continue
            dec = statistics.median(row["decode_tok_s"]) / statistics.median(base["decode_tok_s"])
            pre = statistics.median(row["prefill_tok_s"]) / statistics.median(base["prefill_tok_s"])
            print(
                f"{LABELS[name]} vs llama.cpp: decode {dec:.2f}x, prefill {pre:.2f}x, perplexity "
                f"{100 * (row['perplexity'] / base['perplexity'] - 1):+.2f} %, greedy tokens: the first "
                f"{agreeing(tokens[name], tokens['llama'])} of {args.decode_tokens} agree"
            )
    shares = [x for row in rows.values() for x in row["others_cpu_share"]]
    if shares:
        worst, median = max(shares), statistics.median(shares)
        noisy = " -- not a quiet machine: llama.cpp's figures suffer most; run it again" if worst > 0.05 else ""
        print(f"other processes' CPU share while timed: median {100 * median:.0f} %, max {100 * worst:.0f} %{noisy}")
    if not math.isfinite(bandwidth) or bandwidth <= 0:
        print("the read probe gave no bandwidth: the limits above mean nothing")


if __name__ == "__main__":
    raise SystemExit(main())
