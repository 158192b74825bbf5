#!/usr/bin/env python3
"""The one format of bench/results and the one writer every benchmark runner uses.

bench/results/<name>.json:
  {"name", "date" ("YYYY-MM-DD HH:MM UTC"), "machine", "command", "config"?, "method"?, "notes"?: [...],
   "rows": [...], ...members of one benchmark (e.g. llama's "loss_curves")}
A training row (GPT and Llama benchmarks: ddp, tp, pp, fsdp, nocomm, emulated, pp_emulated, train_gpt_*,
llama_1gpu, data_gpu):
  {"system": "pytorch-ddp" | "tessera-ddp" | ..., "gpus", "tokens_per_s", "step_ms", "scaling", "mfu",
   "peak_mem_gib", ...}
  scaling       tokens/s over (gpus x the tokens/s of the row's 1-GPU reference in the same run): the
                same system's single-GPU row ("<first word>-single" unless --reference says otherwise)
  mfu           tokens/s x FLOPs per token (src/models flopsPerToken: 6 N + 12 L d T) / (gpus x 989e12)
  peak_mem_gib  the CUDA caching allocator's peak of allocated memory, the fullest rank
  overhead_ms   (rows on more than one GPU) step_ms minus the reference's step_ms scaled to the row's
                tokens per GPU per step: exposed communication and any other cost of splitting
  hidden_comm_fraction  (rows with allreduce_ms) 1 - overhead_ms / allreduce_ms, clamped to [0, 1]
  scaled_against, scaling_vs_pytorch_single, vs_<system>, vs_pytorch, vs_compiled: the reference, the same over
                pytorch-single, tokens/s over another row's, over PyTorch's row of the same layout (eager, compiled)
Collectives rows: {"system": "pytorch-nccl" | "tessera-nccl", "op", "size_mib", "busbw_gbs",
"busbw_ratio" (tessera's over PyTorch's for the same op and size)}. Data rows: {"system", "dataset",
"measurement", "us_mean", "us_p50", "us_p99", "tokens_per_s", ...} (host time and read rates).
<name>.md beside it: a title, the header members as a list, the rows as tables, the notes.

The runs' output: rank 0 prints "RESULT {json}" (bench/common/timing.h, bench/torch_anchor.py,
bench/ddp/torch_ddp.py, ...), possibly behind torchrun's "[defaultN]:". A log LOGS/<run>.log names its
rows: <run>, or <run>-<variant> for a line with a "variant" (in-process variants of one binary); a log
with several lines and no variants keeps each line's own "system" (tessera_bench_pp --emulate).

  results.py gpt LOG... --name NAME --machine M --command C [--reference PREFIX=SYSTEM]... [--versus SYSTEM]...
  results.py from-jsonl LOG.jsonl SYSTEM [WARM]     (train_gpt's JSONL log -> its RESULT line)
  results.py collectives --torch LOG... --tessera LOG... --machine M --command C
  results.py data LOG.jsonl... (--check SYSTEM:MEASUREMENT,... | --datasets F --machine M --command C)
  results.py llama LOG_DIR --machine M --command C
Common options: --results DIR (default bench/results), --title, --config, --method, --note (repeatable).
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CORE = ["system", "gpus", "batch", "tokens_per_s", "step_ms", "scaling", "mfu", "peak_mem_gib"]
# The anchors' RESULT keys (bench/torch_anchor.py, a copy of theirs) -> this format's.
RENAMED = {"world": "gpus", "mfu_vs_989": "mfu", "peak_mem_GiB": "peak_mem_gib"}
METHOD = ("3 warm-ups then the median of STEPS steps, the device synchronised around each step; peak memory = "
          "max allocated by the caching allocator (the fullest rank)")


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def normalise(r):
    return {RENAMED.get(k, k): v for k, v in r.items()}


def strip_launcher(line):
    """A log line without its surrounding space and torchrun's "[defaultN]:" prefix (torch 1.x)."""
    return re.sub(r"^\[\w+\d*\]:", "", line.strip())


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
    """Every RESULT object in the log at `path`, in this format's keys; an unreadable line is reported and skipped."""
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


def per_gpu_tokens(r):
    return r["tokens_per_s"] * r["step_ms"] / 1e3 / r["gpus"]


def reference(row, rows, refs):
    """The 1-GPU row `row` is scaled against (None when that row did not run)."""
    system = row["system"]
    ref = next((target for prefix, target in refs if system.startswith(prefix)), system.split("-")[0] + "-single")
    # A variant whose linears sum their weight gradients in the GEMM against the same model code on one GPU.
    if row["gpus"] > 1 and "fused" in str(row.get("variant") or "").split("+") and ref + "-fused" in rows:
        ref += "-fused"
    return rows.get(ref)


def pytorch_twin(system, rows, prefixes, twin="pytorch-"):
    """PyTorch's row of the same layout: for a row named <prefix><layout>, <twin><layout> (pytorch-<layout>;
    pytorch-compiled-<layout> for the compiled anchor) or, the layout's last "-" parts dropped one by one,
    the longest such PyTorch row (tessera-train-tp-sp -> pytorch-tp)."""
    for prefix in prefixes:
        if system.startswith(prefix):
            parts = system[len(prefix):].split("-")
            for n in range(len(parts), 0, -1):
                twin_row = rows.get(twin + "-".join(parts[:n]))
                if twin_row:
                    return twin_row
    return None


def derive(rows, refs=(), versus=(), layouts=()):
    """Adds scaling, overhead_ms, hidden_comm_fraction, scaling_vs_pytorch_single, vs_<system> and
    (rows named by a prefix in `layouts`) vs_pytorch and vs_compiled: tokens/s over pytorch_twin's, eager
    (pytorch-<layout>) and compiled (pytorch-compiled-<layout>), where that row ran."""
    refs = sorted(refs, key=lambda pt: -len(pt[0]))
    ps = rows.get("pytorch-single")
    for r in rows.values():
        one = reference(r, rows, refs)
        if one:
            r["scaled_against"] = one["system"]
            r["scaling"] = round(r["tokens_per_s"] / (r["gpus"] * one["tokens_per_s"]), 3)
            if r["gpus"] > 1:
                ideal = one["step_ms"] * per_gpu_tokens(r) / per_gpu_tokens(one)
                r["overhead_ms"] = round(r["step_ms"] - ideal, 2)
                if r.get("allreduce_ms"):
                    r["hidden_comm_fraction"] = round(min(1.0, max(0.0, 1 - r["overhead_ms"] / r["allreduce_ms"])), 3)
        if ps:
            r["scaling_vs_pytorch_single"] = round(r["tokens_per_s"] / (r["gpus"] * ps["tokens_per_s"]), 3)
        for v in versus:
            if v in rows and v != r["system"]:
                r["vs_" + v.replace("-", "_")] = round(r["tokens_per_s"] / rows[v]["tokens_per_s"], 3)
        twin = pytorch_twin(r["system"], rows, layouts)
        if twin:
            r["vs_pytorch"] = round(r["tokens_per_s"] / twin["tokens_per_s"], 3)
        compiled = pytorch_twin(r["system"], rows, layouts, twin="pytorch-compiled-")
        if compiled:
            r["vs_compiled"] = round(r["tokens_per_s"] / compiled["tokens_per_s"], 3)


def cell(v, col):
    if v is None:
        return "—"
    if isinstance(v, list):
        return ", ".join(str(x) for x in v)
    if col == "tokens_per_s" and isinstance(v, (int, float)):
        return "{:,.0f}".format(v)
    return str(v)


def table(rows, cols):
    """A Markdown table of `rows` (dicts) over `cols`; a missing member is "—"."""
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(cell(r.get(c), c) for c in cols) + " |" for r in rows]
    return out


def write(doc, results, title, sections, header=()):
    """Writes <results>/<doc["name"]>.json and .md: the title, the header members, `header` lines, then
    `sections` ([(heading or None, markdown lines)]) and the notes. Returns the Markdown."""
    os.makedirs(results, exist_ok=True)
    base = os.path.join(results, doc["name"])
    with open(base + ".json", "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    md = ["# " + title, ""]
    md += ["- %s: %s" % (k, "`%s`" % doc[k] if k == "command" else doc[k])
           for k in ("date", "machine", "command", "config", "method") if doc.get(k)]
    md += ["- " + h for h in header]
    for heading, lines in sections:
        md += [""] + (["## " + heading, ""] if heading else []) + lines
    if doc.get("notes"):
        md += ["", "## Notes", ""] + ["- " + n for n in doc["notes"]]
    text = "\n".join(md) + "\n"
    with open(base + ".md", "w") as f:
        f.write(text)
    return text


def new_doc(a, name, rows, **extra):
    doc = {"name": name, "date": now(), "machine": a.machine, "command": a.command}
    if a.config:
        doc["config"] = a.config
    doc["method"] = a.method or METHOD
    doc.update(extra)
    doc["rows"] = rows
    if a.note:
        doc["notes"] = list(a.note)
    return doc


def cmd_gpt(a):
    rows = load_rows(a.logs)
    if not rows:
        print("results.py: no RESULT lines in %s" % " ".join(a.logs), file=sys.stderr)
        return 1
    derive(rows, [tuple(x.split("=", 1)) for x in a.reference], a.versus, a.vs_pytorch)
    ordered = sorted(rows.values(), key=lambda r: (r["gpus"], not r["system"].startswith("pytorch")))
    models = sorted({r["fake_comm"] for r in ordered if r.get("fake_comm", "untimed") != "untimed"})
    doc = new_doc(a, a.name, ordered)
    missing = [s for s in a.expect if s not in rows]
    if missing:
        doc["missing"] = missing
    cols = CORE + [c for c in (a.columns.split(",") if a.columns else []) if c not in CORE]
    lines = table(ordered, cols)
    if missing:
        lines += ["", "Missing (their run failed; see the logs): " + ", ".join(missing)]
    print(write(doc, a.results, a.title or a.name, [(None, lines)], ["communication model: " + m for m in models]))
    return 0


def cmd_from_jsonl(a):
    """train_gpt's JSONL log -> its RESULT line: the median step after WARM, the fullest rank's peak."""
    cfg, steps = read_train_jsonl(a.log)
    timed = steps[a.warm:]
    if not timed:
        print("%s: %d steps, none after %d warm-ups" % (a.log, len(steps), a.warm), file=sys.stderr)
        return 1
    times = sorted(s["step_ms"] for s in timed)
    med = times[len(times) // 2]
    at = min(timed, key=lambda s: abs(s["step_ms"] - med))
    res = dict(system=a.system, mode="%sx%sx%s %s" % (cfg["dp"], cfg["pp"], cfg["tp"], cfg["dp_mode"]), gpus=cfg["world"],
               params_M=round(cfg["params"] / 1e6, 1), step_ms=round(med, 2),
               tokens_per_s=round(cfg["batch"] * cfg["seq_len"] / med * 1e3),
               mfu=at["mfu"] and round(at["mfu"] * med / at["step_ms"], 3),
               peak_mem_gib=round(max(s["peak_mem_gib"] for s in steps), 2), batch=cfg["batch"],
               micro_batches=cfg["micro_batches"], sequence_parallel=cfg["sequence_parallel"],
               bubble_ms_est=at["bubble_ms_est"], dp_sync_ms_est=at["dp_sync_ms_est"],
               optimizer_ms=at["optimizer_ms"], last_loss=round(steps[-1]["loss"], 4),
               step_ms_all=[round(s["step_ms"], 2) for s in timed])
    print("RESULT", json.dumps(res))
    return 0


COLLECTIVE_OPS = ("allreduce", "allgather", "reducescatter")


def bw_lines(path):
    """{(op, MiB): busbw} and the INFO lines of one collectives run (torch_nccl_bw.py, tessera_bench_collectives)."""
    rows, info = {}, []
    with open(path) as f:
        for line in f:
            line = strip_launcher(line)
            if line.startswith("INFO "):
                info.append(line[5:])
            parts = line.split()
            if len(parts) == 6 and parts[0] == "BW" and parts[1] in COLLECTIVE_OPS:
                rows[(parts[1], int(parts[2]))] = float(parts[5])
    if not rows:
        sys.exit("results.py: no BW rows in %s" % path)
    return rows, info


def cmd_collectives(a):
    """Each side's rounds interleaved with the other's: a row's busbw is the best round, `runs` every round."""
    sides = {"pytorch-nccl": [bw_lines(p) for p in a.torch], "tessera-nccl": [bw_lines(p) for p in a.tessera]}
    keys = sorted(sides["pytorch-nccl"][0][0], key=lambda k: (k[1], COLLECTIVE_OPS.index(k[0])))
    best, rows = {}, []
    for system, runs in sides.items():
        for op, mb in keys:
            vals = [r[0][(op, mb)] for r in runs if (op, mb) in r[0]]
            best[(system, op, mb)] = max(vals)
            rows.append({"system": system, "op": op, "size_mib": mb, "busbw_gbs": max(vals), "runs": vals})
    for row in rows:
        if row["system"] == "tessera-nccl":
            row["busbw_ratio"] = round(row["busbw_gbs"] / best[("pytorch-nccl", row["op"], row["size_mib"])], 3)
    a.method = a.method or ("5 warm-ups, 20 timed iterations between CUDA events on the caller's stream; busbw as "
                            "nccl-tests; best of %d interleaved rounds per side; bf16, 2 ranks" % len(a.torch))
    info = {s: sorted({i for r in runs for i in r[1]}) for s, runs in sides.items()}
    doc = new_doc(a, "collectives", rows, dtype="bfloat16", ranks=2, info=info)
    pivot = [{"op": op, "MiB": mb, "PyTorch busbw GB/s": best[("pytorch-nccl", op, mb)],
              "tessera busbw GB/s": best[("tessera-nccl", op, mb)],
              "ratio": round(best[("tessera-nccl", op, mb)] / best[("pytorch-nccl", op, mb)], 3)}
             for op in COLLECTIVE_OPS for op2, mb in keys if op2 == op]
    sections = [(None, table(pivot, ["op", "MiB", "PyTorch busbw GB/s", "tessera busbw GB/s", "ratio"]))]
    if a.diag_nonblocking:
        d, _ = bw_lines(a.diag_nonblocking)
        diag = [{"system": "tessera-nccl (TESSERA_NCCL_BLOCKING=0)", "op": op, "size_mib": mb, "busbw_gbs": d[(op, mb)],
                 "busbw_ratio": round(d[(op, mb)] / best[("pytorch-nccl", op, mb)], 3)} for op, mb in keys if (op, mb) in d]
        doc["diagnostics"] = {"note": "one run of tessera running its ops on non-blocking NCCL communicators "
                                      "(TESSERA_NCCL_BLOCKING=0; not the default)", "rows": diag}
        sections.append(("Diagnostic: non-blocking NCCL communicators (one run)",
                         table(diag, ["op", "size_mib", "busbw_gbs", "busbw_ratio"])))
    print(write(doc, a.results, a.title or "Collectives: tessera's NCCL communicator vs torch.distributed (NCCL)",
                sections, ["%s: %s" % (s, "; ".join(lines)) for s, lines in info.items()]))
    bad = [(op, mb) for op, mb in keys if mb >= 64 and best[("tessera-nccl", op, mb)] < 0.98 * best[("pytorch-nccl", op, mb)]]
    print("target: tessera >= 0.98 x PyTorch at >= 64 MiB: %s" % ("met" if not bad else "NOT met for %s" % bad))
    return 0


DATA_TARGET_US = 1000.0  # the data issue's target: the sampler's host time per step for GPT-735M's batch
SAMPLE_WHAT = {"tessera": "readSamples (C++)", "tessera-python": "Sampler.batch() (Python)",
               "pytorch-dataloader-w0": "next(DataLoader)", "nanogpt-memmap": "get_batch()"}


def data_rows(paths):
    """Every stdout line of bench/data's runs that is a JSON object with "system" and "measurement"."""
    rows = []
    for path in paths:
        with open(path, errors="replace") as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    print("results.py: unreadable line in %s: %s" % (path, line[:200]), file=sys.stderr)
                    continue
                if isinstance(row, dict) and "system" in row and "measurement" in row:
                    rows.append(row)
    return rows


def data_what(r):
    """What a per-step data row timed, in words."""
    work = r.get("work_ms")
    if r["measurement"] == "loader_next":
        call = "BatchLoader.next()" if r["system"] == "tessera" else "next(DataLoader)"
        return "%s, %g ms work/step" % (call, work) if work else call + ", no work (the loader's rate)"
    if r["system"].startswith("pytorch-dataloader-w") and r["system"] != "pytorch-dataloader-w0":
        return "next(DataLoader), no work (the workers' rate)"
    return SAMPLE_WHAT.get(r["system"], r["measurement"])


def cmd_data(a):
    rows = data_rows(a.logs)
    if not rows:
        print("results.py: no data rows in " + " ".join(a.logs), file=sys.stderr)
        return 1
    if a.check:  # the smoke test: every expected (system, measurement) printed its row; nothing written
        have = {(r["system"], r["measurement"]) for r in rows}
        missing = [w for w in a.check.split(",") if tuple(w.split(":", 1)) not in have]
        if missing:
            print("results.py: missing rows: " + ", ".join(missing), file=sys.stderr)
            return 1
        print("results.py: all %d expected rows present (%d rows)" % (len(a.check.split(",")), len(rows)), file=sys.stderr)
        return 0
    for r in rows:
        if r["system"] == "tessera" and r["measurement"] == "sample_read":
            verdict = "meets" if r["us_mean"] < DATA_TARGET_US and r["us_p99"] < DATA_TARGET_US else "MISSES"
            a.note.insert(0, "%s: tessera's readSamples of %d x %d tokens takes %.1f us mean, %.1f us p99 per step: %s the "
                             "< %.0f us target" % (r["dataset"], r["batch"], r["seq_len"] + 1, r["us_mean"], r["us_p99"],
                                                   verdict, DATA_TARGET_US))
        if r["measurement"] == "loader_next" and r.get("work_ms"):
            keeps = r["us_mean"] < 0.1 * r["work_ms"] * 1e3
            a.note.append("%s: %s's next() blocked the trainer %.1f us on average (p99 %.1f us) with %g ms of work per "
                          "step: the loader %s" % (r["dataset"], r["system"], r["us_mean"], r["us_p99"], r["work_ms"],
                                                   "keeps up" if keeps else "does NOT keep up"))
    datasets = json.load(open(a.datasets)) if a.datasets else []
    doc = new_doc(a, "data", rows, batch=a.batch, seq_len=a.seq_len, datasets=datasets,
                  target="the sampler's host time per step for B=%d x T=%d < %.0f us" % (a.batch, a.seq_len, DATA_TARGET_US))
    per_step, seq, build = [], [], []
    for r in rows:
        m = r["measurement"]
        if m in ("sample_read", "loader_next"):
            ok = r["us_mean"] < DATA_TARGET_US and r["us_p99"] < DATA_TARGET_US
            per_step.append(dict(r, what=data_what(r), M_tokens_per_s=round(r["tokens_per_s"] / 1e6, 1),
                                 **{k: round(r[k], 1) for k in ("us_mean", "us_p50", "us_p99")},
                                 under_1ms="yes" if ok else "mean only" if r["us_mean"] < DATA_TARGET_US else "no"))
        elif m in ("seq_read", "seq_read_cold"):
            cold = m == "seq_read_cold"
            seq.append(dict(r, M_tokens_per_s=round(r["tokens_per_s"] / 1e6, 1),
                            page_cache="cold (%.0f%% cached before)" % (r["resident_before"] * 100) if cold else "warm",
                            file_MB_per_s=round(r["file_MB_per_s"] if cold else r["tokens_per_s"] * r["token_bytes"] / 1e6)))
        elif m == "build":
            build.append(r)
    sections = [("Per-step host time, B=%d x T=%d (target < %.0f us)" % (a.batch, a.seq_len, DATA_TARGET_US),
                 table(per_step, ["dataset", "system", "what", "us_mean", "us_p50", "us_p99", "M_tokens_per_s", "under_1ms"])),
                ("Sequential read (every document in order, widened to int64)",
                 table(seq, ["dataset", "system", "what", "page_cache", "M_tokens_per_s", "file_MB_per_s", "pass_ms"])),
                ("Index build and the first batch after it", table(build, ["dataset", "system", "build_ms", "first_batch_ms"]))]
    text = write(doc, a.results, a.title or "Data loading: tessera vs PyTorch's ways (host, CPU)", sections,
                 ["dataset `%s`: %s" % (d["name"], d["description"]) for d in datasets])
    print(text)
    return 0


def loss_curve(path):
    out = {}
    if os.path.exists(path):
        for line in open(path):
            r = json.loads(line)
            if r.get("event") == "step":
                out[r["step"]] = r["loss"]
    return out


def cmd_llama(a):
    """bench/llama/run.sh's logs: a row per run, the recompute runs as their own table, the loss curves of
    tessera and PyTorch eager compared step by step (and plotted: tools/plot_run.py)."""
    logs = sorted(os.path.join(a.logs, f) for f in os.listdir(a.logs) if f.endswith(".log"))
    recompute = []
    for path in [p for p in logs if re.search(r"tessera-recompute-\w+-b\d+\.log$", p)]:
        m = re.search(r"tessera-recompute-(\w+)-b(\d+)\.log$", path)
        found = read_results(path)
        r = found[-1] if found else {}
        text = open(path, errors="replace").read()
        recompute.append(dict(recompute=m.group(1), batch=int(m.group(2)), step_ms=r.get("step_ms"),
                              tokens_per_s=r.get("tokens_per_s"), peak_mem_gib=r.get("peak_mem_gib"),
                              status="ok" if found else "out of memory" if "out of memory" in text else "failed"))
    rows = load_rows([p for p in logs if "tessera-recompute-" not in p])
    derive(rows, versus=("pytorch-eager", "pytorch-compile"))
    t, p = loss_curve(os.path.join(a.logs, "tessera.jsonl")), loss_curve(os.path.join(a.logs, "pytorch-eager.jsonl"))
    common = sorted(set(t) & set(p))
    curves = {}
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
    name = a.name or "llama_1gpu"
    doc = new_doc(a, name, list(rows.values()), loss_curves=curves, recompute=recompute)
    sections = [(None, table(doc["rows"], CORE + ["vs_pytorch_eager", "vs_pytorch_compile", "last_loss"]))]
    if curves:
        sections.append(("Loss curves", ["Over %d steps (same batches, same initial weights; %s_loss.png): largest gap "
                                          "%s at step %s, mean gap %s, largest gap of 20-step means %s; tessera %s, "
                                          "PyTorch %s (first, last)." % (curves["steps"], name, curves["max_abs_gap"],
                                                                         curves["at_step"], curves["mean_abs_gap"],
                                                                         curves["max_abs_gap_of_20_step_means"],
                                                                         curves["tessera_first_last"],
                                                                         curves["pytorch_first_last"])]))
    if recompute:
        sections.append(("Activation recompute (train_gpt)",
                         table(recompute, ["recompute", "batch", "step_ms", "tokens_per_s", "peak_mem_gib", "status"])))
    print(write(doc, a.results, a.title or name, sections))
    if common:
        subprocess.run([sys.executable, os.path.join(HERE, "..", "tools", "plot_run.py"),
                        "tessera=" + os.path.join(a.logs, "tessera.jsonl"),
                        "pytorch-eager=" + os.path.join(a.logs, "pytorch-eager.jsonl"),
                        "-o", os.path.join(a.results, name + "_loss.png"), "--title", a.title or name], check=False)
    return 0 if rows or recompute else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p, machine=True):
        p.add_argument("--results", default=os.path.join(HERE, "results"))
        p.add_argument("--machine", required=machine, default="?")
        p.add_argument("--command", required=machine, default="?")
        for opt in ("--title", "--config", "--method"):
            p.add_argument(opt, default="")
        p.add_argument("--note", action="append", default=[])
        return p

    g = common(sub.add_parser("gpt", help="training rows from RESULT lines"))
    g.add_argument("logs", nargs="+")
    g.add_argument("--name", required=True)
    g.add_argument("--reference", action="append", default=[], help="PREFIX=SYSTEM: the 1-GPU row of rows named PREFIX...")
    g.add_argument("--versus", action="append", default=[], help="SYSTEM: add vs_<system> to every other row")
    g.add_argument("--vs-pytorch", action="append", default=[],
                   help="PREFIX: rows named PREFIX<layout> get vs_pytorch, over pytorch-<layout>'s tokens/s")
    g.add_argument("--expect", action="append", default=[], help="SYSTEM that must be there (else listed as missing)")
    g.add_argument("--columns", default="", help="more Markdown columns, comma-separated")
    j = sub.add_parser("from-jsonl", help="train_gpt's JSONL log -> RESULT line")
    j.add_argument("log")
    j.add_argument("system")
    j.add_argument("warm", nargs="?", type=int, default=3)
    c = common(sub.add_parser("collectives"))
    c.add_argument("--torch", nargs="+", required=True)
    c.add_argument("--tessera", nargs="+", required=True)
    c.add_argument("--diag-nonblocking", default="")
    d = common(sub.add_parser("data"), machine=False)
    d.add_argument("logs", nargs="+")
    d.add_argument("--check", help="SYSTEM:MEASUREMENT,... that must be present; writes nothing")
    d.add_argument("--datasets", help="a JSON file: [{name, path, description}, ...]")
    d.add_argument("--batch", type=int, default=8)
    d.add_argument("--seq-len", type=int, default=1024)
    ll = common(sub.add_parser("llama"))
    ll.add_argument("logs", help="the run's log directory")
    ll.add_argument("--name", default="")
    a = ap.parse_args(argv)
    return {"gpt": cmd_gpt, "from-jsonl": cmd_from_jsonl, "collectives": cmd_collectives, "data": cmd_data,
            "llama": cmd_llama}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
