#!/usr/bin/env python3
"""The golden check of tessera's Llama (tests/models/test_lm.cpp writes FILE): the independent
PyTorch Llama of torch_llama.py, loaded with tessera's weights by name and fed the same batch,
must give the same logits, loss and every parameter gradient within fp32 tolerance. Also checks
that torch_llama.tessera_init (the PyTorch benchmark's initialisation) draws exactly tessera's
initial weights.

  llama_golden.py FILE

Tolerance: both compute in float32 with the same operations in other orders (fused q/k/v and
w1/w3 GEMMs, the vocab-parallel loss's own softmax); each value is within a few ulps of the
largest term it sums. Relative to the largest magnitude of each tensor: 1e-5 for logits and
loss, 1e-4 for gradients (longer chains of sums). A wrong rotary layout, GQA head mapping,
scaling or tie moves them by 1e-2 or more."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_llama import Config, Llama, loss_fn, tessera_init  # noqa: E402


def main(path):
    d = torch.load(path)
    c = d["config"].tolist()
    scaling = dict(factor=c[10], low=c[11], high=c[12], original=c[13]) if c[9] else None
    cfg = Config(d=int(c[0]), layers=int(c[1]), heads=int(c[2]), kv_heads=int(c[3]), ffn=int(c[4]),
                 vocab=int(c[5]), seq_len=int(c[6]), tied=bool(c[7]), theta=c[8], scaling=scaling, eps=c[14])
    model = Llama(cfg)
    tessera_init(model, 11)  # the seed test_lm.cpp gives: the replica of tessera's initialisation
    given = {k[len("param."):]: v for k, v in d.items() if k.startswith("param.")}
    for name, p in model.named_parameters():
        if not torch.equal(p.detach(), given[name]):
            print(f"MISMATCH: torch_llama.tessera_init draws {name} otherwise than tessera")
            return 1
    model.load_tessera(given)
    logits = model(d["tokens"])
    loss = loss_fn(logits, d["targets"])
    loss.backward()
    worst, failed = [], False

    def check(name, got, want, rtol):
        nonlocal failed
        scale = want.abs().max().item()
        diff = (got - want).abs().max().item()
        rel = diff / max(scale, 1e-30)
        worst.append((rel, name))
        if not rel <= rtol:
            print(f"MISMATCH {name}: max |diff| {diff:.3e} over max |value| {scale:.3e} (relative {rel:.3e} > {rtol})")
            failed = True

    check("logits", d["logits"], logits.detach(), 1e-5)
    check("loss", d["loss"].reshape(()), loss.detach(), 1e-5)
    grads = dict(model.named_parameters())
    n = 0
    for key, g in d.items():
        if key.startswith("grad."):
            name = key[len("grad."):]
            check(f"grad {name}", g, grads[name].grad, 1e-4)
            n += 1
    if n != len(grads):
        print(f"MISMATCH: {n} gradients written by tessera, the model has {len(grads)} parameters")
        failed = True
    worst.sort(reverse=True)
    print(f"golden {os.path.basename(path)}: loss {loss.item():.6f}; {n} gradients; worst relative differences: "
          + ", ".join(f"{name} {rel:.2e}" for rel, name in worst[:4]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
