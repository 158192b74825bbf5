#!/usr/bin/env python3
"""Summarises bench/checkpoint/async_save.sh's three train_gpt logs (none, sync, async) into the run MODEL of
bench/results/checkpoint.{json,md} (bench/results.py's writer).

A step record's wall_s is the run's clock when the step was logged; a save runs after its step's
record, so the interval from step k's record to step k+1's holds the save after step k. Per run:
the median interval without a save (the step), and for each save the interval that holds it minus
that median (what the save cost the training, the first save apart: pinned host buffers are
allocated then). The last save (at the end of the run) is not in any interval and is left out.

  async_save.py LOG_DIR --every N --machine M --command C [--environment E] [--model M] [--results DIR]
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import results  # noqa: E402


def records(path):
    with open(path) as f:
        return [r for r in map(json.loads, f) if r.get("event") == "step"]


def summarise(name, recs, every):
    wall = {r["step"]: r["wall_s"] for r in recs}
    steps = sorted(wall)
    gaps = {s: 1e3 * (wall[s] - wall[s - 1]) for s in steps if s - 1 in wall}  # ms, interval ending at s
    saving = {s for s in gaps if every and name != "none" and (s - 1) % every == 0}
    plain = [g for s, g in gaps.items() if s not in saving and s > 5]  # past the warm-up
    step = statistics.median(plain)
    costs = [(s - 1, gaps[s] - step) for s in sorted(saving)]
    row = {"system": f"tessera-{name}", "gpus": 1, "step_ms": round(step, 1),
           "tokens_per_s": round(recs[-1].get("tokens_per_s", 0)), "peak_mem_gib": recs[-1].get("peak_mem_gib")}
    if costs:
        row["first_save_cost_ms"] = round(costs[0][1], 1)
        if len(costs) > 1:
            row["later_save_cost_ms"] = round(statistics.mean(c for _, c in costs[1:]), 1)
        row["saves_after_steps"] = [s for s, _ in costs]
        row["save_cost_in_steps"] = round(statistics.mean(c for _, c in costs[1:] or costs) / step, 2)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("logs")
    ap.add_argument("--every", type=int, required=True)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--environment", default="")
    ap.add_argument("--model", default="llama3-1b")
    ap.add_argument("--results", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results"))
    a = ap.parse_args()
    rows = []
    for name in ("none", "sync", "async"):
        path = os.path.join(a.logs, name + ".jsonl")
        if os.path.exists(path):
            rows.append(summarise(name, records(path), a.every))
    cfg = results.read_train_jsonl(os.path.join(a.logs, "none.jsonl"))[0] if rows else {}
    run = dict(run=a.model, title="Checkpoint cost on the training step: async beside sync", machine=a.machine,
               environment=a.environment, command=a.command,
               method="step_ms: median interval between step records without a save (steps > 5); a save's cost: "
                      "the interval holding it minus step_ms",
               columns=["first_save_cost_ms", "later_save_cost_ms", "save_cost_in_steps", "saves_after_steps"],
               rows=rows)
    md, problems = results.put_run(os.path.normpath(a.results), "checkpoint", run,
                                   dict(model=a.model, seq_len=cfg.get("seq_len"), precision=cfg.get("precision"),
                                        global_batch=cfg.get("batch"), gpus=1))
    print(md)
    for p in problems:
        print("async_save.py: does not validate: " + p, file=sys.stderr)
    return 1 if problems or not rows else 0

if __name__ == "__main__":
    sys.exit(main())
