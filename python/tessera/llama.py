"""A Llama written as your own ``torch.nn.Module`` would be, from :mod:`tessera.nn`'s tensor-parallel
layers and blocks: the model ``train_gpt --model llama-*`` trains (src/models/llama.h), with the same
initial weights, as pipeline stages. To train it, use tessera's wrappers (:mod:`tessera.parallel`) and
checkpoints (:mod:`tessera.checkpoint`) as for any module; to train the library's model with the whole
trainer, use :mod:`tessera.train` instead.

:class:`LlamaStage` is pipeline stage ``stage`` of ``pp`` (blocks split as train_gpt splits
them, :func:`stage_layers`): the token embedding on the first, blocks ``[first, end)``, the
final norm and the head on the last. Parameter names are the
unsharded model's ("emb.weight", "blocks.3.attn.wq.weight", "norm.weight", "head.weight") in
every layout, so :mod:`tessera.checkpoint` saves and reshards them; :func:`unsharded_name` maps
them to the plain PyTorch Llama's ("blocks.3.wq.weight"). Initialisation is the C++ model's,
drawn from the same generators (a function of the seed and the layer), so every layout — and
train_gpt — starts from the same weights. Tied embeddings: the head multiplies by the
embedding table; with pp > 1 the last stage holds a copy (also named "emb.weight"; sum its
gradient with the first stage's over the two stages' ranks before the optimizer).

Forward and backward are collective over the tp group. Sequence parallelism and key/value
heads replicated over tp (tp > kv heads) are C++-only (train_gpt); here they are refused.
"""
import math

import torch

from . import _C
from . import nn as tnn
from .nn import RMSNorm, ParallelGQAttention, ParallelSwiGLU
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
        if not p["plain_llama"]:
            raise _C.Error(f"llama: preset '{name}' is {p['describe']}: the Python Llama has no q/k norm, explicit "
                           "head size or experts (tessera.train and tessera.nn.MoE take them)")
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


__all__ = ["LlamaConfig", "LlamaBlock", "LlamaStage", "block_init", "embedding_init", "head_init", "stage_layers",
           "lm_loss", "unsharded_name"]
