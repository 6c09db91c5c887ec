"""Reduction ops (manifest: reduction.yaml)."""
