"""The Llama's building blocks over tensor parallelism, from :mod:`tessera.nn`'s layers:
:class:`RMSNorm`, :func:`rope_tables` / :func:`apply_rotary` (rotate-half RoPE, Llama 3.1 frequency
scaling), :class:`ParallelGQAttention` (grouped-query attention, query and key/value heads split
over the tp group), :class:`ParallelSwiGLU` (w2(silu(w1 x) * w3 x), split over tp). Activations are
``[tokens, batch, d]`` as in the C++ model (src/models/llama.h). Forward and backward are collective
over the tp group.
"""
import math

import torch
import torch.nn.functional as F

from .. import _C
from ..parallel import _group_of
from . import layers as tnn

class RMSNorm(torch.nn.Module):
    """``x / sqrt(mean(x²) + eps) * weight`` in float32, returned in x's dtype."""

    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rope_inv_freq(head_dim, theta=10000.0, scaling=None):
    """inv_freq [hd/2] (float64): theta^(-2i/hd), with Llama 3.1's scaling (a dict of factor,
    low, high, original) when given."""
    out = []
    for i in range(head_dim // 2):
        f = math.pow(theta, -2.0 * i / head_dim)
        if scaling:
            low, high = scaling["original"] / scaling["low"], scaling["original"] / scaling["high"]
            wavelen = 2 * math.pi / f
            if wavelen > low:
                f /= scaling["factor"]
            elif wavelen >= high:
                smooth = (scaling["original"] / wavelen - scaling["low"]) / (scaling["high"] - scaling["low"])
                f = (1 - smooth) * f / scaling["factor"] + smooth * f
        out.append(f)
    return torch.tensor(out, dtype=torch.float64)


_rope_cache = {}


def rope_tables(seq_len, head_dim, theta=10000.0, scaling=None, device=None):
    """(cos, sin), each [seq_len, head_dim] float32 (each half repeated), cached per arguments
    (shared, never modified: not module buffers, which DDP would overwrite in place from rank 0
    before each forward while an earlier micro-batch's graph still holds them)."""
    key = (seq_len, head_dim, theta, tuple(sorted((scaling or {}).items())), str(torch.device(device or "cpu")))
    if key not in _rope_cache:
        pos = torch.arange(seq_len, dtype=torch.float64).unsqueeze(1)
        angles = pos * rope_inv_freq(head_dim, theta, scaling).unsqueeze(0)
        angles = torch.cat([angles, angles], 1)
        _rope_cache[key] = (angles.cos().float().to(device), angles.sin().float().to(device))
    return _rope_cache[key]


def apply_rotary(x, cos, sin):
    """x [T, B, heads, hd] rotated by its position along dim 0 (rotate-half), in x's dtype."""
    t, hd = x.shape[0], x.shape[-1]
    cos, sin = cos[:t].view(t, 1, 1, hd), sin[:t].view(t, 1, 1, hd)
    xf = x.float()
    h1, h2 = xf.chunk(2, -1)
    return (xf * cos + torch.cat([-h2, h1], -1) * sin).to(x.dtype)


def causal_attention(q, k, v):
    """softmax(q kᵀ / sqrt(hd) + causal mask) v over [B, heads, T, hd]: torch's fused kernel where
    it has one (2.x), else the explicit masked softmax (1.13), as src/common/attention.h."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[-2]
    att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=q.device), 1)
    return torch.matmul(torch.softmax(att.masked_fill(mask, float("-inf")), -1), v)


def _heads_over_tp(heads, kv_heads, tp, what):
    if heads % tp or kv_heads % tp:
        raise _C.Error(f"{what}: heads = {heads} and kv heads = {kv_heads} must both be divisible by the "
                       f"tensor-parallel size {tp} (kv heads replicated over tp: train_gpt only)")


class ParallelGQAttention(torch.nn.Module):
    """Causal grouped-query attention with rotary positions, heads split over ``group``: rank r
    keeps query heads [r·H/tp, (r+1)·H/tp) and key/value heads [r·KV/tp, (r+1)·KV/tp) (wq, wk, wv
    column-parallel), wo row-parallel. Input and output ``[T, B, d]`` (replicated over tp)."""

    def __init__(self, d, heads, kv_heads, group, *, seq_len, rope_theta=10000.0, rope_scaling=None, name="attn"):
        super().__init__()
        tp = _group_of(group, "tp")
        _heads_over_tp(heads, kv_heads, tp.size, name)
        hd = d // heads
        self.hd, self.lq, self.lkv = hd, heads // tp.size, kv_heads // tp.size
        kw = dict(bias=False)
        self.wq = tnn.ColumnParallelLinear(d, heads * hd, tp, name=f"{name}.wq", **kw)
        self.wk = tnn.ColumnParallelLinear(d, kv_heads * hd, tp, name=f"{name}.wk", **kw)
        self.wv = tnn.ColumnParallelLinear(d, kv_heads * hd, tp, name=f"{name}.wv", **kw)
        self.wo = tnn.RowParallelLinear(heads * hd, d, tp, name=f"{name}.wo", **kw)
        self.rope = (seq_len, hd, rope_theta, rope_scaling)

    def forward(self, x):
        s, b = x.shape[0], x.shape[1]
        cos, sin = rope_tables(*self.rope, device=x.device)
        q = apply_rotary(self.wq(x).view(s, b, self.lq, self.hd), cos, sin)
        k = apply_rotary(self.wk(x).view(s, b, self.lkv, self.hd), cos, sin)
        v = self.wv(x).view(s, b, self.lkv, self.hd)
        rep = self.lq // self.lkv

        def bhsd(t):  # [T, B, h, hd] -> [B, h * rep, T, hd]
            y = t.permute(1, 2, 0, 3)
            if rep == 1:
                return y
            return y.unsqueeze(2).expand(b, self.lkv, rep, s, self.hd).reshape(b, self.lkv * rep, s, self.hd)

        a = causal_attention(q.permute(1, 2, 0, 3), bhsd(k), bhsd(v))
        return self.wo(a.permute(2, 0, 1, 3).reshape(s, b, self.lq * self.hd))


class ParallelSwiGLU(torch.nn.Module):
    """``w2(silu(w1 x) * w3 x)``: w1, w3 column-parallel (rank r keeps FFN rows [r·F/tp, (r+1)·F/tp)),
    w2 row-parallel. Input and output replicated over ``group``."""

    def __init__(self, d, ffn, group, *, name="mlp"):
        super().__init__()
        tp = _group_of(group, "tp")
        self.w1 = tnn.ColumnParallelLinear(d, ffn, tp, bias=False, name=f"{name}.w1")
        self.w3 = tnn.ColumnParallelLinear(d, ffn, tp, bias=False, name=f"{name}.w3")
        self.w2 = tnn.RowParallelLinear(ffn, d, tp, bias=False, name=f"{name}.w2")

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))
