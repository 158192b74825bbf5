"""The PyTorch MoE Llama of bench/moe/anchor.py (torchtitan-style: grouped-matmul experts, expert
parallel by all_to_all_single): its layers, initial weights and FLOP count."""
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

def rms_norm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def head_dim(a):
    """The width of a head: --head-dim where given (Qwen3-30B-A3B: 128 with d / heads = 64), else d / heads."""
    return a.head_dim or a.d // a.heads


def rotate(x, cos, sin):  # x [B, H, T, hd]; cos, sin [T, hd] float32 (rotate-half, as Hugging Face's Llama)
    h = x.shape[-1] // 2
    xf = x.float()
    rot = torch.cat((-xf[..., h:], xf[..., :h]), dim=-1)
    return (xf * cos + rot * sin).to(x.dtype)


class AttentionPart(nn.Module):
    """x + attention(RMSNorm(x)): compiled as one region."""

    def __init__(self, a):
        super().__init__()
        d, self.h, self.kv, self.hd = a.d, a.heads, a.kv_heads, head_dim(a)
        self.eps = a.norm_eps
        self.norm = RMSNorm(d, a.norm_eps)
        self.wq = nn.Linear(d, self.h * self.hd, bias=False)
        self.wk = nn.Linear(d, self.kv * self.hd, bias=False)
        self.wv = nn.Linear(d, self.kv * self.hd, bias=False)
        self.wo = nn.Linear(self.h * self.hd, d, bias=False)
        self.qk = a.qk_norm
        if self.qk == "whole":  # OLMoE: RMSNorm over the whole q projection and the whole k projection, float32
            self.q_norm = RMSNorm(self.h * self.hd, a.norm_eps)
            self.k_norm = RMSNorm(self.kv * self.hd, a.norm_eps)
        elif self.qk == "per-head":  # Qwen3: RMSNorm over each head's hd values (one weight of hd), before RoPE
            self.q_norm = RMSNorm(self.hd, a.norm_eps)
            self.k_norm = RMSNorm(self.hd, a.norm_eps)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        hx = self.norm(x)
        q, k, v = self.wq(hx), self.wk(hx), self.wv(hx)
        if self.qk == "whole":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.view(b, t, self.h, self.hd), k.view(b, t, self.kv, self.hd)
        if self.qk == "per-head":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(b, t, self.kv, self.hd).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        gqa = dict(enable_gqa=True) if self.kv != self.h else {}
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
        return x + self.wo(o.transpose(1, 2).reshape(b, t, self.h * self.hd))


def _route(x, norm_w, gate_w, eps, k):
    """RMSNorm, the float32 router's softmax and its top-k: (normed x [n, d], probs [n, E], top values, indices)."""
    h = rms_norm(x, norm_w, eps)
    probs = torch.softmax(F.linear(h.float(), gate_w.float()), dim=-1)
    top_v, top_i = torch.topk(probs, k, dim=-1)
    return h, probs, top_v, top_i


def _swiglu(a, b):
    return F.silu(a) * b


ROUTE, SWIGLU = _route, _swiglu  # replaced by their compiled versions under --compile 1


class Router(nn.Module):
    """The gate [E, d]: its own FSDP unit, kept in float32."""

    def __init__(self, d, e):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(e, d))

    def forward(self, x, norm_w, eps, k):
        return ROUTE(x, norm_w, self.weight, eps, k)


class Experts(nn.Module):
    """This rank's El experts, SwiGLU by three grouped GEMMs over rows grouped by expert (offs: int32 ends)."""

    def __init__(self, el, d, f):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(el, f, d))
        self.w3 = nn.Parameter(torch.empty(el, f, d))
        self.w2 = nn.Parameter(torch.empty(el, d, f))

    def forward(self, x, offs):
        w1, w3, w2 = (w.to(torch.bfloat16) for w in (self.w1, self.w3, self.w2))  # FSDP's bf16 already: no-op
        x = x.to(torch.bfloat16)
        h = SWIGLU(torch._grouped_mm(x, w1.transpose(-2, -1), offs=offs),
                   torch._grouped_mm(x, w3.transpose(-2, -1), offs=offs))
        return torch._grouped_mm(h, w2.transpose(-2, -1), offs=offs)


class AllToAll(torch.autograd.Function):
    """Rows exchanged by all_to_all_single with given splits; backward: the reverse exchange."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        out_splits, in_splits = ctx.splits
        gin = g.new_empty((sum(in_splits),) + tuple(g.shape[1:]))
        dist.all_to_all_single(gin, g.contiguous(), in_splits, out_splits, group=ctx.group)
        return gin, None, None, None


class MoE(nn.Module):
    def __init__(self, a, ep, ep_rank, ep_group):
        super().__init__()
        self.e, self.k, self.ep, self.ep_group = a.experts, a.topk, ep, ep_group
        self.el = a.experts // ep
        self.norm_topk = a.norm_topk == "on"
        self.eps = a.norm_eps
        self.norm = RMSNorm(a.d, a.norm_eps)
        self.router = Router(a.d, a.experts)
        self.experts = Experts(self.el, a.d, a.expert_ffn)
        self.balanced = False
        self.loads = []  # [E] int64 per forward while `record` is set (real routing's statistics)
        self.record = False

    def forward(self, x):
        b, t, d = x.shape
        n = b * t
        h, probs, top_v, top_i = self.router(x.reshape(n, d), self.norm.weight, self.eps, self.k)
        if self.balanced:  # token i -> experts (i k + j) mod E, weighted by the router's probabilities of those
            top_i = (torch.arange(n, device=x.device)[:, None] * self.k
                     + torch.arange(self.k, device=x.device)[None, :]) % self.e
            top_v = probs.gather(1, top_i)
        if self.norm_topk:
            top_v = top_v / top_v.sum(-1, keepdim=True)
        flat = top_i.reshape(-1)
        order = torch.argsort(flat, stable=True)  # assignments grouped by expert (then by token)
        counts = torch.zeros(self.e, dtype=torch.int64, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
        if self.record:
            self.loads.append(counts)
        token_of = order // self.k
        rows = h[token_of]  # [n k, d] in expert order
        if self.ep == 1:
            y = self.experts(rows, torch.cumsum(counts, 0).to(torch.int32))
        else:
            recv = torch.empty_like(counts)  # recv[p El + j]: rank p's rows for my local expert j
            dist.all_to_all_single(recv, counts, group=self.ep_group)
            splits = torch.cat([counts.view(self.ep, self.el).sum(1), recv.view(self.ep, self.el).sum(1)]).tolist()
            in_splits, out_splits = splits[:self.ep], splits[self.ep:]
            got = AllToAll.apply(rows, out_splits, in_splits, self.ep_group)  # by source rank, then local expert
            total = sum(out_splits)
            local = torch.arange(self.el, device=x.device).repeat(self.ep).repeat_interleave(recv, output_size=total)
            perm = torch.argsort(local, stable=True)  # received rows grouped by local expert
            inv = torch.empty_like(perm)
            inv[perm] = torch.arange(total, device=x.device)
            offs = torch.cumsum(recv.view(self.ep, self.el).sum(0), 0).to(torch.int32)
            y = self.experts(got[perm], offs)[inv]
            y = AllToAll.apply(y, in_splits, out_splits, self.ep_group)  # back, in `rows`' order
        w = top_v.reshape(-1)[order]
        out = torch.zeros(n, d, dtype=torch.float32, device=x.device).index_add(0, token_of, y.float() * w[:, None])
        return x + out.to(x.dtype).view(b, t, d)


class Block(nn.Module):
    def __init__(self, a, ep, ep_rank, ep_group):
        super().__init__()
        self.attn = AttentionPart(a)
        self.moe = MoE(a, ep, ep_rank, ep_group)

    def forward(self, x, cos, sin):
        return self.moe(self.attn(x, cos, sin))


class Model(nn.Module):
    def __init__(self, a, ep, ep_rank, ep_group):
        super().__init__()
        self.emb = nn.Embedding(a.vocab, a.d)
        self.blocks = nn.ModuleList([Block(a, ep, ep_rank, ep_group) for _ in range(a.layers)])
        self.norm = RMSNorm(a.d, a.norm_eps)
        self.head = nn.Linear(a.d, a.vocab, bias=False)
        hd = head_dim(a)
        inv = 1.0 / a.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        ang = torch.outer(torch.arange(a.seq_len, dtype=torch.float32), inv)
        ang = torch.cat([ang, ang], dim=-1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, tokens, targets):
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def init_weights(model, seed, ep_rank):
    """N(0, 0.02) for every matrix and table, norms at 1; each rank's experts from (seed, layer, ep rank)."""
    g = torch.Generator(device=model.emb.weight.device)
    g.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".experts." in name:
                continue
            if p.dim() >= 2:
                p.normal_(0.0, 0.02, generator=g)
        for li, blk in enumerate(model.blocks):
            ex = blk.moe.experts
            for w in (ex.w1, ex.w3, ex.w2):
                w.normal_(0.0, 0.02, generator=g.manual_seed(seed + 1000 * (li + 1) + 7 * ep_rank))


# ------------------------------------------------------------------------------------------------- the training


def flops_per_token(a):
    """train_gpt's flopsPerToken (src/models/config.cpp) for this shape: active parameters."""
    hd = head_dim(a)
    q, kv = a.heads * hd, a.kv_heads * hd
    norms = {"whole": q + kv, "per-head": 2 * hd}.get(a.qk_norm, 0)
    attention = a.d * q * 2 + 2 * a.d * kv + 2 * a.d + norms
    block = attention + a.experts * a.d + 3 * a.d * a.topk * a.expert_ffn
    return 6.0 * (a.layers * block + a.vocab * a.d) + 12.0 * a.layers * a.heads * hd * a.seq_len
