#!/usr/bin/env python3
"""Tiny Hugging Face Qwen3, Mixtral, Qwen3-MoE and OLMoE models written and run without tessera or
transformers (Debian's python3 + torch + numpy; hf_llama.py's independent safetensors writer).

  hf_families.py golden FILE CONFIG [FILE CONFIG ...]  tessera's logits and gradients (FILE, a
                           pickle of tensors by HF name: test_families.cpp) against forward() below
  hf_families.py write DIR            one tiny directory per family under DIR
  hf_families.py compare A B [A B ...]  B holds A's tensors (same names, equal values) and config
  hf_families.py generate DIR FILE [DIR FILE ...]  tessera's greedy continuation of DIR's model and
                           its logits (FILE, a pickle: test_families.cpp) against forward() rerun
(pairs in one process: torch's import is most of the cost)
forward(c, w, tokens) follows transformers' modeling_{qwen3,mixtral,qwen3_moe,olmoe}: rotate-half
rotary with head_dim (not hidden/heads when given); Qwen3's q_norm/k_norm per head over head_dim
after the view, OLMoE's over the whole q/k projection before it, both RMSNorm before the rotation;
the sparse block: gate logits, softmax in float32, torch.topk, renormalised for Mixtral and when
norm_topk_prob, experts looped with index_add_; Qwen3-MoE layers dense when in mlp_only_layers or
not (l + 1) % decoder_sparse_step == 0. Tolerances: float32, 1e-5 (logits) and 1e-4 (gradients)
relative to each tensor's largest value."""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_llama as H  # noqa: E402

ARCH = {"qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
        "olmoe": "OlmoeForCausalLM"}


def head_dim(c):
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def experts_of(c):
    return c.get("num_local_experts") if c["model_type"] == "mixtral" else c.get("num_experts", 0)


def sparse_layer(c, i):
    t = c["model_type"]
    if t in ("mixtral", "olmoe"):
        return True
    if t == "qwen3_moe":
        return i not in c.get("mlp_only_layers", []) and experts_of(c) > 0 and \
            (i + 1) % c.get("decoder_sparse_step", 1) == 0
    return False


def moe(c, w, p, x):
    """The sparse block (transformers' MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock / OlmoeSparseMoeBlock)."""
    mixtral = c["model_type"] == "mixtral"
    pre = p + ("block_sparse_moe." if mixtral else "mlp.")
    gate, up, down = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    n, k = experts_of(c), c["num_experts_per_tok"]
    shape = x.shape
    h = x.reshape(-1, shape[-1])
    logits = h @ w[pre + "gate.weight"].T
    probs = F.softmax(logits, dim=1, dtype=torch.float)
    rw, sel = torch.topk(probs, k, dim=-1)
    if mixtral or c.get("norm_topk_prob", False):
        rw = rw / rw.sum(dim=-1, keepdim=True)
    rw = rw.to(h.dtype)
    out = torch.zeros_like(h)
    mask = F.one_hot(sel, num_classes=n).permute(2, 1, 0)
    for e in range(n):
        idx, top = torch.where(mask[e])
        if top.numel() == 0:
            continue
        xe, q = h[top], f"{pre}experts.{e}."
        ye = (F.silu(xe @ w[q + gate + ".weight"].T) * (xe @ w[q + up + ".weight"].T)) @ w[q + down + ".weight"].T
        out.index_add_(0, top, ye * rw[top, idx, None])
    return out.reshape(shape)


def attention(c, w, p, a, cos, sin, mask):
    b, t, _ = a.shape
    heads, kv, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], head_dim(c), c["rms_norm_eps"]
    q, k = a @ w[p + "self_attn.q_proj.weight"].T, a @ w[p + "self_attn.k_proj.weight"].T
    v = (a @ w[p + "self_attn.v_proj.weight"].T).view(b, t, kv, hd).transpose(1, 2)
    if c["model_type"] == "olmoe":  # the whole projection
        q, k = H.rms_norm(q, w[p + "self_attn.q_norm.weight"], eps), H.rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
    q, k = q.view(b, t, heads, hd), k.view(b, t, kv, hd)
    if c["model_type"] in ("qwen3", "qwen3_moe"):  # each head
        q, k = H.rms_norm(q, w[p + "self_attn.q_norm.weight"], eps), H.rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    q, k = q * cos + H.rotate_half(q) * sin, k * cos + H.rotate_half(k) * sin
    k, v = H.repeat_kv(k, heads // kv), H.repeat_kv(v, heads // kv)
    att = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(hd) + mask, dim=-1, dtype=torch.float32)
    return (att @ v).transpose(1, 2).reshape(b, t, heads * hd) @ w[p + "self_attn.o_proj.weight"].T


def forward(c, w, tokens):
    """tokens [B, T] -> logits [B, T, V]; w: {HF name: float32 tensor}."""
    t = tokens.shape[1]
    hd, eps = head_dim(c), c["rms_norm_eps"]
    inv = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    freqs = torch.arange(t, dtype=torch.float32)[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.full((t, t), float("-inf")).triu(1)
    x = w["model.embed_tokens.weight"][tokens]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = x + attention(c, w, p, H.rms_norm(x, w[p + "input_layernorm.weight"], eps), cos, sin, mask)
        m = H.rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        if sparse_layer(c, i):
            x = x + moe(c, w, p, m)
        else:
            gate = F.silu(m @ w[p + "mlp.gate_proj.weight"].T)
            x = x + (gate * (m @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    h = H.rms_norm(x, w["model.norm.weight"], eps)
    return h @ (w["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else w["lm_head.weight"]).T


def golden(path, config):
    d = torch.load(path)
    c = json.load(open(config))
    w = {n[2:]: t.clone().requires_grad_() for n, t in d.items() if n.startswith("w.")}
    logits = forward(c, w, d["tokens"])
    (logits * d["G"]).sum().backward()
    bad = []

    def check(name, got, want, rtol):
        rel = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
        if not rel <= rtol:
            bad.append(f"{name}: relative difference {rel:.3e} > {rtol}")

    check("logits", d["logits"], logits.detach(), 1e-5)
    grads = {n[2:]: t for n, t in d.items() if n.startswith("g.")}
    if set(grads) != set(w):
        bad.append(f"gradients of {sorted(set(w) ^ set(grads))[:4]}: only on one side")
    for n, g in grads.items():
        want = w[n].grad if w[n].grad is not None else torch.zeros_like(w[n])
        check("grad " + n, g, want, 1e-4)
    print("\n".join(["MISMATCH " + b for b in bad] + [("FAILED" if bad else "ok") + f": {c['model_type']} golden, "
                                                      f"{len(w)} tensors"]))
    return 1 if bad else 0


# ---- tiny directories per family

def tiny_config(t):
    c = dict(architectures=[ARCH[t]], model_type=t, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=64, max_position_embeddings=16, rms_norm_eps=1e-6,
             rope_theta=1000000.0, tie_word_embeddings=False, hidden_act="silu", attention_bias=False,
             bos_token_id=1, eos_token_id=2, torch_dtype="float32")
    if t in ("qwen3", "qwen3_moe"):
        c.update(head_dim=16, intermediate_size=48, use_sliding_window=False, sliding_window=None)
    if t == "qwen3_moe":
        c.update(num_hidden_layers=3, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=16,
                 norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1], output_router_logits=False,
                 router_aux_loss_coef=0.001)
    if t == "mixtral":
        c.update(intermediate_size=24, num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
                 output_router_logits=True, router_aux_loss_coef=0.02, tie_word_embeddings=True)
    if t == "olmoe":
        c.update(intermediate_size=16, num_key_value_heads=4, num_experts=6, num_experts_per_tok=3,
                 norm_topk_prob=False, clip_qkv=None, rope_theta=10000.0, rms_norm_eps=1e-5)
    return c


def names_and_shapes(c):
    d, v, hd = c["hidden_size"], c["vocab_size"], head_dim(c)
    q, kv, t = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd, c["model_type"]
    out = [("model.embed_tokens.weight", (v, d))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (d,)), (p + "self_attn.q_proj.weight", (q, d)),
                (p + "self_attn.k_proj.weight", (kv, d)), (p + "self_attn.v_proj.weight", (kv, d)),
                (p + "self_attn.o_proj.weight", (d, q)), (p + "post_attention_layernorm.weight", (d,))]
        if t != "mixtral":
            whole = t == "olmoe"
            out += [(p + "self_attn.q_norm.weight", (q if whole else hd,)),
                    (p + "self_attn.k_norm.weight", (kv if whole else hd,))]
        if not sparse_layer(c, i):
            f = c["intermediate_size"]
            out += [(p + "mlp.gate_proj.weight", (f, d)), (p + "mlp.up_proj.weight", (f, d)),
                    (p + "mlp.down_proj.weight", (d, f))]
            continue
        mix = t == "mixtral"
        pre, f = p + ("block_sparse_moe." if mix else "mlp."), c.get("moe_intermediate_size", c["intermediate_size"])
        out.append((pre + "gate.weight", (experts_of(c), d)))
        for e in range(experts_of(c)):
            for name, shape in (("w1" if mix else "gate_proj", (f, d)), ("w2" if mix else "down_proj", (d, f)),
                                ("w3" if mix else "up_proj", (f, d))):
                out.append((f"{pre}experts.{e}.{name}.weight", shape))
    out.append(("model.norm.weight", (d,)))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", (v, d)))
    return out


def write(root):
    """One directory per family: Mixtral in bf16 over 3 files with an index, the others float32."""
    rng = np.random.default_rng(7)
    for t in ARCH:
        c = tiny_config(t)
        items = []
        for n, s in names_and_shapes(c):
            a = 1.0 + 0.3 * rng.standard_normal(s) if len(s) == 1 else 2.0 * rng.standard_normal(s) / math.sqrt(s[1])
            items.append((n, a.astype(np.float32)))
        path = os.path.join(root, t)
        dtype, shards = ("BF16", 3) if t == "mixtral" else ("F32", 1)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(c, f, indent=2)
        if shards == 1:
            H.write_safetensors(os.path.join(path, "model.safetensors"), items, dtype)
            continue
        per, weight_map = math.ceil(len(items) / shards), {}
        for k in range(shards):
            file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            H.write_safetensors(os.path.join(path, file), items[k * per:(k + 1) * per], dtype)
            weight_map.update({n: file for n, _ in items[k * per:(k + 1) * per]})
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)


def compare(a, b):
    ca, wa = H.read_model(a)
    cb, wb = H.read_model(b)
    bad = [f"tensors only in one: {sorted(set(wa) ^ set(wb))[:6]}"] if set(wa) != set(wb) else []
    bad += [f"{n}: values differ" for n in wa if n in wb and not torch.equal(wa[n], wb[n])]
    keys = ("model_type", "architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "rope_theta",
            "tie_word_embeddings", "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
            "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "output_router_logits",
            "router_aux_loss_coef", "bos_token_id")
    bad += [f"config {k}: {ca.get(k)} != {cb.get(k)}" for k in keys if k in ca and ca.get(k) != cb.get(k)]
    print("\n".join(["MISMATCH " + x for x in bad] + [("FAILED" if bad else "ok") + f": {a} vs {b}, {len(wa)} tensors"]))
    return 1 if bad else 0


def generate(path, file):
    """The prompt's greedy continuation and every step's logits, rerunning the whole sequence."""
    c, w = H.read_model(path)
    d = torch.load(file)
    ids, bad = d["prompt"][0].tolist(), []
    for step, got in enumerate(d["tokens"].tolist()):
        want = forward(c, w, torch.tensor([ids]))[0, -1]
        rel = (d["logits"][step] - want).abs().max().item() / want.abs().max().item()
        if rel > 1e-5 or int(want.argmax()) != got:
            bad.append(f"step {step}: token {got}, reference {int(want.argmax())}; logits differ by {rel:.2e}")
            break
        ids.append(got)
    print("\n".join(["MISMATCH " + b for b in bad] + [("FAILED" if bad else "ok") + f": {path} greedy, "
                                                      f"{len(d['tokens'])} steps"]))
    return 1 if bad else 0


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "write":
        write(args[0])
        sys.exit(0)
    fn = {"generate": generate, "golden": golden, "compare": compare}[cmd]
    sys.exit(max(fn(a, b) for a, b in zip(args[0::2], args[1::2])))
