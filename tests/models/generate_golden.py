#!/usr/bin/env python3
"""The golden check of tessera's generation (tests/models/test_lm.cpp writes FILE): the
independent PyTorch Llama of torch_llama.py, loaded with tessera's weights by name, continues the
same prompt greedily by rerunning the whole sequence each step (no cache); its tokens must be
tessera's exactly, and each step's logits within 1e-5 of the largest magnitude (fp32, the same
operations in other orders; tessera's KV cache and grouped-query attention without repeated heads).

  generate_golden.py FILE VARIANT      (VARIANT: test_lm.cpp's goldenConfig)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_llama import Config, Llama  # noqa: E402


def config(variant):
    # test_lm.cpp's goldenConfig
    common = dict(d=64, layers=2, heads=4, ffn=96, vocab=128, seq_len=16)
    if variant == 0:
        return Config(kv_heads=2, tied=True, theta=500000.0,
                      scaling=dict(factor=4.0, low=1.0, high=4.0, original=16), **common)
    return Config(kv_heads=4, tied=False, theta=10000.0, **common)


def main(path, variant):
    d = torch.load(path)
    model = Llama(config(variant))
    model.load_tessera({k[len("param."):]: v for k, v in d.items() if k.startswith("param.")})
    seq = d["prompt"].clone()
    want, worst, failed = d["tokens"].tolist(), 0.0, False
    with torch.no_grad():
        for step, got_logits in enumerate(d["logits"]):
            logits = model(seq)[0, -1]
            rel = ((got_logits - logits).abs().max() / logits.abs().max()).item()
            worst = max(worst, rel)
            nxt = int(logits.argmax())
            if rel > 1e-5:
                print(f"MISMATCH step {step}: logits relative difference {rel:.3e} > 1e-5")
                failed = True
            if step >= len(want) or nxt != want[step]:
                print(f"MISMATCH step {step}: PyTorch picks {nxt}, tessera {want[step] if step < len(want) else None}")
                failed = True
                break
            seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
    print(f"generate golden {os.path.basename(path)}: {len(want)} tokens {want}; worst logits difference {worst:.2e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
