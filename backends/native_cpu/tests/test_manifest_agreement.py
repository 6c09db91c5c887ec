"""Every builder accepts exactly what its op's manifest accepts.

Judged on each op's own workloads (scaled to the CPU) and on variants of them: every dtype,
and each input one dim shorter or longer, or with a dim changed. For each case the
manifest's verdict (``OpEntry.check_inputs``) and the builder's must agree: where the
manifest accepts, the builder gets the resolved params (as from the op layer) and must
build; where it refuses, the builder gets the params as given and must refuse, on purpose
(an error of its own, naming native_cpu). Needs tileops; skipped without it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tileops_native_cpu import builders as b

manifest = pytest.importorskip("tileops.manifest", reason="tileops (the manifests) is not importable here")


def shape_variants(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    out = [(2, *shape), (*shape, 2)]
    if shape:
        out += [
            shape[1:],
            shape[:-1],
            (*shape[:-1], shape[-1] + 1),
            (*shape[:-1], 2 * shape[-1]),
            (*shape[:-1], 0),
            (1, *shape[1:]),
            (shape[0] + 1, *shape[1:]),
        ]
    return out


def cases(entry: Any) -> list[tuple[str, dict, dict, torch.dtype]]:
    out = []
    for name, shapes, params, dtype in entry.workload_cases("cpu"):
        out += [(name, shapes, params, other) for other in b.ALL_DTYPES]
        for input_name, shape in shapes.items():
            if shape is not None:
                out += [(name, {**shapes, input_name: v}, params, dtype) for v in shape_variants(tuple(shape))]
    return out


def verdict(call: Any, *args: Any, **kwargs: Any) -> tuple[bool, BaseException | None]:
    try:
        call(*args, **kwargs)
        return True, None
    except (TypeError, ValueError, IndexError) as e:
        return False, e


@pytest.mark.parametrize("op", sorted(b.BUILDERS))
def test_the_builder_accepts_exactly_the_workload_variants_its_manifest_accepts(op):
    entry, build = manifest.entry(op), b.BUILDERS[op]
    disagreements = []
    for name, shapes, params, dtype in cases(entry):
        specs = entry.case_specs(shapes, dtype, device="cpu")
        accepted, why = verdict(entry.check_inputs, specs, params)
        if accepted:
            built, error = verdict(build, *specs, **entry.call_params(specs, params))
        else:
            try:  # defaults the manifest resolves (eps=None) as it would; the rest as given
                resolved = entry.call_params(specs, params)
            except Exception:  # noqa: BLE001 (resolution may fail on inputs the manifest refuses)
                resolved = {}
            given = {k: resolved.get(k, v) if v is None else v for k, v in params.items()}
            built, error = verdict(build, *specs, **given)
            if not built and not str(error).startswith(f"{b.TARGET} "):
                built = None  # it failed, but not by refusing
        if built is not accepted:
            shown = {k: v for k, v in shapes.items() if v is not None}
            disagreements.append(
                f"{name} {shown} {dtype}: manifest {'accepts' if accepted else 'refuses'} "
                f"({why}), builder {'builds' if built else 'fails'} ({error})"
            )
    assert not disagreements, f"{len(disagreements)} disagreements, e.g.\n" + "\n".join(disagreements[:10])
