#!/usr/bin/env python3
"""PyTorch's side of the benchmarks on the CPU: bench/torch_anchor.py's GPT built from tessera's initial
weights (GPT(seed=SEED)) on tessera's first batch (first_batch), its loss before any update, printed with
6 decimals. bench_smoke.sh compares it with tessera_bench_ddp single's first_loss at the same D, L, V, T, B
(read from the environment by torch_anchor): the two benchmark models are the same function of the same
weights. fp32 on the CPU (torch < 2 included: torch_anchor's causal_attention)."""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from torch_anchor import GPT, SEED, first_batch  # noqa: E402


def main():
    torch.set_num_threads(1)
    model = GPT(seed=SEED)
    x, y = first_batch(torch.device("cpu"))
    with torch.no_grad():
        loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
    print("%.6f" % loss.item())


if __name__ == "__main__":
    main()
