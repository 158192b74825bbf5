#!/usr/bin/env python3
"""Draws train_gpt runs from their JSONL logs (--log-jsonl) into one PNG: training and validation
loss, learning rate and throughput against the step, one colour per run, so runs overlay.

  tools/plot_run.py RUN.jsonl [LABEL=]OTHER.jsonl ... -o run.png [--title T] [--smooth N]

A log is a config record then one record per step ({"event": "step", "step", "loss",
"valid_loss" (null when not evaluated), "lr", "tokens_per_s", ...}); other JSONL with the same
fields (bench/llama's PyTorch runs) plot alike. Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import os
import sys


def read(path):
    steps = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot_run: {path}:{n}: not JSON ({e})")
            if rec.get("event", "step") == "step" and "step" in rec:
                steps.append(rec)
    if not steps:
        sys.exit(f"plot_run: {path}: no step records")
    return steps


def smooth(values, n):
    if n <= 1:
        return values
    out, acc = [], []
    for v in values:
        acc.append(v)
        if len(acc) > n:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("logs", nargs="+", help="JSONL logs, optionally LABEL=PATH")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--title", default="")
    ap.add_argument("--smooth", type=int, default=1, help="moving average of the training loss over N steps")
    a = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for spec in a.logs:
        label, path = spec.split("=", 1) if "=" in spec and not os.path.exists(spec) else (os.path.basename(spec), spec)
        steps = read(path)
        x = [r["step"] for r in steps]
        line, = axes[0].plot(x, smooth([r["loss"] for r in steps], a.smooth), label=f"{label} train", linewidth=1)
        valid = [(r["step"], r["valid_loss"]) for r in steps if r.get("valid_loss") is not None]
        if valid:
            axes[0].plot(*zip(*valid), "o--", color=line.get_color(), label=f"{label} validation", markersize=3)
        if any("lr" in r for r in steps):
            axes[1].plot(x, [r.get("lr", float("nan")) for r in steps], color=line.get_color(), label=label)
        if any("tokens_per_s" in r for r in steps):
            axes[2].plot(x, [r.get("tokens_per_s", float("nan")) for r in steps], color=line.get_color(), label=label)
    for ax, title in zip(axes, ("loss", "learning rate", "tokens/s")):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if a.title:
        fig.suptitle(a.title)
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)
    print(f"plot_run: wrote {a.output} ({len(a.logs)} run(s))")


if __name__ == "__main__":
    from interpreter import require
    require("plot_run", ["matplotlib"])
    main()
