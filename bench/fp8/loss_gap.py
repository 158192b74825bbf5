#!/usr/bin/env python3
"""The largest gap between a run without FP8 and runs with it (bench/fp8/loss_gap.sh).

  loss_gap.py OUT_PREFIX off=OFF.jsonl RECIPE=RUN.jsonl ... [--command TEXT] [--window N]

Writes OUT_PREFIX.json and OUT_PREFIX.md beside the runs' logs: per recipe, the largest gap of the training
loss over every step (raw, and of the N-step moving average, which shows a drift rather than one batch's
noise), where it was, the final losses and the validation losses at each evaluation; each row also carries
bench/results' row schema (system, model, layout, gpus, seq_len, global_batch, precision from the run's
config record), so `bench/results.py add fp8 OUT_PREFIX.json --kind loss ...` files it (loss_gap.sh does)."""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import plot_run  # noqa: E402
import results  # noqa: E402  (bench/results.py: read_train_jsonl)


def steps(path):
    """The step records of a train_gpt JSONL log, by step (tools/plot_run.py's reader)."""
    _, recs = plot_run.read(path)  # (config, step records)
    return {rec["step"]: rec for rec in recs}


def moving(xs, n):
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= n:
            acc -= xs[i - n]
        out.append(acc / min(i + 1, n))
    return out


def schema_fields(path, recipe):
    """The row schema's fields of a run, from its JSONL config record (bench/results_lib/schema.py)."""
    cfg = results.read_train_jsonl(path)[0]
    dp, pp, tp = cfg.get("dp", 1), cfg.get("pp", 1), cfg.get("tp", 1)
    layout = " x ".join(f"{k} {n}" for k, n in (("ddp", dp), ("pp", pp), ("tp", tp)) if n > 1) or "single"
    return dict(system="tessera-fp8-" + recipe, model=cfg.get("model"), layout=layout, gpus=cfg.get("world"),
                seq_len=cfg.get("seq_len"), global_batch=cfg.get("batch"),
                precision="%s + fp8 %s" % (cfg.get("precision"), recipe))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("prefix")
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--command", default="")
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--note", action="append", default=[], help="a line for the table's notes (repeatable)")
    a = ap.parse_args()
    runs = dict(r.split("=", 1) for r in a.runs)
    base = steps(runs.pop("off"))
    keys = sorted(base)
    bl = [base[s]["loss"] for s in keys]
    rows = []
    for name, path in runs.items():
        got = steps(path)
        missing = [s for s in keys if s not in got]
        if missing:
            raise SystemExit(f"loss_gap: {path} lacks steps {missing[:5]}...")
        gl = [got[s]["loss"] for s in keys]
        gaps = [g - b for g, b in zip(gl, bl)]
        sm = [g - b for g, b in zip(moving(gl, a.window), moving(bl, a.window))]
        worst = max(range(len(gaps)), key=lambda i: abs(gaps[i]))
        worst_sm = max(range(len(sm)), key=lambda i: abs(sm[i]))
        valid = [(s, base[s]["valid_loss"], got[s]["valid_loss"]) for s in keys if base[s].get("valid_loss") is not None]
        rows.append({
            **schema_fields(path, name), "recipe": name, "steps": len(keys),
            "largest_gap": gaps[worst], "largest_gap_step": keys[worst],
            "largest_smoothed_gap": sm[worst_sm], "largest_smoothed_gap_step": keys[worst_sm],
            "final_loss_off": bl[-1], "final_loss": gl[-1],
            "final_smoothed_gap": sm[-1], "final_valid_gap": valid[-1][2] - valid[-1][1] if valid else None,
            "valid": [{"step": s, "off": v0, "fp8": v1, "gap": v1 - v0} for s, v0, v1 in valid],
            "fp8_values_last_step": got[keys[-1]].get("fp8_values"),
            "fp8_underflows_last_step": got[keys[-1]].get("fp8_underflows"),
            "fp8_saturated_total": sum(got[s].get("fp8_saturated", 0) for s in keys),
        })
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = {"date": datetime.date.today().isoformat(), "commit": commit, "machine": platform.node(),
            "command": a.command, "window": a.window, "notes": a.note}
    with open(a.prefix + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    lines = [f"# FP8 against no FP8: {a.prefix.split('/')[-1]}", "",
             f"{meta['date']}, commit {commit}, `{a.command}`", "",
             f"| recipe | steps | largest gap (step) | largest {a.window}-step mean gap (step) | final loss off / fp8 |"
             " final valid gap | fp8 values, underflows (last step) | saturated (all steps) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        v = r["valid"][-1]["gap"] if r["valid"] else float("nan")
        lines.append(f"| {r['recipe']} | {r['steps']} | {r['largest_gap']:+.4f} ({r['largest_gap_step']}) | "
                     f"{r['largest_smoothed_gap']:+.4f} ({r['largest_smoothed_gap_step']}) | "
                     f"{r['final_loss_off']:.4f} / {r['final_loss']:.4f} | {v:+.4f} | "
                     f"{r['fp8_values_last_step']}, {r['fp8_underflows_last_step']} | {r['fp8_saturated_total']} |")
    if a.note:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in a.note]
    with open(a.prefix + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
