"""The conformance harness over native_cpu: every op this backend registers, on its
manifest's workloads (scaled to the CPU) and edge cases, through the op layer with
``target="native_cpu"``, against the op's reference. A new op in the builder table is
checked here with nothing else to write. Needs tileops; skipped without it."""

from __future__ import annotations

import os

import pytest

harness = pytest.importorskip("tileops.testing.harness", reason="tileops is not importable here")

from tileops_native_cpu.builders import BUILDERS, TARGET  # noqa: E402

# Under the sanitizers (tools/sanitize.sh sets ASAN_OPTIONS) every workload at the "small"
# scale: the same ops, parameters, dtypes and edge cases (the strided one at full CPU size,
# so a large call still crosses every tile and thread), at a third of the time, which is a
# minute of CI with ASan.
SCALE = "small" if "ASAN_OPTIONS" in os.environ else "cpu"
CASES = harness.cases(None, ops=sorted(BUILDERS), scale=SCALE)


def test_every_op_in_the_table_has_cases():
    assert {case.op for case in CASES} == set(BUILDERS)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_native_cpu_matches_the_reference(case):
    harness.check(harness.Case(**{**case.__dict__, "target": TARGET}))
