"""tileops as a vLLM plugin (docs/vllm.md): vLLM's scheduler, server and parallelism, with
the layers' math on tileops ops, on the target the protocol chooses.

vLLM calls ``register`` in each of its processes (front end, engine core, every worker)
through the entry point ``tileops`` in group ``vllm.general_plugins``, before it builds a
model. ``register`` puts tileops' layers in place of vLLM's:

- ``RMSNorm`` (and its fused residual add): ``RMSNormFwdOp``, ``FusedAddRMSNormFwdOp``;
- ``SiluAndMul`` and ``GeluAndMul``: the gated activation ops;
- ``RotaryEmbedding`` (NeoX and GPT-J pairs), ``Llama3RotaryEmbedding`` and the linear,
  dynamic-NTK and YaRN scalings: the position-id RoPE ops;
- unquantized linear layers and the LM head: ``GemmFwdOp``;
- unquantized MoE experts (``FusedMoE``, routed by vLLM's router): ``FusedMoeFwdOp``;
- attention: the backend vLLM's CPU platform picks (``CPU_ATTN``) is replaced by one that
  runs ``GroupedQueryAttentionPrefillPagedWithKVCacheFwdOp`` over vLLM's paged KV cache.

A layer instance tileops cannot serve exactly (a dtype or a variant its ops do not take)
keeps vLLM's own kernel; once the engine has built its model, one log line beginning
``tileops:`` names the target, what runs on it and what stayed on vLLM's kernels, and why.

The target: ``TILEOPS_TARGET`` (a registered target's name), else the process default
(``tileops.backend.set_default_target``), else device detection. Nothing falls back
across targets: a chosen target without a kernel fails the call that needs one.

Importing this module imports vLLM; ``import tileops`` never does.
"""

from __future__ import annotations

import os
import threading

__all__ = ["register"]

_lock = threading.Lock()
_registered = False


def register() -> None:
    """vLLM's general-plugin hook: register tileops' layers and attention backend with vLLM
    (once per process; later calls do nothing)."""
    global _registered
    with _lock:
        if _registered:
            return
        from . import attention, layers, linear, moe  # noqa: PLC0415 (imports vLLM)
        from .report import choose_target  # noqa: PLC0415

        choose_target(os.environ.get("TILEOPS_TARGET") or None)
        layers.register()
        linear.register()
        moe.register()
        attention.register()
        _registered = True
