"""An independent Llama in plain PyTorch (no tessera code): the reference of the golden test
(tests/models/llama_golden.py) and PyTorch's side of the Llama benchmark (bench/llama).

Architecture (Llama 2/3): token embedding; per layer h = x + wo(attn(rmsnorm(x))),
y = h + w2(silu(w1 a) * w3 a) with a = rmsnorm(h); final rmsnorm; head (the embedding table when
tied). Attention: causal, 1/sqrt(head_dim) scale, grouped-query (query head i uses key/value head
i // (heads / kv_heads)), rotary positions in the rotate-half layout (dimensions i and
i + head_dim/2 rotate together by position * inv_freq[i], inv_freq[i] = theta^(-2i/head_dim),
Llama 3.1's frequency scaling optional). RMSNorm in float32. Parameter names follow tessera's
unsharded names: emb.weight, blocks.{i}.attn_norm.weight, blocks.{i}.wq/wk/wv/wo.weight,
blocks.{i}.mlp_norm.weight, blocks.{i}.w1/w2/w3.weight, norm.weight, head.weight.
"""
import math

import torch
import torch.nn.functional as F


class Config:
    def __init__(self, d, layers, heads, kv_heads, ffn, vocab, seq_len, tied=True, theta=10000.0,
                 scaling=None, eps=1e-5):
        self.d, self.layers, self.heads, self.kv_heads, self.ffn = d, layers, heads, kv_heads, ffn
        self.vocab, self.seq_len, self.tied, self.theta, self.eps = vocab, seq_len, tied, theta, eps
        self.scaling = scaling  # None or dict(factor, low, high, original)


def inv_freq(cfg):
    hd = cfg.d // cfg.heads
    freqs = [cfg.theta ** (-2.0 * i / hd) for i in range(hd // 2)]
    s = cfg.scaling
    if s:
        low_wavelen, high_wavelen = s["original"] / s["low"], s["original"] / s["high"]
        out = []
        for f in freqs:
            wavelen = 2 * math.pi / f
            if wavelen > low_wavelen:
                f = f / s["factor"]
            elif wavelen >= high_wavelen:
                smooth = (s["original"] / wavelen - s["low"]) / (s["high"] - s["low"])
                f = (1 - smooth) * f / s["factor"] + smooth * f
            out.append(f)
        freqs = out
    return torch.tensor(freqs, dtype=torch.float64)


class RMSNorm(torch.nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rotate(x, cos, sin):
    """x [B, heads, T, hd]; cos/sin [T, hd]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class Block(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        hd = cfg.d // cfg.heads
        self.cfg, self.hd = cfg, hd
        self.attn_norm = RMSNorm(cfg.d, cfg.eps)
        self.wq = torch.nn.Linear(cfg.d, cfg.heads * hd, bias=False)
        self.wk = torch.nn.Linear(cfg.d, cfg.kv_heads * hd, bias=False)
        self.wv = torch.nn.Linear(cfg.d, cfg.kv_heads * hd, bias=False)
        self.wo = torch.nn.Linear(cfg.heads * hd, cfg.d, bias=False)
        self.mlp_norm = RMSNorm(cfg.d, cfg.eps)
        self.w1 = torch.nn.Linear(cfg.d, cfg.ffn, bias=False)
        self.w3 = torch.nn.Linear(cfg.d, cfg.ffn, bias=False)
        self.w2 = torch.nn.Linear(cfg.ffn, cfg.d, bias=False)
        # Recompute attention's core (softmax(q kᵀ) v) in backward instead of keeping it: train_gpt's
        # `--recompute selective`, for benchmarks that match it (bench/llama/torch_llama_parallel.py).
        self.recompute_core = False

    def forward(self, x, cos, sin):
        cfg, hd = self.cfg, self.hd
        b, t, _ = x.shape
        a = self.attn_norm(x)
        q = self.wq(a).view(b, t, cfg.heads, hd).transpose(1, 2)
        k = self.wk(a).view(b, t, cfg.kv_heads, hd).transpose(1, 2)
        v = self.wv(a).view(b, t, cfg.kv_heads, hd).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        rep = cfg.heads // cfg.kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        if hasattr(F, "scaled_dot_product_attention") and self.recompute_core:
            from torch.utils.checkpoint import checkpoint
            o = checkpoint(F.scaled_dot_product_attention, q, k, v, None, 0.0, True, use_reentrant=False)
        elif hasattr(F, "scaled_dot_product_attention"):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1)
            o = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
        h = x + self.wo(o.transpose(1, 2).reshape(b, t, cfg.heads * hd))
        m = self.mlp_norm(h)
        return h + self.w2(F.silu(self.w1(m)) * self.w3(m))


class Llama(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.emb = torch.nn.Embedding(cfg.vocab, cfg.d)
        self.blocks = torch.nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.d, cfg.eps)
        self.head = None if cfg.tied else torch.nn.Linear(cfg.d, cfg.vocab, bias=False)
        angles = torch.arange(cfg.seq_len, dtype=torch.float64)[:, None] * inv_freq(cfg)[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, tokens):
        """tokens [B, T] -> logits [B, T, V]."""
        t = tokens.shape[1]
        x = self.emb(tokens)
        cos, sin = self.cos[:t], self.sin[:t]
        for blk in self.blocks:
            x = blk(x, cos, sin)
        h = self.norm(x)
        return F.linear(h, self.emb.weight if self.head is None else self.head.weight)

    def load_tessera(self, tensors):
        """Loads tensors named as tessera names them (a dict name -> tensor); every parameter
        must be given, and nothing else."""
        own = dict(self.named_parameters())
        missing, extra = set(own) - set(tensors), set(tensors) - set(own)
        if missing or extra:
            raise KeyError(f"tessera names not matching: missing {sorted(missing)}, unexpected {sorted(extra)}")
        with torch.no_grad():
            for name, p in own.items():
                p.copy_(tensors[name])


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def seeded_normal(shape, std, seed):
    """tessera's nn::seededNormal (src/nn/init.h), written here from its contract: [rows, cols] of
    N(0, std^2) in blocks of max(1, 2^20 // cols) rows, block b from a CPU generator seeded
    splitmix64(splitmix64(seed) + b) (64-bit wrap-around)."""
    mask = (1 << 64) - 1

    def mix(x):
        x = (x + 0x9E3779B97F4A7C15) & mask
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        return x ^ (x >> 31)

    rows, cols = shape
    step = max(1, (1 << 20) // max(cols, 1))
    out = torch.empty(rows, cols)
    for b, r0 in enumerate(range(0, rows, step)):
        g = torch.Generator().manual_seed(mix((mix(seed & mask) + b) & mask))
        out[r0:r0 + step].normal_(0.0, std, generator=g)
    return out


def tessera_init(model, seed):
    """Draws the weights as tessera's Llama does for `seed` (src/models/lm.cpp, llama.cpp): the
    table N(0, 1) x 0.02 from a generator seeded `seed`; block i's wq, wk, wv, wo, w1, w3, w2 in
    that order as seeded_normal(..., 0.02, (seed * 1000003 + 101 + i) * 16 + k), k = 0..6 (wo and
    w2: std 0.02 / sqrt(2 layers)); an untied head seeded_normal(..., 0.02, seed * 1000003 + 7);
    norms ones. So a PyTorch run starts from tessera's initial model."""
    cfg = model.cfg
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        table = torch.empty(cfg.vocab, cfg.d).normal_(0.0, 1.0, generator=g).mul_(0.02)
        model.emb.weight.copy_(table)
        out_std = 0.02 / math.sqrt(2.0 * cfg.layers)
        for i, blk in enumerate(model.blocks):
            base = (seed * 1000003 + 101 + i) * 16
            for k, (lin, std) in enumerate(((blk.wq, 0.02), (blk.wk, 0.02), (blk.wv, 0.02), (blk.wo, out_std),
                                            (blk.w1, 0.02), (blk.w3, 0.02), (blk.w2, out_std))):
                lin.weight.copy_(seeded_normal(tuple(lin.weight.shape), std, base + k))
            blk.attn_norm.weight.fill_(1.0)
            blk.mlp_norm.weight.fill_(1.0)
        model.norm.weight.fill_(1.0)
        if model.head is not None:
            model.head.weight.copy_(seeded_normal(tuple(model.head.weight.shape), 0.02, seed * 1000003 + 7))
