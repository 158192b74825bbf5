#!/usr/bin/env python3
"""Combines bench/llama/run.sh's logs into bench/results/llama_1gpu.{json,md} and the loss curves
llama_1gpu_loss.png: a row per run (RESULT lines: bench/result_lines.py); vs_pytorch_eager /
vs_pytorch_compile = tokens/s over those rows'; the loss curves of tessera and PyTorch eager
compared step by step (the largest and the mean absolute gap, and the gap of 20-step means);
the recompute runs as a table of batch, step time and peak memory (or out of memory).

  combine.py LOG_DIR --machine M --command C --results DIR"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from result_lines import read_results  # noqa: E402


def losses(path):
    out = {}
    if os.path.exists(path):
        for line in open(path):
            r = json.loads(line)
            if r.get("event") == "step":
                out[r["step"]] = r["loss"]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("logs")
    ap.add_argument("--machine", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--results", required=True)
    a = ap.parse_args()
    rows, recompute = [], []
    for f in sorted(os.listdir(a.logs)):
        if not f.endswith(".log"):
            continue
        system = f[:-4]
        found = read_results(os.path.join(a.logs, f))
        m = re.fullmatch(r"tessera-recompute-(\w+)-b(\d+)", system)
        if m:
            text = open(os.path.join(a.logs, f), errors="replace").read()
            r = found[-1] if found else {}
            recompute.append(dict(recompute=m.group(1), batch=int(m.group(2)), step_ms=r.get("step_ms"),
                                  tokens_per_s=r.get("tokens_per_s"), peak_mem_GiB=r.get("peak_mem_GiB"),
                                  status="ok" if found else ("out of memory" if "out of memory" in text else "failed")))
        elif found:
            rows.append(dict(found[-1], system=system))
    by = {r["system"]: r for r in rows}
    for r in rows:
        for ref in ("pytorch-eager", "pytorch-compile"):
            if ref in by and r["system"] != ref:
                r["vs_" + ref.replace("-", "_")] = round(r["tokens_per_s"] / by[ref]["tokens_per_s"], 3)
        r.pop("step_ms_all", None)
    curves = {}
    t, p = losses(os.path.join(a.logs, "tessera.jsonl")), losses(os.path.join(a.logs, "pytorch-eager.jsonl"))
    common = sorted(set(t) & set(p))
    if common:
        gaps = [abs(t[s] - p[s]) for s in common]
        worst = max(range(len(common)), key=lambda i: gaps[i])
        means = [(sum(t[s] for s in common[i:i + 20]) - sum(p[s] for s in common[i:i + 20])) / 20
                 for i in range(0, len(common) - 19, 20)]
        curves = dict(steps=len(common), max_abs_gap=round(gaps[worst], 4), at_step=common[worst],
                      mean_abs_gap=round(sum(gaps) / len(gaps), 4),
                      max_abs_gap_of_20_step_means=round(max(abs(x) for x in means), 4) if means else None,
                      tessera_first_last=[round(t[common[0]], 4), round(t[common[-1]], 4)],
                      pytorch_first_last=[round(p[common[0]], 4), round(p[common[-1]], 4)])
    out = dict(name="llama_1gpu", date=datetime.date.today().isoformat(), machine=a.machine, command=a.command,
               rows=rows, loss_curves=curves, recompute=recompute)
    os.makedirs(a.results, exist_ok=True)
    base = os.path.join(a.results, "llama_1gpu")
    with open(base + ".json", "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    cols = ["system", "batch", "step_ms", "tokens_per_s", "mfu", "peak_mem_GiB", "vs_pytorch_eager",
            "vs_pytorch_compile", "last_loss"]
    with open(base + ".md", "w") as f:
        f.write(f"# llama3-1b on one GPU: train_gpt vs the PyTorch Llama (bf16, seq 2048)\n\n{out['date']}, "
                f"{a.machine}\n\n`{a.command}`\n\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n")
        for r in rows:
            mfu = r.get("mfu", r.get("mfu_vs_989"))
            vals = {**r, "mfu": mfu, "peak_mem_GiB": r.get("peak_mem_GiB", r.get("peak_mem_gib"))}
            f.write("| " + " | ".join(str(vals.get(c, "")) for c in cols) + " |\n")
        if curves:
            f.write(f"\nLoss curves over {curves['steps']} steps (same batches, same initial weights; "
                    f"llama_1gpu_loss.png): largest gap {curves['max_abs_gap']} at step {curves['at_step']}, mean "
                    f"gap {curves['mean_abs_gap']}, largest gap of 20-step means "
                    f"{curves['max_abs_gap_of_20_step_means']}; tessera {curves['tessera_first_last']}, PyTorch "
                    f"{curves['pytorch_first_last']} (first, last).\n")
        if recompute:
            f.write("\n## Activation recompute (train_gpt, llama3-1b, seq 2048)\n\n| recompute | batch | step_ms | "
                    "tokens_per_s | peak_mem_GiB | status |\n|---|---|---|---|---|---|\n")
            for r in recompute:
                f.write(f"| {r['recompute']} | {r['batch']} | {r['step_ms'] or ''} | {r['tokens_per_s'] or ''} | "
                        f"{r['peak_mem_GiB'] or ''} | {r['status']} |\n")
    if common:
        subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "tools", "plot_run.py"),
                        f"tessera={os.path.join(a.logs, 'tessera.jsonl')}",
                        f"pytorch-eager={os.path.join(a.logs, 'pytorch-eager.jsonl')}",
                        "-o", base + "_loss.png", "--title", "llama3-1b on Brown, 1 GPU: train_gpt vs PyTorch eager"],
                       check=False)
    print(open(base + ".md").read())
    return 0 if rows or recompute else 1


if __name__ == "__main__":
    sys.exit(main())
