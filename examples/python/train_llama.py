#!/usr/bin/env python3
"""Train a Llama (or GPT) from Python with tessera's trainer: train_gpt's flags, the same C++ Trainer.

usage: train_llama.py [--stop-after N] [train_gpt's flags]

    PYTHONPATH=build/python torchrun -r 1 -t 1 --standalone --nproc_per_node=4 \\
        examples/python/train_llama.py --model llama-tiny --dp 2 --tp 2 --steps 50 \\
        --data data/brown/brown_sp4096_text_document --vocab-size 4096 --split 98,2 --eod-token 2

Every flag of ``train_gpt --help`` works (layouts, zero-bubble schedules, context parallel, FP8,
Hugging Face import/export, asynchronous checkpoints), and a run equals train_gpt's step for step.
``--stop-after N`` (this script's own; default 0: the whole run, through ``fit()``) trains to step N,
saves and stops, as an interrupted run would, through the Trainer's step-by-step calls instead.
In your own program the same is

    cfg = tessera.train.Config(model="llama-tiny", tp=2, steps=50, data="...")
    tessera.train.Trainer(cfg).fit()
"""
import sys

import tessera
from tessera import train


def main(argv):
    stop_after = 0
    if "--stop-after" in argv:
        i = argv.index("--stop-after")
        stop_after = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    cfg = train.Config.from_args(argv)
    if cfg.help:
        print(__doc__.split("In your own program")[0].rstrip() + "\n\n"
              "train_gpt's flags, which this script takes (defaults in brackets; docs/settings.md):\n")
        print(train.usage())
        return 0
    tessera.init()
    trainer = train.Trainer(cfg)
    if not stop_after:
        trainer.fit()
        return 0
    trainer.restore()
    while trainer.steps_done < stop_after:
        trainer.log(trainer.step())
    trainer.save()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
