#!/usr/bin/env python3
"""PyTorch's side of the Llama benchmark: the independent PyTorch Llama (tests/models/torch_llama.py)
trained on one GPU on the same tokens as train_gpt (tessera.data: the same global batches), from
tessera's initial weights (torch_llama.tessera_init), in bf16 autocast over fp32 weights with
torch.optim.AdamW(fused=True) (no decay on norms; decay on the table, as train_gpt's default), the
same clipping and learning-rate schedule. Eager or torch.compile(model).

  torch_llama_train.py --mode eager|compile --data PREFIX --steps N --batch B [--log FILE.jsonl]

Without a GPU it runs on the CPU in fp32 (a smoke test of the script). Writes a JSONL log like
train_gpt's (config, then one record per step: loss, lr, step_ms,
tokens_per_s, mfu, peak_mem_gib) and prints a RESULT line (bench/results.py reads it) with the
median step time of the steps after the first warm-up steps.
"""
import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "models"))
from torch_llama import Config, Llama, loss_fn, tessera_init  # noqa: E402

PRESETS = {  # the shapes of train_gpt's presets (src/models/config.cpp)
    "llama3-1b": dict(d=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=128256, seq_len=2048, tied=True,
                      theta=500000.0, scaling=dict(factor=32.0, low=1.0, high=4.0, original=8192)),
    "llama3-8b": dict(d=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256, seq_len=8192, tied=False,
                      theta=500000.0, scaling=None),
    # Not a train_gpt preset: a slice of Llama-3-70B's widths (issue 53's tensor-parallel benchmark,
    # bench/tp/slice70b.sh), 4 of its 80 blocks, an untied 32000-token vocabulary; train_gpt runs it as
    # llama3-8b with the shape flags (--hidden-size 8192 --heads 64 --kv-heads 8 --ffn 28672 ...).
    "llama70b-slice": dict(d=8192, layers=4, heads=64, kv_heads=8, ffn=28672, vocab=32000, seq_len=4096, tied=False,
                           theta=500000.0, scaling=None),
    "llama-tiny": dict(d=64, layers=4, heads=4, kv_heads=2, ffn=192, vocab=4096, seq_len=64, tied=True,
                       theta=10000.0, scaling=None),
}


def lr_at(step, lr, min_lr, warmup, total):
    """train_gpt's cosine schedule (src/optim/lr_schedule.cpp)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    t = (step - warmup) / (total - warmup)
    return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * t))


def flops_per_token(c):
    """train_gpt's count (src/models/config.cpp): 6 x (block parameters + the head) + 12 L d T."""
    hd = c.d // c.heads
    block = 2 * c.d * c.d + 2 * c.d * c.kv_heads * hd + 3 * c.d * c.ffn + 2 * c.d
    return 6.0 * (c.layers * block + c.vocab * c.d) + 12.0 * c.layers * c.d * c.seq_len


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--model", default="llama3-1b", choices=sorted(PRESETS))
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--min-lr", type=float, default=3e-5)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--warm-steps", type=int, default=5, help="steps left out of the median")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--log", default="")
    a = ap.parse_args()

    import tessera.data  # the same batches as train_gpt (the built tessera module on PYTHONPATH)

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: a smoke run, fp32
    cuda = dev.type == "cuda"
    cfg = Config(**PRESETS[a.model])
    model = Llama(cfg)
    tessera_init(model, a.seed)
    model.to(dev)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if name.endswith("norm.weight") else decay).append(p)
    groups = [{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=a.lr, fused=True) if cuda else torch.optim.AdamW(groups, lr=a.lr)
    run = torch.compile(model) if a.mode == "compile" else model
    data = tessera.data.GptData(a.data, seq_len=cfg.seq_len, seed=a.seed, split="98,2", eod_token=2)
    sampler = tessera.data.Sampler(data, a.batch, vocab=cfg.vocab)
    log = open(a.log, "w") if a.log else None
    if log:
        log.write(json.dumps({"event": "config", "system": f"pytorch-{a.mode}", "model": a.model,
                              "batch": a.batch, "seq_len": cfg.seq_len}) + "\n")
    fpt = flops_per_token(cfg)
    tokens = a.batch * cfg.seq_len
    times = []
    sync = torch.cuda.synchronize if cuda else (lambda d: None)
    peak = (lambda: torch.cuda.max_memory_allocated(dev) / 2**30) if cuda else (lambda: 0.0)
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    for step in range(a.steps):
        x, y = (t.to(dev, non_blocking=True) for t in sampler.batch(step))
        lr = lr_at(step, a.lr, a.min_lr, a.warmup, a.steps)
        for g in opt.param_groups:
            g["lr"] = lr
        sync(dev)
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext():
            loss = loss_fn(run(x), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_v = loss.item()
        sync(dev)
        ms = (time.perf_counter() - t0) * 1e3
        times.append(ms)
        rec = {"event": "step", "step": step + 1, "loss": loss_v, "lr": lr, "grad_norm": norm.item(),
               "step_ms": ms, "tokens_per_s": tokens / ms * 1e3, "mfu": tokens / ms * 1e3 * fpt / (a.peak_tflops * 1e12),
               "peak_mem_gib": peak()}
        if log:
            log.write(json.dumps(rec) + "\n")
        if step % 25 == 0 or step + 1 == a.steps:
            print(f"[pytorch-{a.mode}] step {step + 1}/{a.steps} loss {loss_v:.4f} lr {lr:.3g} {ms:.1f} ms", flush=True)
    med = statistics.median(times[a.warm_steps:]) if len(times) > a.warm_steps else statistics.median(times)
    tps = tokens / med * 1e3
    print("RESULT " + json.dumps({"system": f"pytorch-{a.mode}", "model": a.model, "gpus": 1, "batch": a.batch,
                                  "seq_len": cfg.seq_len, "step_ms": round(med, 2), "tokens_per_s": round(tps),
                                  "mfu": round(tps * fpt / (a.peak_tflops * 1e12), 4),
                                  "peak_mem_GiB": round(peak(), 2),
                                  "last_loss": round(loss_v, 4)}), flush=True)


if __name__ == "__main__":
    main()
