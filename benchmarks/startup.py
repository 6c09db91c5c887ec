"""Start-up costs, each measured in fresh interpreters and reported as the median and range:

* ``import tileops.ops`` beyond ``import torch`` (target: <= 30 ms): ``import tileops``
  (target: < 50 ms, requirement A9's "cheap") plus ``import tileops.ops`` (the manifest
  index; no manifest is parsed, no class made, no custom op registered);
* the first op class, ``from tileops.ops import RMSNormFwdOp`` (its manifest file parsed,
  its class made, its custom op registered);
* the first op construction, which runs discovery of the installed backends
  (target: <= 30 ms);
* every other op class (``tileops.ops.ALL_OPS``), for tools that want them all.

A full garbage collection (generation 2) costs tens of milliseconds once torch is
imported, and whichever step crosses the collector's threshold pays for it; the column
``gen2`` counts those that fell inside each step.

Run it with the interpreter of the environment whose backends you want discovered:

    .venv-demo/bin/python benchmarks/startup.py [--runs 7] [--pycache-prefix DIR]

Children inherit this environment; where ``PYTHONDONTWRITEBYTECODE`` is set, every child
compiles tileops' modules from source, which an installed package does not do.
``--pycache-prefix DIR`` measures with bytecode caches instead (kept under DIR, written by
one warm-up run), as an installed package is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PROBE = r"""
import gc, json, time
full = [0]
def count(phase, info):
    if phase == "start" and info["generation"] == 2:
        full[0] += 1
gc.callbacks.append(count)
marks = []
def mark(step):
    marks.append((step, time.perf_counter(), full[0]))
mark("start")
import torch
mark("torch")
import tileops
mark("tileops")
import tileops.ops
mark("tileops.ops")
from tileops.ops import RMSNormFwdOp
mark("first op class")
op = RMSNormFwdOp(normalized_shape=(64,))
mark("first op (with discovery)")
every = tileops.ops.ALL_OPS
mark("ALL_OPS")
from tileops.backend import registered_targets
out = {
    step: [t - before, n - n_before]
    for (_, before, n_before), (step, t, n) in zip(marks, marks[1:])
}
out["import tileops.ops beyond torch"] = [
    marks[3][1] - marks[1][1], marks[3][2] - marks[1][2]
]
out["targets"] = registered_targets()
out["ops"] = len(every)
print(json.dumps(out))
"""

STEPS = (
    "torch",
    "tileops",
    "tileops.ops",
    "import tileops.ops beyond torch",
    "first op class",
    "first op (with discovery)",
    "ALL_OPS",
)
TARGETS = {
    "tileops": 0.050,
    "import tileops.ops beyond torch": 0.030,
    "first op (with discovery)": 0.030,
}


def _child_env(pycache_prefix: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if pycache_prefix is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = os.path.abspath(pycache_prefix)
    return env


def _probe(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument(
        "--pycache-prefix",
        metavar="DIR",
        help="measure with bytecode caches kept under DIR (one warm-up run writes them)",
    )
    args = parser.parse_args()
    env = _child_env(args.pycache_prefix)
    if args.pycache_prefix is not None:
        _probe(env)  # writes the caches; not measured
    samples = [_probe(env) for _ in range(args.runs)]
    if env.get("PYTHONDONTWRITEBYTECODE"):
        bytecode = "off (PYTHONDONTWRITEBYTECODE: modules without a cache compile every time)"
    elif args.pycache_prefix is not None:
        bytecode = f"cached under {args.pycache_prefix}"
    else:
        bytecode = "on"
    print(f"interpreter: {sys.executable}; backends discovered: {samples[0]['targets']}")
    print(f"bytecode caches: {bytecode}; {args.runs} fresh processes; ops: {samples[0]['ops']}")
    print(f"{'step':<34}{'median':>9}{'min':>9}{'max':>9}  gen2")
    for key in STEPS:
        times = [s[key][0] * 1e3 for s in samples]
        collections = sum(s[key][1] for s in samples)
        ms = statistics.median(times)
        goal = TARGETS.get(key)
        verdict = (
            "" if goal is None else f"  (target <= {goal * 1e3:.0f} ms: {'met' if ms <= goal * 1e3 else 'MISSED'})"
        )
        print(f"{key:<34}{ms:6.1f} ms{min(times):6.1f} ms{max(times):6.1f} ms  {collections}/{args.runs}{verdict}")


if __name__ == "__main__":
    main()
