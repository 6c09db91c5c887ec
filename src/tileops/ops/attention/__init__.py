"""Attention ops (manifest: attention.yaml)."""
