"""GEMM-family ops (manifests: gemm.yaml, bmm.yaml)."""

from .gemm import GemmFwdOp

#: The name upstream's earlier example backend imports; the same class, so the op keeps
#: its manifest name (a builder registered as "GemmOp" is still never called).
GemmOp = GemmFwdOp
