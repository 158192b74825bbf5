"""Llama in Python from tessera's tensor-parallel layers: the model ``train_gpt --model llama-*``
trains (src/models/llama.h), as ``torch.nn.Module`` building blocks and pipeline stages.

Building blocks (also in :mod:`tessera.nn`): :class:`RMSNorm`, :func:`rope_tables` /
:func:`apply_rotary` (rotate-half RoPE, Llama 3.1 frequency scaling), :class:`ParallelGQAttention`
(grouped-query attention, query and key/value heads split over the tp group),
:class:`ParallelSwiGLU` (w2(silu(w1 x) * w3 x), split over tp). Activations are
``[tokens, batch, d]`` as in the C++ model.

:class:`LlamaStage` is pipeline stage ``stage`` of ``pp`` (blocks split as train_gpt splits
them, :func:`stage_layers`): the token embedding on the first, blocks ``[first, end)``, the
final norm and the head on the last. Parameter names are the
unsharded model's ("emb.weight", "blocks.3.attn.wq.weight", "norm.weight", "head.weight") in
every layout, so :mod:`tessera.checkpoint` saves and reshards them; :func:`unsharded_name` maps
them to the plain PyTorch Llama's ("blocks.3.wq.weight"). Initialisation is the C++ model's,
drawn from the same generators (a function of the seed and the layer), so every layout — and
train_gpt — starts from the same weights. Tied embeddings: the head multiplies by the
embedding table; with pp > 1 the last stage holds a copy (also named "emb.weight", whose
gradient :func:`sync_tied_grads` sums with the first stage's).

Forward and backward are collective over the tp group. Sequence parallelism and key/value
heads replicated over tp (tp > kv heads) are C++-only (train_gpt); here they are refused.
"""
import math

import torch
import torch.nn.functional as F

from . import _C
from . import nn as tnn
from .parallel import _group_of

_models = _C.models


class LlamaConfig:
    """Model shape. :meth:`preset` reads train_gpt's presets ("llama-tiny", "llama3-1b",
    "llama3-8b"); any field can be overridden."""

    def __init__(self, d, layers, heads, kv_heads, ffn, vocab, seq_len, rope_theta=10000.0, rope_scaling=None,
                 tied=False, norm_eps=1e-5):
        self.d, self.layers, self.heads, self.kv_heads, self.ffn = d, layers, heads, kv_heads, ffn
        self.vocab, self.seq_len, self.rope_theta, self.rope_scaling = vocab, seq_len, rope_theta, rope_scaling
        self.tied, self.norm_eps = tied, norm_eps
        if d % heads or heads % kv_heads:
            raise _C.Error(f"llama: d = {d} must be divisible by heads = {heads}, heads by kv heads = {kv_heads}")

    @classmethod
    def preset(cls, name, **overrides):
        p = _models.preset(name)
        if p["arch"] != "llama":
            raise _C.Error(f"llama: preset '{name}' is a {p['arch']} model, not a Llama")
        fields = {k: p[k] for k in ("d", "layers", "heads", "kv_heads", "ffn", "vocab", "seq_len", "rope_theta",
                                    "rope_scaling", "norm_eps")}
        fields["tied"] = p["tied"]
        fields.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**fields)

    @property
    def head_dim(self):
        return self.d // self.heads

    def __repr__(self):
        return (f"Llama d {self.d}, layers {self.layers}, heads {self.heads} (kv {self.kv_heads}), ffn {self.ffn}, "
                f"vocab {self.vocab}, seq {self.seq_len}, {'tied' if self.tied else 'untied'}")


# ---- building blocks

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


class LlamaBlock(torch.nn.Module):
    """h = x + attn(attn_norm(x)); y = h + mlp(mlp_norm(h))."""

    def __init__(self, cfg, group, *, name="block"):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d, cfg.norm_eps)
        self.attn = ParallelGQAttention(cfg.d, cfg.heads, cfg.kv_heads, group, seq_len=cfg.seq_len,
                                        rope_theta=cfg.rope_theta, rope_scaling=cfg.rope_scaling, name=f"{name}.attn")
        self.mlp_norm = RMSNorm(cfg.d, cfg.norm_eps)
        self.mlp = ParallelSwiGLU(cfg.d, cfg.ffn, group, name=f"{name}.mlp")

    def forward(self, x):
        h = x + self.attn(self.attn_norm(x))
        return h + self.mlp(self.mlp_norm(h))

    @torch.no_grad()
    def load_full(self, full):
        """The unsharded block's tensors by unsharded name ("wq.weight", "w1.weight",
        "attn_norm.weight", ...): each layer keeps its shard."""
        for n in ("wq", "wk", "wv", "wo"):
            getattr(self.attn, n).load_full(full[f"{n}.weight"])
        for n in ("w1", "w2", "w3"):
            getattr(self.mlp, n).load_full(full[f"{n}.weight"])
        self.attn_norm.weight.copy_(full["attn_norm.weight"])
        self.mlp_norm.weight.copy_(full["mlp_norm.weight"])


# ---- initialisation: the C++ model's generators (src/models/llama.cpp, lm.cpp)

def _generator(seed):
    return torch.Generator().manual_seed(seed % 2**64)


def _mix(x):
    """splitmix64, as src/nn/init.cpp's mix."""
    m = 2**64 - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def seeded_normal(rows, cols, mean, std, seed):
    """nn::seededNormal (src/nn/init.h): [rows, cols] of N(mean, std^2) in blocks of about 2^20 values,
    block b from a generator seeded mix(mix(seed) + b)."""
    seed %= 2**64
    block = max(1, (1 << 20) // max(cols, 1))
    out = torch.empty(rows, cols)
    for b, r0 in enumerate(range(0, rows, block)):
        g = _generator(_mix((_mix(seed) + b) % 2**64))
        out[r0:r0 + block].normal_(mean, std, generator=g)
    return out


def block_init(cfg, layer, seed):
    """The unsharded block `layer` as the C++ model draws it (src/models/llama.cpp): wq, wk, wv, wo,
    w1, w3, w2 as seeded_normal(..., (seed·1000003 + 101 + layer)·16 + k) for k = 0..6 in that order,
    mean 0, std 0.02 (wo and w2: 0.02 / sqrt(2·layers)); norms ones."""
    base = (seed * 1000003 + 101 + layer) * 16
    hd, std = cfg.head_dim, 0.02
    out = 0.02 / math.sqrt(2.0 * cfg.layers)
    w = {}
    for k, (name, rows, cols, s) in enumerate((
            ("wq", cfg.heads * hd, cfg.d, std), ("wk", cfg.kv_heads * hd, cfg.d, std),
            ("wv", cfg.kv_heads * hd, cfg.d, std), ("wo", cfg.d, cfg.heads * hd, out),
            ("w1", cfg.ffn, cfg.d, std), ("w3", cfg.ffn, cfg.d, std), ("w2", cfg.d, cfg.ffn, out))):
        w[f"{name}.weight"] = seeded_normal(rows, cols, 0.0, s, base + k)
    w["attn_norm.weight"] = torch.ones(cfg.d)
    w["mlp_norm.weight"] = torch.ones(cfg.d)
    return w


def embedding_init(cfg, seed):
    """The table [V, d]: N(0, 1) from a generator seeded `seed`, times 0.02."""
    return torch.empty(cfg.vocab, cfg.d).normal_(0.0, 1.0, generator=_generator(seed)).mul_(0.02)


def head_init(cfg, seed):
    """The untied head [V, d]: seeded_normal(V, d, 0, 0.02, seed·1000003 + 7)."""
    return seeded_normal(cfg.vocab, cfg.d, 0.0, 0.02, seed * 1000003 + 7)


# ---- the model as pipeline stages

def stage_layers(cfg, pp, stage):
    """Blocks [first, end) of stage `stage` of `pp`, as train_gpt splits them (balanced by
    compute, the embedding counting as a lookup; src/models/lm.h)."""
    return tuple(_models.partition(cfg.d, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn, cfg.vocab, pp)[stage])


class LlamaStage(torch.nn.Module):
    """Stage ``stage`` of ``pp`` of the Llama over tensor-parallel ``group`` (a Communicator or a
    ProcessMesh). Stage 0 takes tokens ``[b, T]`` (int64); the last returns this rank's logits
    ``[T, b, V/tp]`` (take the loss with :func:`lm_loss`); others take and return ``[T, b, d]``.
    Construction is local (the same seed on every rank gives every layout the same model)."""

    def __init__(self, cfg, group, *, stage=0, pp=1, seed=1234):
        super().__init__()
        tp = _group_of(group, "tp")
        self.cfg, self.tp = cfg, tp
        self.first, self.end = stage_layers(cfg, pp, stage)
        self.is_first, self.is_last = stage == 0, stage == pp - 1
        # The embedding on the first stage; with tied embeddings the last stage's copy of the table.
        self.emb = None
        if self.is_first or (self.is_last and cfg.tied):
            self.emb = tnn.VocabParallelEmbedding(cfg.vocab, cfg.d, tp)
            self.emb.load_full(embedding_init(cfg, seed))
            if not self.is_first:
                self.emb.weight._tessera_tied_copy = True  # the first stage's table counts in norms
        self.blocks = torch.nn.ModuleDict()
        for i in range(self.first, self.end):
            b = LlamaBlock(cfg, tp, name=f"blocks.{i}")
            b.load_full(block_init(cfg, i, seed))
            self.blocks[str(i)] = b
        self.norm = RMSNorm(cfg.d, cfg.norm_eps) if self.is_last else None
        self.head = None
        if self.is_last and not cfg.tied:
            self.head = tnn.ColumnParallelLinear(cfg.d, cfg.vocab, tp, bias=False, name="head")
            self.head.load_full(head_init(cfg, seed))

    def forward(self, x):
        if self.is_first:
            if x.dim() != 2 or x.shape[1] != self.cfg.seq_len:
                raise _C.Error(f"llama: the first stage takes tokens [batch, {self.cfg.seq_len}], got {list(x.shape)}")
            x = self.emb(x.t().contiguous())  # [T, b, d]
        for b in self.blocks.values():
            x = b(x)
        if not self.is_last:
            return x
        h = self.norm(x)
        if self.head is not None:
            return self.head(h)
        return tnn._tp.column_parallel_linear(h, self.emb.weight, None, self.tp, gather_output=False,
                                              sequence_parallel=False, name="head (tied)")

    def units(self):
        """Submodules to make FSDP units of (one per block); the rest forms the root unit."""
        return list(self.blocks.values())


def lm_loss(logits, targets, group, vocab=0):
    """Mean cross-entropy of this rank's logits ``[T, b, V/tp]`` against ``targets [b, T]``
    (global ids), collective over the tp group; the same on every tp rank."""
    return tnn.vocab_parallel_cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.t().reshape(-1),
                                            _group_of(group, "tp"), vocab)


def unsharded_name(name):
    """This module's parameter name -> the plain PyTorch Llama's (tests/models/torch_llama.py,
    train_gpt's checkpoints): "blocks.3.attn.wq.weight" -> "blocks.3.wq.weight"."""
    return name.replace(".attn.", ".").replace(".mlp.", ".")


def decays(name, embeddings=True):
    """train_gpt's weight-decay rule (src/optim/adamw.h): matrices yes, norms and biases no,
    embeddings when ``embeddings``."""
    return _models.decays_by_name(unsharded_name(name), embeddings)


def lr_at(step, *, kind, lr, min_lr=0.0, warmup=0, total, decay=0):
    """train_gpt's learning rate of 0-based ``step`` (linear warm-up, then cosine / linear / WSD
    to ``min_lr`` at ``total``; src/optim/lr_schedule.h)."""
    return _models.lr_at(kind, lr, min_lr, warmup, total, decay, step)


def tied_group(mesh, cfg):
    """The group of this (dp, tp) slot's first and last stage ranks when the embeddings are tied
    over pp > 1 (collective over the world; None elsewhere or when not needed)."""
    d, p, t = mesh.coord
    if not cfg.tied or mesh.pp_size == 1:
        return None
    end = p in (0, mesh.pp_size - 1)
    return mesh.world.split(d * mesh.tp_size + t if end else -1, p, "emb")


def sync_tied_grads(stage, group):
    """Sums the tied table's gradient over the first and last stage (after backward)."""
    if group is not None and stage.emb is not None and stage.emb.weight.grad is not None:
        group.all_reduce(stage.emb.weight.grad)


def clip_grad_norm_(named_grads, max_norm, groups):
    """Global gradient-norm clipping over a model split over ranks. ``named_grads``: [(original
    parameter, gradient view)] this rank holds: a tp-sharded parameter (marked by tessera.nn)
    counts on every tp rank, a replicated one on tp rank 0 only, a tied copy not at all.
    ``groups``: (tp group, *groups whose ranks hold disjoint parts, e.g. pp and FSDP's dp).
    Scales the gradients by min(1, max_norm / (norm + 1e-6)) as torch's clip_grad_norm_; returns
    the norm before clipping (a float)."""
    tp = groups[0]
    named_grads = list(named_grads)
    sq = torch.zeros(1, device=named_grads[0][1].device if named_grads else None)  # the gradients' device
    for p, g in named_grads:
        if getattr(p, "_tessera_tied_copy", False):
            continue
        sharded = getattr(p, "_tessera_shard", None) is not None and tuple(p._tessera_shard[0]) != tuple(p.shape)
        if sharded or tp.rank == 0:
            sq += g.detach().float().pow(2).sum()
    for grp in groups:
        if grp.size > 1:
            grp.all_reduce(sq)
    norm = math.sqrt(sq.item())
    coef = min(1.0, max_norm / (norm + 1e-6)) if max_norm > 0 else 1.0
    if coef < 1.0:
        for _, g in named_grads:
            g.mul_(coef)
    return norm


__all__ = ["LlamaConfig", "RMSNorm", "rope_inv_freq", "rope_tables", "apply_rotary", "causal_attention",
           "ParallelGQAttention", "ParallelSwiGLU", "LlamaBlock", "LlamaStage", "block_init", "embedding_init",
           "head_init", "stage_layers", "lm_loss", "unsharded_name", "decays", "lr_at", "tied_group",
           "sync_tied_grads", "clip_grad_norm_"]
