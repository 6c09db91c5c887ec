"""Normalization ops (manifest: normalization.yaml)."""

from .. import _catalog

# The op classes and generated modules the manifests put here, made on first use.
__getattr__, __dir__ = _catalog.lazy_members(__name__)
