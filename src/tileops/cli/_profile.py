"""Machine profiles: the bandwidth and compute roofs ``bench`` holds kernels to.

A profile is a small YAML file: ``bandwidth_gbps`` (read, copy), ``peak_gflops``
(fp32_fma, bf16_dot, optionally fp16_dot; ``null`` where unavailable) and ``calibration``
(the share of each peak counted as the roof; 1.0 for measured profiles, whose figures are
already what the machine sustains). ``tileops profile-machine`` measures one for this CPU;
tileops ships datasheet profiles of some GPUs (``src/tileops/profiles``).
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

from ._common import UsageError

KNOWN_DIR = Path(__file__).resolve().parents[1] / "profiles"


def default_path() -> Path:
    """Where profile-machine writes and bench looks: ``$TILEOPS_MACHINE_PROFILE``, else
    ``~/.cache/tileops/machine.yaml``."""
    env = os.environ.get("TILEOPS_MACHINE_PROFILE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "tileops" / "machine.yaml"


@dataclasses.dataclass
class Profile:
    name: str
    kind: str  # "cpu" or "gpu"
    source: str  # "measured" or "datasheet"
    bandwidth_gbps: dict[str, float | None]
    peak_gflops: dict[str, float | None]
    calibration: dict[str, float] = dataclasses.field(default_factory=dict)
    unavailable: dict[str, str] = dataclasses.field(default_factory=dict)
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    path: str | None = None

    @property
    def bandwidth(self) -> float | None:
        """The bandwidth roof in GB/s: the copy figure (reads and writes, as ops do),
        else the read figure, times its calibration."""
        value = self.bandwidth_gbps.get("copy") or self.bandwidth_gbps.get("read")
        return None if value is None else value * self.calibration.get("bandwidth", 1.0)

    def compute(self, dtype_name: str) -> tuple[str, float | None]:
        """The compute roof (name, GFLOP/s) for an op whose first input is ``dtype_name``."""
        wanted = {"bfloat16": "bf16_dot", "float16": "fp16_dot"}.get(dtype_name, "fp32_fma")
        for key in (wanted, "fp32_fma"):
            value = self.peak_gflops.get(key)
            if value:
                return key, value * self.calibration.get("compute", 1.0)
        return wanted, None

    def to_yaml(self) -> str:
        import yaml

        data = {
            "name": self.name,
            "kind": self.kind,
            "source": self.source,
            "bandwidth_gbps": self.bandwidth_gbps,
            "peak_gflops": self.peak_gflops,
            "calibration": self.calibration or {"bandwidth": 1.0, "compute": 1.0},
        }
        if self.unavailable:
            data["unavailable"] = self.unavailable
        if self.details:
            data["details"] = self.details
        head = "# tileops machine profile (tileops profile-machine); read by tileops bench --profile\n"
        return head + yaml.safe_dump(data, sort_keys=False)


def load(where: str | os.PathLike[str]) -> Profile:
    """A profile from a YAML file, or a shipped one by name (``h200``, ``h20``)."""
    import yaml

    path = Path(where)
    if not path.exists():
        shipped = KNOWN_DIR / f"{str(where).lower()}.yaml"
        if shipped.exists():
            path = shipped
        else:
            raise UsageError(
                f"--profile: expected a profile YAML file or a shipped profile name "
                f"({', '.join(known_names())}), got {str(where)!r}, which is neither"
            )
    try:
        data = yaml.safe_load(path.read_text())
        return Profile(
            name=str(data["name"]),
            kind=str(data.get("kind", "cpu")),
            source=str(data.get("source", "measured")),
            bandwidth_gbps=dict(data["bandwidth_gbps"]),
            peak_gflops=dict(data["peak_gflops"]),
            calibration=dict(data.get("calibration") or {}),
            unavailable=dict(data.get("unavailable") or {}),
            details={**(data.get("details") or {}), **({"match": data["match"]} if "match" in data else {})},
            path=str(path),
        )
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as error:
        raise UsageError(
            f"{path} is not a machine profile: expected YAML with name, bandwidth_gbps and "
            f"peak_gflops (as tileops profile-machine writes), got {type(error).__name__}: {error}"
        ) from None


def known_names() -> list[str]:
    return sorted(p.stem for p in KNOWN_DIR.glob("*.yaml"))


def for_device(device: str) -> Profile | None:
    """The profile bench uses when none is given: the shipped one whose ``match`` is in an
    accelerator's name, or the measured one at ``default_path()`` for the CPU."""
    if device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name(torch.device(device))
        # longest match first: "H200" before "H20"
        shipped = [load(n) for n in known_names()]
        for known in sorted(shipped, key=lambda p: -len(p.details.get("match", ""))):
            pattern = known.details.get("match")
            if pattern and re.search(rf"\b{re.escape(pattern)}\b", name):
                return known
        return None
    if device.startswith("cpu") and default_path().exists():
        return load(default_path())
    return None
