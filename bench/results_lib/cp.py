"""Context parallelism (bench/cp/run.sh): one row per run log <system>-<model>-<T>-<layout>.log in the output
directories. A log's facts: its last "CP_RUN {json}" line (run.sh: warm-up and timed steps, recompute, exit status,
seconds, timeout); PyTorch's row from torch_cp.py's "RESULT {json}" line, else (a run cut short) from its "STEP
{json}" lines; train_gpt's from its JSONL log beside it (<run>.jsonl). A run cut by its timeout after two or more
steps still gives a row from the steps after its warm-ups, marked partial; a run without one is listed under
"missing" with a one-line reason. Derived: mfu (schema.flops_per_token: attention over every (query, key) pair)
and mfu_causal (only the causal half), vs_pytorch (over PyTorch's row of the same model, length and layout),
peak_mem_gib (the largest phase peak of every step, construction excluded), overhead_s (the run's wall time
less its steps). summary(LOG): one line, the row or why there is none (run.sh prints it after each run)."""
import json
import os
import re

from . import logs, schema, suite

LAYOUTS = {"cp4": ("cp 4", 4), "fsdp2xcp2": ("fsdp 2 x cp 2", 4), "cp2xtp2": ("cp 2 x tp 2", 4), "cp2": ("cp 2", 2)}
NAME = re.compile(r"^(tessera|pytorch)-(.+)-(\d+)-([a-z0-9]+)$")
PHASES = ("mem_peak_forward_gib", "mem_peak_backward_gib", "mem_peak_optimizer_gib")
MODEL_ORDER = ("llama3-8b", "llama3-1b")  # the headline model first
COLUMNS = ["mfu_causal", "vs_pytorch", "recompute", "steps", "overhead_s", "note"]


def tagged(lines, tag):
    """The JSON objects of the lines "TAG {json}", in order (an unreadable one skipped)."""
    out = []
    for line in lines:
        if line.startswith(tag + " "):
            try:
                out.append(json.loads(line[len(tag) + 1:]))
            except ValueError:
                pass
    return out


def timed_row(times, first, gpus, tokens, **extra):
    med = sorted(times)[len(times) // 2]  # the upper median
    return dict(gpus=gpus, step_ms=round(med, 2), tokens_per_s=round(tokens / med * 1e3),
                steps="%d+%d" % (first, len(times)), step_ms_all=[round(x, 2) for x in times], **extra)


def first_timed(n, warm):
    """(first timed index, partial?) for n steps of which `warm` were warm-ups; None below 2 steps."""
    return (warm, False) if n > warm else (1, True) if n >= 2 else None


def tessera_row(jsonl, meta):
    cfg, steps = logs.read_train_jsonl(jsonl) if os.path.exists(jsonl) else ({}, [])
    warm, planned = meta.get("warm", 3), meta.get("warm", 3) + meta.get("steps", 5)
    t = first_timed(len(steps), warm) if cfg else None
    if t is None:
        return None
    first, partial = t
    row = timed_row([s["step_ms"] for s in steps[first:]], first, cfg["world"], cfg["batch"] * cfg["seq_len"],
                    recompute=cfg.get("recompute"), precision=cfg.get("precision"), last_loss=round(steps[-1]["loss"], 4),
                    peak_mem_run_gib=round(max(s["peak_mem_gib"] for s in steps), 2))
    if all(k in steps[0] for k in PHASES):
        row["peak_mem_gib"] = round(max(s[k] for s in steps for k in PHASES), 2)
        row.update({k: round(max(s[k] for s in steps[first:]), 2) for k in PHASES})
    else:  # without --breakdown: the run's peak, construction included
        row.update(peak_mem_gib=row["peak_mem_run_gib"], note="peak includes construction")
    if partial or len(steps) < planned:
        row["partial"] = "%d of %d steps" % (len(steps), planned)
    return row, sum(s["step_ms"] for s in steps) / 1e3


def pytorch_row(lines, meta):
    found = [logs.normalise(r) for r in tagged(lines, "RESULT")]
    steps = tagged(lines, "STEP")
    if found:
        r = found[-1]
        row = {k: r[k] for k in ("gpus", "step_ms", "tokens_per_s", "peak_mem_gib", "recompute", "last_loss",
                                 "step_ms_all", "sdpa", "torch") + PHASES if r.get(k) is not None}
        row["steps"] = "%s+%d" % (r.get("warm", 3), len(r.get("step_ms_all", [])))
        return row, sum(s["step_ms"] for s in steps) / 1e3 or None
    t = first_timed(len(steps), meta.get("warm", 3)) if meta else None
    if t is None:
        return None
    row = timed_row([s["step_ms"] for s in steps[t[0]:]], t[0], meta["dp"] * meta["cp"] * meta["tp"],
                    meta["dp"] * meta["seq_len"], peak_mem_gib=max(s["peak_mem_GiB"] for s in steps),
                    recompute=meta.get("recompute"), last_loss=steps[-1].get("loss"),
                    partial="%d of %d steps" % (len(steps), meta.get("warm", 3) + meta.get("steps", 5)))
    return row, sum(s["step_ms"] for s in steps) / 1e3


def first_match(lines, pattern, group=0):
    return next((m.group(group).strip() for m in (re.search(pattern, x) for x in lines) if m), None)


def clip(text, n=300):
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "..."


def reason(lines, meta, jsonl):
    """Why a run gave no row, in one line."""
    rc = str(meta.get("rc", "?"))
    if rc == "skipped":
        return first_match(lines, r"skipped: .*") or "skipped: its budget was spent"
    why = (first_match(lines, r"torch_cp\.py: FAILED on (.*)", 1) or first_match(lines, r"^train_gpt: .*")
           or first_match(lines, r"torch_cp\.py: .*") or first_match(lines, r".*(out of memory|OutOfMemoryError).*"))
    if not why:  # the last exception line that is not torchrun's own summary
        errs = [x for x in lines if re.search(r"\w+(Error|Exception)\b", x)
                and not re.search(r"elastic|ChildFailedError|torchrun|^\s*(File|raise|return)\b", x)]
        why = errs[-1] if errs else None
    if rc in ("124", "137"):
        done = len(logs.read_train_jsonl(jsonl)[1]) if jsonl and os.path.exists(jsonl) else len(tagged(lines, "STEP"))
        where = first_match(reversed(lines), r"^\[torch_cp\] at (.+) \(\+[\d.]+ s\)$", 1)  # rank 0's last phase
        planned = meta.get("warm", 0) + meta.get("steps", 0)
        text = "timed out after %s s with %d of %d steps done%s" % (meta.get("limit", "?"), done, planned,
                                                                    " (in %s)" % where if where else "")
        return clip(text + ("; " + why if why else ""))
    if why:
        return clip(why)
    tail = [x for x in lines if x and not x.startswith("CP_RUN ")]
    return clip("exit status %s%s" % (rc, "; last line: " + tail[-1] if tail else ", no output"))


def read_run(path):
    """(row or None, reason or None) of one run's log."""
    base, name = path[:-4], os.path.basename(path[:-4])
    system, model, seq, layout = NAME.match(name).groups()
    with open(path, errors="replace") as f:
        lines = [logs.strip_launcher(x) for x in f]
    metas = tagged(lines, "CP_RUN")
    meta = metas[-1] if metas else {}
    jsonl = base + ".jsonl" if system == "tessera" else None
    got = tessera_row(jsonl, meta) if system == "tessera" else pytorch_row(lines, meta)
    if not got:
        return None, reason(lines, meta, jsonl)
    row, step_s = got
    words, gpus = LAYOUTS.get(layout, (layout, None))
    row = dict(row, model=model, seq_len=int(seq), layout=words, cp_layout=layout, system=system, run=name)
    row.setdefault("gpus", gpus)
    if step_s is not None and meta.get("seconds") not in (None, "") and not row.get("partial"):
        row["overhead_s"] = round(float(meta["seconds"]) - step_s)
    rc = str(meta.get("rc", "0"))
    if row.get("partial"):
        cut = "timed out" if rc in ("124", "137") else "then: " + reason(lines, meta, jsonl)
        row["note"] = "; ".join(x for x in ("partial: %s (%s)" % (row["partial"], cut), row.get("note")) if x)
    elif rc not in ("0", "?"):
        row["note"] = "; ".join(x for x in ("exit status %s after its steps" % rc, row.get("note")) if x)
    return row, None


def run_order(name):
    """A run's place: model (8b first), longer sequences first, layout, PyTorch first."""
    system, model, seq, layout = NAME.match(name).groups()
    return (MODEL_ORDER.index(model) if model in MODEL_ORDER else 9, model, -int(seq), list(LAYOUTS).index(layout)
            if layout in LAYOUTS else 99, system != "pytorch")


def rows_of(dirs, failed):
    rows = {}
    for d in dirs:  # a later directory's run replaces an earlier one's
        for f in sorted(os.listdir(d)):
            m = NAME.match(f[:-4]) if f.endswith(".log") else None
            if not m or m.group(2) not in schema.LLAMA_SHAPES:
                continue
            row, why = read_run(os.path.join(d, f))
            rows.pop(f[:-4], None)
            failed.pop(f[:-4], None)
            if row is None:
                failed[f[:-4]] = why
                continue
            for key, causal in (("mfu", False), ("mfu_causal", True)):
                fpt = schema.flops_per_token(row["model"], row["seq_len"], causal)
                row[key] = round(row["tokens_per_s"] * fpt / (row["gpus"] * schema.PEAK_FLOPS), 3)
            rows[f[:-4]] = row
    twins = {(r["model"], r["seq_len"], r["layout"]): r for r in rows.values() if r["system"] == "pytorch"}
    for r in rows.values():
        twin = twins.get((r["model"], r["seq_len"], r["layout"]))
        if r["system"] == "tessera" and twin:
            r["vs_pytorch"] = round(r["tokens_per_s"] / twin["tokens_per_s"], 3)
    return sorted(rows.values(), key=lambda r: run_order(r["run"]))


def read_text(dirs, name):
    lines = []
    for d in dirs:
        p = os.path.join(d, name)
        for x in open(p) if os.path.exists(p) else []:
            if x.strip() and x.strip() not in lines:  # each line once, also within one file
                lines.append(x.strip())
    return lines


def summary(path):
    row, why = read_run(path)
    if row is None:
        return "no row: " + why
    return "row: {:,} tok/s, {} ms a step, peak {} GiB, {} steps{}".format(
        row["tokens_per_s"], row["step_ms"], row.get("peak_mem_gib"), row.get("steps"),
        ", " + row["note"] if row.get("note") else "")


def command(a):
    failed = {}
    rows = rows_of(a.dirs, failed)
    if not rows and not failed:
        print("results.py cp: no runs in %s" % " ".join(a.dirs))
        return 1
    layouts = sorted({r["cp_layout"] for r in rows}, key=lambda x: list(LAYOUTS).index(x) if x in LAYOUTS else 99)
    run = dict(run=a.run or "-".join(layouts) or "cp", title=a.title or "Context parallelism: train_gpt --cp beside "
               "PyTorch's context_parallel", machine=a.machine or "; ".join(read_text(a.dirs, "machine.txt")) or "?",
               environment=a.environment, command=a.command or " && ".join(read_text(a.dirs, "commands.txt")),
               config=a.config or "bf16; one sequence per data-parallel replica; FSDP over dp x cp on both sides; K "
               "and V all-gathered over cp, load-balanced chunks (r and 2 cp - 1 - r) on both sides; recompute as the "
               "column says, the same on both sides; synthetic / random tokens",
               method=a.method or "warm-ups then the upper median of the timed steps (steps: warm-ups + timed), the "
               "device synchronised around each step; peak memory = the largest phase peak (forward and loss, "
               "backward, optimizer) on the fullest rank, construction excluded; mfu_causal counts 6 L d T for "
               "attention (the causal half)", columns=COLUMNS, rows=rows, notes=a.note)
    if failed:
        run["missing"] = [dict(run=k, reason=failed[k]) for k in sorted(failed, key=run_order)]
    md, problems = suite.put_run(a.results, a.suite or "cp", run, dict(precision=a.precision))
    print(md)
    return problems
