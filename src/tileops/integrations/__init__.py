"""Integrations of tileops with other libraries. Each submodule imports its library;
this package imports none (``import tileops`` never reaches it).

- ``tileops.integrations.transformers``: Hugging Face models on tileops ops
  (docs/transformers.md).
"""
