"""A Llama-style decoder, one token at a time, written twice: with tileops ops and with
plain torch eager. Used by the demo and by benchmarks/decoder_step.py.

Shapes are small enough for a 2-core CPU: hidden 1024, 16 query heads and 4 KV heads of
dim 64, MLP 2816, bfloat16, batch 1, a dense KV cache.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from tileops.ops import (
    AddFwdOp,
    GemmFwdOp,
    GroupedQueryAttentionDecodeWithKVCacheFwdOp,
    RMSNormFwdOp,
    RopeNeoxPositionIdsFwdOp,
    SiluAndMulFwdOp,
)


@dataclasses.dataclass(frozen=True)
class Config:
    hidden: int = 1024
    heads: int = 16
    heads_kv: int = 4
    head_dim: int = 64
    mlp: int = 2816
    layers: int = 2
    max_seq: int = 512
    dtype: torch.dtype = torch.bfloat16


def make_weights(cfg: Config, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)

    def w(*shape: int, scale: float = 0.02) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(cfg.dtype)

    qkv = (cfg.heads + 2 * cfg.heads_kv) * cfg.head_dim
    return [
        {
            "attn_norm": (1 + w(cfg.hidden, scale=0.1)),
            "wqkv": w(qkv, cfg.hidden),  # [out, in]: y = x @ w.T (the NT layout)
            "wo": w(cfg.hidden, cfg.heads * cfg.head_dim),
            "mlp_norm": (1 + w(cfg.hidden, scale=0.1)),
            "wgate_up": w(2 * cfg.mlp, cfg.hidden),
            "wdown": w(cfg.hidden, cfg.mlp),
        }
        for _ in range(cfg.layers)
    ]


class KVCache:
    def __init__(self, cfg: Config) -> None:
        shape = (cfg.layers, 1, cfg.max_seq, cfg.heads_kv, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=cfg.dtype)
        self.v = torch.zeros(shape, dtype=cfg.dtype)


def _split_qkv(cfg: Config, qkv: torch.Tensor):
    q_end = cfg.heads * cfg.head_dim
    kv_end = q_end + cfg.heads_kv * cfg.head_dim
    q = qkv[:, :q_end].reshape(1, cfg.heads, cfg.head_dim)
    k = qkv[:, q_end:kv_end].reshape(1, cfg.heads_kv, cfg.head_dim)
    v = qkv[:, kv_end:].reshape(1, cfg.heads_kv, cfg.head_dim)
    return q, k, v


class TileopsDecoder:
    """Every op of the step is a tileops op; their target is whatever the process chose."""

    def __init__(self, cfg: Config, weights: list[dict[str, torch.Tensor]]) -> None:
        self.cfg, self.weights = cfg, weights
        self.norm = RMSNormFwdOp(normalized_shape=(cfg.hidden,), eps=1e-5)
        self.linear = GemmFwdOp(trans_a=False, trans_b=True)
        self.rope = RopeNeoxPositionIdsFwdOp(max_position=cfg.max_seq, rotary_dim=cfg.head_dim)
        self.attn = GroupedQueryAttentionDecodeWithKVCacheFwdOp(1, cfg.heads, cfg.heads_kv, cfg.max_seq, cfg.head_dim)
        self.add = AddFwdOp()
        self.silu_and_mul = SiluAndMulFwdOp()

    def step(self, x: torch.Tensor, position: int, cache: KVCache) -> torch.Tensor:
        cfg = self.cfg
        pos = torch.tensor([position], dtype=torch.int64)
        for layer, w in enumerate(self.weights):
            h = self.norm(x, w["attn_norm"])
            q, k, v = _split_qkv(cfg, self.linear(h, w["wqkv"]))
            q, k = self.rope(q, pos), self.rope(k, pos)
            cache.k[layer, :, position] = k
            cache.v[layer, :, position] = v
            length = position + 1
            o = self.attn(q, cache.k[layer, :, :length], cache.v[layer, :, :length])
            x = self.add(x, self.linear(o.reshape(1, -1), w["wo"]))
            h = self.norm(x, w["mlp_norm"])
            x = self.add(x, self.linear(self.silu_and_mul(self.linear(h, w["wgate_up"])), w["wdown"]))
        return x


def _rope_eager(x: torch.Tensor, position: int, cfg: Config) -> torch.Tensor:
    half = cfg.head_dim // 2
    freqs = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float32) / half))
    angle = position * freqs
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class EagerDecoder:
    """The same step in plain torch eager."""

    def __init__(self, cfg: Config, weights: list[dict[str, torch.Tensor]]) -> None:
        self.cfg, self.weights = cfg, weights

    def step(self, x: torch.Tensor, position: int, cache: KVCache) -> torch.Tensor:
        cfg = self.cfg
        for layer, w in enumerate(self.weights):
            h = F.rms_norm(x, (cfg.hidden,), w["attn_norm"], 1e-5)
            q, k, v = _split_qkv(cfg, F.linear(h, w["wqkv"]))
            q, k = _rope_eager(q, position, cfg), _rope_eager(k, position, cfg)
            cache.k[layer, :, position] = k
            cache.v[layer, :, position] = v
            length = position + 1
            keys = cache.k[layer, :, :length].transpose(1, 2)  # [1, Hkv, N, D]
            values = cache.v[layer, :, :length].transpose(1, 2)
            o = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, enable_gqa=True)
            x = x + F.linear(o.reshape(1, -1), w["wo"])
            h = F.rms_norm(x, (cfg.hidden,), w["mlp_norm"], 1e-5)
            gate, up = F.linear(h, w["wgate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w["wdown"])
        return x


def generate(decoder, cfg: Config, steps: int, start: int = 0) -> torch.Tensor:
    """Feeds each output back in as the next input: a stand-in for sampling."""
    cache = KVCache(cfg)
    x = torch.ones(1, cfg.hidden, dtype=cfg.dtype) * 0.1
    outputs = []
    for position in range(start, start + steps):
        x = decoder.step(x, position, cache)
        x = x / x.float().norm().clamp_min(1e-3).to(x.dtype)  # keep values in range
        outputs.append(x)
    return torch.cat(outputs)
