"""The runs' output as the writer reads it. Rank 0 prints "RESULT {json}" (bench/common/timing.h,
bench/torch_anchor.py, bench/llama/torch_llama_parallel.py, ...), possibly behind torchrun's "[defaultN]:";
train_gpt writes a JSONL log (a config record, one record per step) that from_jsonl() turns into its RESULT line.
A log LOGS/<run>.log names its rows: <run>, or <run>-<variant> for a line with a "variant" (in-process variants
of one binary); a log with several lines and no variants keeps each line's own "system"."""
import json
import os
import re
import sys

from . import schema


def strip_launcher(line):
    """A log line without its surrounding space and torchrun's "[defaultN]:" prefix (torch 1.x)."""
    return re.sub(r"^\[\w+\d*\]:", "", line.strip())


def normalise(r):
    return {schema.RENAMED.get(k, k): v for k, v in r.items()}


def read_train_jsonl(path):
    """train_gpt's JSONL log: (its config record, its step records in order); a line cut by a kill is skipped."""
    cfg, steps = {}, []
    with open(path, errors="replace") as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("event") == "config":
                cfg = r
            elif r.get("event") == "step":
                steps.append(r)
    return cfg, steps


def read_results(path):
    """Every RESULT object in the log at `path`, in the schema's keys; an unreadable line is reported and skipped."""
    found = []
    with open(path, errors="replace") as f:
        for line in f:
            line = strip_launcher(line)
            if line.startswith("RESULT "):
                try:
                    found.append(normalise(json.loads(line[len("RESULT "):])))
                except ValueError:
                    print("results.py: unreadable RESULT line in %s: %s" % (path, line), file=sys.stderr)
    return found


def load_rows(paths):
    """The rows of the logs at `paths` (missing ones skipped), by system, in the order they came."""
    rows = {}
    for path in paths:
        if not os.path.exists(path):
            continue
        run = os.path.splitext(os.path.basename(path))[0]
        found = read_results(path)
        for r in found:
            v = r.get("variant")
            if v not in (None, "base", "default"):
                system = "%s-%s" % (run, v)
            elif len(found) > 1 and "variant" not in r:
                system = r.get("system", run)
            else:
                system = run
            rows[system] = dict(r, system=system)
    return rows


def from_jsonl(path, system, warm):
    """train_gpt's JSONL log -> its RESULT object: the median step after `warm`, the fullest rank's peak; None
    (and why, on stderr) when no step came after the warm-ups."""
    cfg, steps = read_train_jsonl(path)
    timed = steps[warm:]
    if not timed:
        print("%s: %d steps, none after %d warm-ups" % (path, len(steps), warm), file=sys.stderr)
        return None
    times = sorted(s["step_ms"] for s in timed)
    med = times[len(times) // 2]
    at = min(timed, key=lambda s: abs(s["step_ms"] - med))
    return dict(system=system, mode="%sx%sx%s %s" % (cfg["dp"], cfg["pp"], cfg["tp"], cfg["dp_mode"]), gpus=cfg["world"],
                params_M=round(cfg["params"] / 1e6, 1), step_ms=round(med, 2),
                tokens_per_s=round(cfg["batch"] * cfg["seq_len"] / med * 1e3),
                mfu=at["mfu"] and round(at["mfu"] * med / at["step_ms"], 3),
                peak_mem_gib=round(max(s["peak_mem_gib"] for s in steps), 2), batch=cfg["batch"],
                seq_len=cfg["seq_len"], layers=cfg.get("layers"), micro_batches=cfg["micro_batches"],
                schedule=cfg.get("schedule"),
                sequence_parallel=cfg["sequence_parallel"], recompute=cfg.get("recompute"),
                precision=cfg.get("precision"),
                bubble_ms_est=at["bubble_ms_est"], dp_sync_ms_est=at["dp_sync_ms_est"],
                optimizer_ms=at["optimizer_ms"], last_loss=round(steps[-1]["loss"], 4),
                step_ms_all=[round(s["step_ms"], 2) for s in timed])

