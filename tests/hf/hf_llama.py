"""A tiny Hugging Face Llama written and run without tessera or transformers, for tests/hf.

- write_model(dir, variant, dtype): config.json and model.safetensors (or shards + index)
  written with json, struct and numpy only (an independent safetensors writer), weights drawn
  from numpy with large enough values that attention is sharp and every convention matters.
- read_model(dir), read_safetensors(file): the tensors back (numpy reader), float32 torch.
- forward(cfg, w, tokens): logits [B, T, V] with transformers' LlamaForCausalLM conventions:
  rotate-half rotary on q/k with inv_freq computed as transformers does (float32, with the
  llama3 scaling), repeat_kv for grouped-query attention, RMSNorm in float32 (weight * x in the
  input dtype), SiLU-gated MLP, the head (or the embedding table when tied). rope="interleaved"
  runs the GPT-J pairing instead: the tests show that it gives other logits.
- greedy(cfg, w, prompt, n): the argmax continuation (the whole sequence rerun each step).
- synthetic_batch(seed, step, batch, vocab, seq): train_gpt's synthetic batch
  (src/data/synthetic.cpp) reproduced with torch's CPU generator.
"""
import json
import math
import os
import struct

import numpy as np
import torch

VARIANTS = {
    # GQA (4 heads, 2 kv heads), untied head, llama3 rope scaling, stored in bf16 and sharded.
    "gqa_untied": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=256, max_position_embeddings=32, rms_norm_eps=1e-5,
                       rope_theta=500000.0, tie_word_embeddings=False,
                       rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    # Tied embeddings, kv heads = heads, no scaling, float32 in one file.
    "tied": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, vocab_size=256, max_position_embeddings=32, rms_norm_eps=1e-6,
                 rope_theta=10000.0, tie_word_embeddings=True, rope_scaling=None),
}

DTYPES = {"F32": (np.float32, 4), "BF16": (np.uint16, 2), "F16": (np.float16, 2)}


def config(variant, **over):
    c = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu", attention_bias=False,
             mlp_bias=False, bos_token_id=1, eos_token_id=2, torch_dtype="float32", initializer_range=0.02)
    c.update(VARIANTS[variant])
    c.update(over)
    return c


def hf_names(c):
    names = ["model.embed_tokens.weight"]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight", p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                  p + "self_attn.v_proj.weight", p + "self_attn.o_proj.weight", p + "post_attention_layernorm.weight",
                  p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"]
    names.append("model.norm.weight")
    if not c["tie_word_embeddings"]:
        names.append("lm_head.weight")
    return names


def shape_of(c, name):
    d, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = d // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return (v, d)
    for key, shape in (("layernorm", (d,)), ("norm.weight", (d,)), ("q_proj", (d, d)), ("k_proj", (kv, d)),
                       ("v_proj", (kv, d)), ("o_proj", (d, d)), ("gate_proj", (f, d)), ("up_proj", (f, d)),
                       ("down_proj", (d, f))):
        if key in name:
            return shape
    raise KeyError(name)


def random_weights(c, seed=0):
    """float32 numpy weights: matrices N(0, 1/sqrt(fan_in)) x 2 (sharp attention), norms around 1."""
    rng = np.random.default_rng(seed)
    w = {}
    for n in hf_names(c):
        s = shape_of(c, n)
        if len(s) == 1:
            w[n] = (1.0 + 0.3 * rng.standard_normal(s)).astype(np.float32)
        else:
            w[n] = (2.0 * rng.standard_normal(s) / math.sqrt(s[1])).astype(np.float32)
    return w


def to_bf16_bits(a):
    """Round-to-nearest-even float32 -> bfloat16 bits (as torch's conversion)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def encode(a, dtype):
    if dtype == "BF16":
        return to_bf16_bits(a).astype("<u2").tobytes()
    return np.ascontiguousarray(a, dtype=np.dtype(DTYPES[dtype][0]).newbyteorder("<")).tobytes()


def write_safetensors(path, tensors, dtype):
    """tensors: [(name, float32 array)] in data order."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors:
        b = encode(a, dtype)
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_model(path, c, w, dtype="F32", shards=1, extra_tensors=()):
    """config.json + weights (in `shards` files with an index when > 1). Returns the weights as
    stored (bf16-rounded when dtype is BF16), float32."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    items = [(n, w[n]) for n in hf_names(c) if n in w] + list(extra_tensors)
    if shards == 1:
        write_safetensors(os.path.join(path, "model.safetensors"), items, dtype)
    else:
        per = math.ceil(len(items) / shards)
        weight_map = {}
        for k in range(shards):
            file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            part = items[k * per:(k + 1) * per]
            write_safetensors(os.path.join(path, file), part, dtype)
            weight_map.update({n: file for n, _ in part})
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
    if dtype == "BF16":
        return {n: from_bf16_bits(to_bf16_bits(a)) for n, a in w.items()}
    return {n: np.asarray(a, dtype=np.float32) for n, a in w.items()}


def read_safetensors(path):
    """{name: float32 torch tensor} of one safetensors file (F32, BF16, F16)."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data, out = raw[8 + n:], {}
    for name, e in header.items():
        b, s = e["data_offsets"]
        if e["dtype"] == "BF16":
            a = from_bf16_bits(np.frombuffer(data[b:s], "<u2"))
        else:
            a = np.frombuffer(data[b:s], np.dtype(DTYPES[e["dtype"]][0]).newbyteorder("<")).astype(np.float32)
        out[name] = torch.from_numpy(a.reshape(e["shape"]).copy())
    return out


def read_model(path):
    """(config, {hf name: float32 torch tensor}) of a directory (index or model.safetensors)."""
    with open(os.path.join(path, "config.json")) as f:
        c = json.load(f)
    index = os.path.join(path, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
        else ["model.safetensors"]
    out = {}
    for file in files:
        out.update(read_safetensors(os.path.join(path, file)))
    return c, out


# ---- the reference forward (transformers' conventions, written out)

def inv_freq(c):
    """transformers' _compute_default_rope_parameters / _compute_llama3_parameters (float32)."""
    d = c["hidden_size"] // c["num_attention_heads"]
    base = c.get("rope_theta", 10000.0)
    f = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = c.get("rope_scaling")
    if not s:
        return f
    factor, low, high, old = s["factor"], s["low_freq_factor"], s["high_freq_factor"], \
        s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / f
    f_llama = torch.where(wavelen > low_wavelen, f / factor, f)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * f_llama / factor + smooth * f_llama
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, f_llama)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotate_interleaved(x, cos, sin):
    """GPT-J / Meta's original pairing (2i, 2i+1): what the rotate-half layout is not."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos[..., : x.shape[-1] // 2], sin[..., : x.shape[-1] // 2]
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


def rms_norm(x, weight, eps):
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def repeat_kv(x, n):
    b, h, t, d = x.shape
    return x if n == 1 else x[:, :, None, :, :].expand(b, h, n, t, d).reshape(b, h * n, t, d)


def forward(c, w, tokens, rope="half"):
    """tokens [B, T] int64 -> logits [B, T, V] float32; w: {hf name: float32 tensor}."""
    b, t = tokens.shape
    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c["hidden_size"] // heads
    eps = c["rms_norm_eps"]
    freqs = torch.arange(t, dtype=torch.float32)[:, None] * inv_freq(c)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x = w["model.embed_tokens.weight"][tokens]
    mask = torch.full((t, t), float("-inf")).triu(1)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (a @ w[p + "self_attn.q_proj.weight"].T).view(b, t, heads, hd).transpose(1, 2)
        k = (a @ w[p + "self_attn.k_proj.weight"].T).view(b, t, kv, hd).transpose(1, 2)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).view(b, t, kv, hd).transpose(1, 2)
        if rope == "half":
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        else:
            q, k = rotate_interleaved(q, cos, sin), rotate_interleaved(k, cos, sin)
        k, v = repeat_kv(k, heads // kv), repeat_kv(v, heads // kv)
        att = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(hd) + mask, dim=-1, dtype=torch.float32)
        o = (att @ v).transpose(1, 2).reshape(b, t, heads * hd)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        m = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = torch.nn.functional.silu(m @ w[p + "mlp.gate_proj.weight"].T)
        x = x + (gate * (m @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    h = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if c["tie_word_embeddings"] else w["lm_head.weight"]
    return h @ head.T


def greedy(c, w, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        logits = forward(c, w, torch.tensor([ids]))
        ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt):]


def synthetic_batch(seed, step, batch, vocab, seq):
    """train_gpt's synthetic global batch of `step` (tokens, targets) [batch, seq]."""
    g = torch.Generator().manual_seed((seed * 7919 + step * 104729 + 1) % 2 ** 64)
    start = torch.randint(0, vocab, (batch, 1), generator=g, dtype=torch.int64)
    stride = torch.randint(1, 9, (batch, 1), generator=g, dtype=torch.int64)
    s = (start + stride * torch.arange(seq + 1)[None, :]) % vocab
    return s[:, :seq], s[:, 1:]
