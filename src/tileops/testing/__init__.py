"""Testing helpers for tileops and its backends: references, the numeric harness, and
a pytest plugin (markers)."""
