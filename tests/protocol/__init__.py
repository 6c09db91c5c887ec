"""Tests of the backend protocol: requirements A, B and C (API, discovery, target choice)."""
