#!/usr/bin/env python3
"""bench/cp/run.sh's logs -> bench/results/cp.{json,md}: one row per run <system>-<model>-<T>-<layout>.log.

A log's facts: its last "CP_RUN {json}" line (run.sh: warm-up and timed steps, recompute, exit status, seconds,
timeout); PyTorch's rows from torch_cp.py's "RESULT {json}" line, else (a run cut short) from its "STEP {json}"
lines; train_gpt's from its JSONL log beside it (<run>.jsonl: the config record, one record per step; older
logs: the RESULT line results.py from-jsonl wrote). A run cut by its timeout after two or more steps still gives
a row, from the steps after its warm-ups (after the first step where it had no more), marked partial; a run
without one is listed with a one-line reason (skipped, out of memory, the error, or where it timed out).
Derived:
  mfu         tokens/s x F / (gpus x PEAK), F = 6 (L x block parameters + V d) + 12 L d T: train_gpt's and
              torchtitan's count, attention's two matmuls counted over every (query, key) pair, forward and
              backward (src/models/config.cpp flopsPerToken); PEAK 989e12 (H100/H200 bf16 dense)
  mfu_causal  the same with 6 L d T: only the causal half that is computed
  vs_pytorch  tokens/s over PyTorch's row of the same model, length and layout
  peak_mem_gib  the largest of the phase peaks (forward and loss, backward, optimizer) of every step: the
              caching allocator's peak allocated, the fullest rank, construction excluded on both sides
              (train_gpt --breakdown's records; torch_cp.py's phases)
  overhead_s  the run's wall time less its steps: launch, model construction, sharding, exit
  results.py OUTDIR... [--results DIR] [--name cp] [--peak-tflops 989]
  results.py --summary LOG     (one line: the row or why there is none; run.sh prints it after each run)
The machine and the commands come from OUTDIR/machine.txt and commands.txt (run.sh writes them).
"""
import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import results as common  # noqa: E402  (bench/results.py: read_results, table, write, now)

# The presets' shapes (src/models/config.cpp; the PyTorch Llama's are the same, bench/llama/torch_llama_train.py).
MODELS = {"llama3-1b": dict(d=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=128256),
          "llama3-8b": dict(d=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256),
          "llama-tiny": dict(d=64, layers=4, heads=4, kv_heads=2, ffn=192, vocab=4096)}
LAYOUT_ORDER = ("cp4", "fsdp2xcp2", "cp2xtp2", "cp2")
LAYOUT_GPUS = {"cp4": 4, "fsdp2xcp2": 4, "cp2xtp2": 4, "cp2": 2}
NAME = re.compile(r"^(tessera|pytorch)-(.+)-(\d+)-([a-z0-9]+)$")
PHASES = ("mem_peak_forward_gib", "mem_peak_backward_gib", "mem_peak_optimizer_gib")
COLS = ["model", "seq_len", "layout", "system", "gpus", "tokens_per_s", "step_ms", "mfu", "mfu_causal",
        "peak_mem_gib", "vs_pytorch", "recompute", "steps", "overhead_s", "note"]


def flops_per_token(model, seq_len, causal=False):
    c = MODELS[model]
    hd = c["d"] // c["heads"]
    block = 2 * c["d"] ** 2 + 2 * c["d"] * c["kv_heads"] * hd + 3 * c["d"] * c["ffn"] + 2 * c["d"]
    attention = (6.0 if causal else 12.0) * c["layers"] * c["d"] * seq_len
    return 6.0 * (c["layers"] * block + c["vocab"] * c["d"]) + attention


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


def read_jsonl(path):
    return common.read_train_jsonl(path) if os.path.exists(path) else ({}, [])


def upper_median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def timed_steps(n, warm):
    """(first timed index, partial?) for n steps of which `warm` were meant as warm-ups; None below 2 steps."""
    if n > warm:
        return warm, False
    if n >= 2:
        return 1, True
    return None


def tessera_row(log_lines, jsonl, meta):
    cfg, steps = read_jsonl(jsonl)
    if not steps or not cfg:
        old = [common.normalise(r) for r in tagged(log_lines, "RESULT")]  # from-jsonl's line (older run.sh)
        return dict(old[-1], steps="3+%d" % len(old[-1].get("step_ms_all", []))) if old else None
    warm, planned = meta.get("warm", 3), meta.get("warm", 3) + meta.get("steps", 5)
    t = timed_steps(len(steps), warm)
    if t is None:
        return None
    first, partial = t
    partial = partial or len(steps) < planned
    times = [s["step_ms"] for s in steps[first:]]
    med = upper_median(times)
    row = dict(gpus=cfg["world"], step_ms=round(med, 2), tokens_per_s=round(cfg["batch"] * cfg["seq_len"] / med * 1e3),
               recompute=cfg.get("recompute"), last_loss=round(steps[-1]["loss"], 4),
               steps="%d+%d" % (first, len(times)), step_ms_all=[round(x, 2) for x in times],
               peak_mem_run_gib=round(max(s["peak_mem_gib"] for s in steps), 2))
    if all(k in steps[0] for k in PHASES):
        row["peak_mem_gib"] = round(max(s[k] for s in steps for k in PHASES), 2)
        for k in PHASES:
            row[k] = round(max(s[k] for s in steps[first:]), 2)
    else:  # without --breakdown: the run's peak, construction included
        row["peak_mem_gib"] = row["peak_mem_run_gib"]
        row["note"] = "peak includes construction"
    if partial:
        row["partial"] = "%d of %d steps" % (len(steps), planned)
    return row, sum(s["step_ms"] for s in steps) / 1e3


def pytorch_row(log_lines, meta):
    found = [common.normalise(r) for r in tagged(log_lines, "RESULT")]
    if found:
        r = found[-1]
        row = {k: r.get(k) for k in ("gpus", "step_ms", "tokens_per_s", "peak_mem_gib", "recompute", "last_loss",
                                     "step_ms_all", "sdpa", "torch") + PHASES if r.get(k) is not None}
        row["steps"] = "%s+%d" % (r.get("warm", 3), len(r.get("step_ms_all", [])))
        total = sum(s["step_ms"] for s in tagged(log_lines, "STEP")) / 1e3 or None
        return row, total
    steps = tagged(log_lines, "STEP")
    t = timed_steps(len(steps), meta.get("warm", 3))
    if t is None or not meta:
        return None
    first = t[0]
    times = [s["step_ms"] for s in steps[first:]]
    med = upper_median(times)
    tokens = meta["dp"] * meta["seq_len"]
    row = dict(gpus=meta["dp"] * meta["cp"] * meta["tp"], step_ms=round(med, 2), tokens_per_s=round(tokens / med * 1e3),
               peak_mem_gib=max(s["peak_mem_GiB"] for s in steps), recompute=meta.get("recompute"),
               last_loss=steps[-1].get("loss"), steps="%d+%d" % (first, len(times)),
               step_ms_all=[round(x, 2) for x in times],
               partial="%d of %d steps" % (len(steps), meta.get("warm", 3) + meta.get("steps", 5)))
    return row, sum(s["step_ms"] for s in steps) / 1e3


def first_match(lines, pattern, group=0):
    for line in lines:
        m = re.search(pattern, line)
        if m:
            return m.group(group).strip()
    return None


def clip(text, n=300):
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "..."


def reason(log_lines, meta, jsonl):
    """Why a run gave no row, in one line."""
    rc = str(meta.get("rc", "?"))
    if rc == "skipped":
        return first_match(log_lines, r"skipped: .*") or "skipped: the call's budget was spent"
    why = (first_match(log_lines, r"torch_cp\.py: FAILED on (.*)", 1)
           or first_match(log_lines, r"^train_gpt: .*")  # train_gpt's error and usage lines (info: "[tessera ...")
           or first_match(log_lines, r"torch_cp\.py: .*")
           or first_match(log_lines, r".*(out of memory|OutOfMemoryError).*"))
    if not why:  # the last exception line that is not torchrun's own summary
        errs = [x for x in log_lines if re.search(r"\w+(Error|Exception)\b", x)
                and not re.search(r"elastic|ChildFailedError|torchrun|^\s*(File|raise|return)\b", x)]
        why = errs[-1] if errs else None
    if rc in ("124", "137"):
        if jsonl is not None:
            done = len(read_jsonl(jsonl)[1])
        else:
            done = len(tagged(log_lines, "STEP"))
        planned = meta.get("warm", 0) + meta.get("steps", 0)
        where = first_match(reversed(log_lines), r"^\[torch_cp\] at (.+) \(\+[\d.]+ s\)$", 1)  # rank 0's last phase
        text = "timed out after %s s with %d of %d steps done%s" % (meta.get("limit", "?"), done, planned,
                                                                    " (in %s)" % where if where else "")
        return clip(text + ("; " + why if why else ""))
    if why:
        return clip(why)
    tail = [x for x in log_lines if x and not x.startswith("CP_RUN ")]
    return clip("exit status %s%s" % (rc, "; last line: " + tail[-1] if tail else ", no output"))


def read_run(path):
    """(row or None, reason or None) of one run's log."""
    base = path[:-4]
    name = os.path.basename(base)
    m = NAME.match(name)
    with open(path, errors="replace") as f:
        lines = [common.strip_launcher(x) for x in f]
    metas = tagged(lines, "CP_RUN")
    meta = metas[-1] if metas else {}
    system, model, seq, layout = m.group(1), m.group(2), int(m.group(3)), m.group(4)
    jsonl = base + ".jsonl" if system == "tessera" else None
    got = tessera_row(lines, jsonl, meta) if system == "tessera" else pytorch_row(lines, meta)
    if not got:
        return None, reason(lines, meta, jsonl)
    if isinstance(got, tuple):
        row, step_s = got
    else:
        row, step_s = got, None
    row = dict(row, model=model, seq_len=seq, layout=layout, system=system, run=name)
    row.setdefault("gpus", LAYOUT_GPUS.get(layout))
    if step_s is not None and meta.get("seconds") not in (None, "") and not row.get("partial"):
        row["overhead_s"] = round(float(meta["seconds"]) - step_s)
    rc = str(meta.get("rc", "0"))
    if row.get("partial"):
        cut = "timed out" if rc in ("124", "137") else "then: " + reason(lines, meta, jsonl)
        row["note"] = "; ".join(x for x in ("partial: %s (%s)" % (row["partial"], cut), row.get("note")) if x)
    elif rc not in ("0", "?"):
        row["note"] = "; ".join(x for x in ("exit status %s after its steps" % rc, row.get("note")) if x)
    return row, None


MODEL_ORDER = ("llama3-8b", "llama3-1b")  # the headline model first


def run_order(name):
    """A run's place in the table and the lists: model (8b first), longer sequences first, layout, PyTorch first."""
    m = NAME.match(name)
    system, model, seq, layout = m.group(1), m.group(2), int(m.group(3)), m.group(4)
    layouts = {k: i for i, k in enumerate(LAYOUT_ORDER)}
    return (MODEL_ORDER.index(model) if model in MODEL_ORDER else 9, model, -seq, layouts.get(layout, 99),
            system != "pytorch")


def rows_of(dirs, peak, failed):
    rows = []
    for d in dirs:
        for f in sorted(os.listdir(d)):
            m = NAME.match(f[:-4]) if f.endswith(".log") else None
            if not m or m.group(2) not in MODELS:
                continue
            row, why = read_run(os.path.join(d, f))
            failed.pop(f[:-4], None)  # a later OUTDIR's run replaces an earlier one's
            rows = [x for x in rows if x["run"] != f[:-4]]
            if row is None:
                failed[f[:-4]] = why
                continue
            model, seq = row["model"], row["seq_len"]
            for key, causal in (("mfu", False), ("mfu_causal", True)):
                row[key] = round(row["tokens_per_s"] * flops_per_token(model, seq, causal) / (row["gpus"] * peak), 3)
            rows.append(row)
    twins = {(r["model"], r["seq_len"], r["layout"]): r for r in rows if r["system"] == "pytorch"}
    for r in rows:
        twin = twins.get((r["model"], r["seq_len"], r["layout"]))
        if r["system"] == "tessera" and twin:
            r["vs_pytorch"] = round(r["tokens_per_s"] / twin["tokens_per_s"], 3)
    rows.sort(key=lambda r: run_order(r["run"]))
    return rows


def read_text(dirs, name):
    lines = []
    for d in dirs:
        p = os.path.join(d, name)
        if os.path.exists(p):
            for x in open(p):
                if x.strip() and x.strip() not in lines:  # each line once, also within one file
                    lines.append(x.strip())
    return lines


def sdpa_text(rows):
    """How PyTorch's rows chose their SDPA kernel (torch_cp.py's SDPA)."""
    kinds = sorted({r.get("sdpa") or "flash,efficient" for r in rows if r["system"] == "pytorch"}) or ["flash,efficient"]
    if kinds == ["flash,efficient"]:
        return "restricted to FlashAttention-2 and the memory-efficient kernel, as tessera's"
    return "SDPA backends: " + " / ".join(k if k != "default" else "PyTorch's own choice" for k in kinds)


def summary(path):
    row, why = read_run(path)
    if row is None:
        return "no row: " + why
    return "row: {:,} tok/s, {} ms a step, peak {} GiB, {} steps{}".format(
        row["tokens_per_s"], row["step_ms"], row.get("peak_mem_gib"), row.get("steps"),
        ", " + row["note"] if row.get("note") else "")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--summary"]:
        if len(argv) != 2:
            print("usage: results.py --summary LOG", file=sys.stderr)
            return 2
        try:
            print(summary(argv[1]))
        except Exception as e:  # noqa: BLE001  (run.sh's progress line must not stop the run)
            print("no summary: %s: %s" % (type(e).__name__, e))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--results", default=os.path.join(HERE, "..", "results"))
    ap.add_argument("--name", default="cp")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    a = ap.parse_args(argv)
    failed = {}
    rows = rows_of(a.dirs, a.peak_tflops * 1e12, failed)
    if not rows and not failed:
        print("cp/results.py: no runs in %s" % " ".join(a.dirs), file=sys.stderr)
        return 1
    machines = read_text(a.dirs, "machine.txt") or ["?"]
    doc = {"name": a.name, "date": common.now(), "machine": "; ".join(machines),
           "command": " && ".join(read_text(a.dirs, "commands.txt")) or "bench/cp/run.sh",
           "config": "bf16; one sequence per data-parallel replica; FSDP over dp x cp on both sides; K and V "
                     "all-gathered over cp, load-balanced chunks (r and 2 cp - 1 - r) on both sides; recompute as "
                     "the column says, the same on both sides; synthetic / random tokens; "
                     "the same PYTORCH_CUDA_ALLOC_CONF on both sides (the command says which)",
           "method": "warm-ups then the upper median of the timed steps (steps: warm-ups + timed), the device "
                     "synchronised around each step; peak memory = the largest phase peak (forward and loss, "
                     "backward, optimizer) of the caching allocator's allocated bytes on the fullest rank, "
                     "construction excluded; mfu = tokens/s x (6 (L block params + V d) + 12 L d T) / (gpus x %g "
                     "TFLOP/s); mfu_causal the same with 6 L d T" % a.peak_tflops,
           "notes": ["PyTorch: tests/models/torch_llama.py under torch.distributed.tensor.experimental.context_parallel "
                     "(SDPA is_causal with K and V repeated to the query heads, %s; rotate method allgather, head-tail "
                     "load balancing) and " % sdpa_text(rows) +
                     "FSDP2 fully_shard per block and the root (bf16 parameters, fp32 reduction), AdamW fused, "
                     "clipping at 1.0; the loss as torchtitan computes it (cross-entropy of the logits in float32)",
                     "train_gpt: --dp-mode fsdp --breakdown, fused kernels (its cross-entropy reads bf16 logits and "
                     "writes their gradient in place), attention per query chunk by FlashAttention-2 over the "
                     "gathered K and V",
                     "cp2xtp2 has no PyTorch row (context_parallel with DTensor TP is not run here)",
                     "partial: the run hit its timeout; its row is from the steps it finished",
                     "overhead_s: the run's wall time less its steps (launch, model construction, sharding, exit)"],
           "rows": rows}
    lines = common.table(rows, COLS) if rows else ["(no run gave a row)"]
    if failed:
        missing = sorted(failed, key=run_order)
        doc["missing"] = [dict(run=k, reason=failed[k]) for k in missing]
        broken = [k for k in missing if not failed[k].startswith("skipped")]
        skipped = [k for k in missing if failed[k].startswith("skipped")]
        if broken:
            lines += ["", "No row (the run failed or timed out):", ""] + ["- %s: %s" % (k, failed[k]) for k in broken]
        if skipped:
            lines += ["", "Not run (the call's time was spent): " + ", ".join(skipped)]
    gpus = sorted({str(r["gpus"]) for r in rows}) or ["4"]
    print(common.write(doc, a.results, "Context parallelism on %s GPUs: train_gpt --cp beside PyTorch's "
                       "context_parallel" % "/".join(gpus), [(None, lines)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
