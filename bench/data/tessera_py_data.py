#!/usr/bin/python3
"""tessera's data layer from Python (tessera.data, the built module on PYTHONPATH): the per-step
host time of a Python training loop's batch, measured as bench/data/torch_data.py measures
PyTorch's ways; bench/data/run.sh runs it beside them.

    PYTHONPATH=BUILD/python /usr/bin/python3 bench/data/tessera_py_data.py --data PREFIX [--name LABEL]
        [--vocab V] [--seq-len 1024] [--batch 8] [--steps 1000] [--warm 50] [--repeats 5]

System tessera-python, measurement sample_read: Sampler(GptData(PREFIX, seq_len), B, vocab=V)
.batch(step), i.e. readSamples of B rows (GIL released) and the (tokens, targets) slices made
contiguous, as nanoGPT's get_batch returns x and y.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_data  # noqa: E402  (statistics and JSON lines shared with the PyTorch runner)

import tessera.data  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--name", default="")
    p.add_argument("--vocab", type=int, default=2**62)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--warm", type=int, default=50)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    args.name = args.name or args.data
    torch_data.torch.set_num_threads(1)
    data = tessera.data.GptData(args.data, args.seq_len)
    sampler = tessera.data.Sampler(data, args.batch, vocab=args.vocab)
    step = [0]

    def one():
        sampler.batch(step[0])
        step[0] += 1

    st = torch_data.time_steps(args, one, args.steps, args.warm, args.repeats)
    torch_data.report_steps(args, "tessera-python", "sample_read", st, args.steps, args.repeats)


if __name__ == "__main__":
    main()
