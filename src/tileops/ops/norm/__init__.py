"""Normalization ops (manifest: normalization.yaml)."""
