"""Elementwise ops (manifests: elementwise_*.yaml)."""
