"""A builder that is registered and never called: the name it is registered under,
``op="GemmOp"``, is not a manifest key (the manifest says ``GemmFwdOp``).

It is here to show what a misspelt op name does — nothing at all, silently — so that
the first test for every new builder checks the builder is actually reached
(``registered_targets("GemmFwdOp")`` lists the target; a call settles on it and
memoizes the kernel). The registration itself is in ``__init__``, with all the others.
"""

from __future__ import annotations

from tileops.backend import TensorSpec


def build_gemm_pending(a: TensorSpec, b: TensorSpec, *, trans_a: bool, trans_b: bool):
    raise AssertionError(
        "tileops_cpu.pending.build_gemm_pending was called: it is registered for 'GemmOp', "
        "a name no manifest declares, so no op should ever reach it"
    )
