"""Quantized weight formats in PyTorch, one module per family of formats.

``tileops.quant.ggml_blocks``: the GGML block formats GGUF files store weights in (F32,
F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K): their sizes, exact dequantization,
llama.cpp's reference quantizers for the 32-weight types, and valid random blocks for
tests (docs/quantized.md, "GGML block formats").

``import tileops`` does not import this package, and the package imports none of its
modules: import the one you need (torch only).
"""
