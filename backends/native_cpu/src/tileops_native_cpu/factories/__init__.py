"""The builder factories, one module per kernel family as csrc/bind/ is: ``factory(...)(op_name)``
is that op's ``build_kernel``. A builder checks its inputs against the op's manifest (refusing
with what was expected and what arrived), fixes the compile-time values and returns the kernel
object of its specialisation. The kinds (``"rms"``, ``"sum"``, ``"silu"``, ...) are member names
of the extension's enums (``_C.RowNorm``, ``_C.ReduceOp``, ``_C.Activation``, ...).

    norm         RMSNorm, LayerNorm, fused add + either, GroupNorm
    softmax      softmax, log-softmax
    reduction    sum, mean, amax
    gemm         GEMM, batched GEMM
    elementwise  add, mul, activations, gated activations, clamp
    rope         RoPE at positions 0..S-1 or at position ids, plain or scaled
    attention    every grouped-query attention op
    moe          the router and the MoE block
    quant        GEMMs over GGUF blocks and 4-bit groups, the GGUF embedding
    common       the Builder and Factory types
"""
