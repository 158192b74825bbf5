#!/usr/bin/env python3
"""Draws train_gpt runs from their JSONL logs (--log-jsonl) into one PNG: the training and
validation loss, the learning rate and the throughput against the step, one colour per run, so
that runs overlay.

  tools/plot_run.py RUN.jsonl [LABEL=]OTHER.jsonl ... -o run.png [--title T] [--smooth N] [--lr-scale S]

Each run is named in the legends by its LABEL, else by its file name (with its folder when two
files share a name). The title names the run: its model, layout, batch, precision and learning
rate schedule from the log's config record (the first line), or the runs' names when there are
several; --title replaces it. The learning rate is drawn on a log axis when its positive values
span more than a factor of 10 (warm-up, decay: --lr-scale auto), else on a linear one.

A log is a config record then one record per step ({"event": "step", "step", "loss",
"valid_loss" (null when not evaluated), "lr", "tokens_per_s", ...}); records of other events are
ignored, and other JSONL with the same fields (bench/llama's PyTorch runs) plots alike. Needs
matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import math
import os
import sys


def read(path):
    """(config record or {}, step records) of one log."""
    steps, config = [], {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot_run: {path}:{n}: not JSON ({e})")
            if rec.get("event") == "config" and not config:
                config = rec
            elif rec.get("event", "step") == "step" and "step" in rec:
                steps.append(rec)
    if not steps:
        sys.exit(f"plot_run: {path}: no step records")
    return config, steps


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


def runs_of(specs):
    """[(name, path)]: LABEL=PATH keeps LABEL; else the file's name without .jsonl, with its
    folder when two runs would share a name."""
    pairs = [spec.split("=", 1) if "=" in spec and not os.path.exists(spec) else (None, spec) for spec in specs]
    stems = [os.path.splitext(os.path.basename(p))[0] for _, p in pairs]
    runs = []
    for (label, path), stem in zip(pairs, stems):
        if label is None:
            folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
            label = f"{folder}/{stem}" if stems.count(stem) > 1 else stem
        runs.append((label, path))
    return runs


def describe(config):
    """One run's config record in a line: model, layout, batch, precision, LR schedule."""
    if not config:
        return ""
    model = config.get("model", "")
    model = model.split(",")[0] if isinstance(model, str) else str(model)
    if config.get("params"):
        model += f" ({config['params'] / 1e6:.1f} M parameters)"
    layout = "dp {} x pp {} x tp {}".format(config.get("dp", "?"), config.get("pp", "?"), config.get("tp", "?"))
    if config.get("dp_mode"):
        layout += f" ({config['dp_mode']})"
    parts = [model, layout]
    if config.get("batch") and config.get("seq_len"):
        parts.append(f"batch {config['batch']} x T {config['seq_len']}")
    parts += [str(config[k]) for k in ("precision", "lr") if config.get(k)]
    return ", ".join(p for p in parts if p)


def lr_is_log(values, scale):
    if scale != "auto":
        return scale == "log"
    pos = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return len(pos) > 1 and max(pos) > 10 * min(pos)


def draw(runs, title="", smooth_n=1, lr_scale="auto"):
    """The figure of runs [(name, config, steps)]."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    all_lr, one = [], len(runs) == 1
    for name, _, steps in runs:
        x = [r["step"] for r in steps]
        prefix = "" if one else f"{name}: "
        line, = axes[0].plot(x, smooth([r["loss"] for r in steps], smooth_n), linewidth=1,
                             label=f"{prefix}training loss" + (f" (mean of {smooth_n} steps)" if smooth_n > 1 else ""))
        valid = [(r["step"], r["valid_loss"]) for r in steps if r.get("valid_loss") is not None]
        if valid:
            axes[0].plot(*zip(*valid), "o--", color=line.get_color(), label=f"{prefix}validation loss", markersize=3)
        if any("lr" in r for r in steps):
            lr = [r.get("lr", float("nan")) for r in steps]
            all_lr += lr
            axes[1].plot(x, lr, color=line.get_color(), label=f"{prefix}learning rate" if one else name)
        if any("tokens_per_s" in r for r in steps):
            axes[2].plot(x, [r.get("tokens_per_s", float("nan")) for r in steps], color=line.get_color(),
                         label=f"{prefix}tokens/s" if one else name)
    log_lr = lr_is_log(all_lr, lr_scale)
    if log_lr:
        axes[1].set_yscale("log")
    for ax, what in zip(axes, ("loss", "learning rate" + (" (log scale)" if log_lr else ""), "tokens/s")):
        ax.set_title(what)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    if not title:
        if one:
            title = runs[0][0] + (f"\n{describe(runs[0][1])}" if runs[0][1] else "")
        else:
            title = f"{len(runs)} runs: " + ", ".join(name for name, _, _ in runs)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(prog="plot_run.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+", metavar="[LABEL=]LOG.jsonl", help="JSONL logs of train_gpt runs")
    ap.add_argument("-o", "--output", required=True, help="the PNG to write")
    ap.add_argument("--title", default="", help="the figure's title (default: the run, as above)")
    ap.add_argument("--smooth", type=int, default=1,
                    help="moving average of the training loss over N steps (default 1: none)")
    ap.add_argument("--lr-scale", choices=("auto", "log", "linear"), default="auto",
                    help="the learning rate's axis (default auto: log when it spans more than 10x)")
    a = ap.parse_args(argv)
    runs = [(name, *read(path)) for name, path in runs_of(a.logs)]
    fig = draw(runs, a.title, a.smooth, a.lr_scale)
    fig.savefig(a.output, dpi=110)
    print(f"plot_run: wrote {a.output} ({len(runs)} run(s))")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from interpreter import require
    if not {"-h", "--help"} & set(sys.argv[1:]):
        require("plot_run", ["matplotlib"])
    main()
