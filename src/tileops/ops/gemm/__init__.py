"""GEMM-family ops (manifests: gemm.yaml, bmm.yaml)."""

from .. import _catalog

# The op classes and generated modules the manifests put here, made on first use.
# GemmOp: the name upstream's earlier example backend imports; the same class, so the op
# keeps its manifest name (a builder registered as "GemmOp" is still never called).
__getattr__, __dir__ = _catalog.lazy_members(__name__, aliases={"GemmOp": "GemmFwdOp"})
