"""Start-up costs, each measured in fresh interpreters and reported as the median:

* ``import tileops`` beyond ``import torch`` (target: < 50 ms, requirement A9's "cheap");
* ``import tileops.ops`` (manifests, op classes, custom-op registration);
* the first op construction, which runs discovery of the installed backends
  (target: <= 30 ms).

Run it with the interpreter of the environment whose backends you want discovered:

    .venv-demo/bin/python benchmarks/startup.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

PROBE = r"""
import json, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import tileops
t2 = time.perf_counter()
import tileops.ops
t3 = time.perf_counter()
op = tileops.ops.RMSNormFwdOp(normalized_shape=(64,))
t4 = time.perf_counter()
from tileops.backend import registered_targets
print(json.dumps({"torch": t1 - t0, "tileops": t2 - t1, "tileops.ops": t3 - t2,
                  "first op (with discovery)": t4 - t3, "targets": registered_targets()}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    samples = []
    for _ in range(args.runs):
        out = subprocess.run(
            [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
        )
        samples.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"interpreter: {sys.executable}; backends discovered: {samples[0]['targets']}")
    targets = {"tileops": 0.050, "first op (with discovery)": 0.030}
    for key in ("torch", "tileops", "tileops.ops", "first op (with discovery)"):
        ms = statistics.median(s[key] for s in samples) * 1e3
        goal = targets.get(key)
        verdict = (
            ""
            if goal is None
            else f"  (target <= {goal * 1e3:.0f} ms: {'met' if ms <= goal * 1e3 else 'MISSED'})"
        )
        print(f"{key:<28}{ms:8.1f} ms{verdict}")


if __name__ == "__main__":
    main()
