#!/usr/bin/env python3
"""train_gpt beside the compiled PyTorch anchor from one traced run of each (bench/llama/profile_8b.sh): kernel ms per
step by kind, the GPU span, the compute stream's idle time, NCCL's time beside compute, each side's memory phases,
the untraced runs' throughput, in OUT/NAME.{json,md}: a trace reading, kept beside the logs (not in bench/results).
  compare.py --tessera-trace T.json --tessera-breakdown T.jsonl --tessera-log T.log
             --torch-trace P.json --torch-log P.log --name NAME --out OUT --machine M --command C
             [--run NAME=CMD]... [--note N]...
Traces: rank 0's of --steps steps; --tessera-breakdown: the traced run's JSONL log (--breakdown's mem_* keys);
--tessera-log, --torch-log: the untraced runs' logs with their RESULT line.
A missing input leaves its cells empty ("—") and the exit status 1."""
import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import gaps  # noqa: E402  (the trace's events, merge, overlap, COMM)
import results  # noqa: E402  (bench/results.py: read_results, read_train_jsonl, table, now)
import summarize  # noqa: E402  (load: kernel ms and calls by short name, the GPU span)

SYSTEMS = ("tessera", "pytorch-compiled")
# Kernel kinds over summarize.short's names: the first pattern that matches (case-insensitive) names the kind.
KINDS = (
    ("NCCL all-gather", r"nccl.*allgather"),
    ("NCCL reduce-scatter", r"nccl.*reducescatter"),
    ("NCCL all-reduce", r"nccl.*allreduce"),
    ("NCCL other", r"nccl"),
    ("attention (flash, SDPA, cuDNN)", r"flash|sdpa|fmha|cudnn|attention"),
    ("Triton (Inductor)", r"^triton_"),
    ("tessera's kernels", r"tessera::"),
    ("GEMMs (nvjet, cutlass, cuBLAS)", r"nvjet|cutlass|gemm|cublas|xmma|splitkreduce"),
    ("ATen multi-tensor (foreach, fused AdamW)", r"multi_tensor_apply"),
    ("ATen element-wise, reductions, copies", r"at::native|at::|c10::"),
    ("memcpy / memset", r"^memcpy|^memset"),
    ("other", r""),
)
MEMORY = (  # (key in both sides' records, what it is)
    ("mem_step_start_gib", "allocated at the step's start (parameters, optimizer state, buffers kept)"),
    ("mem_before_backward_gib", "allocated right before backward (the above + activations kept for backward)"),
    ("mem_peak_forward_gib", "peak within forward and the loss"),
    ("mem_peak_backward_gib", "peak within backward"),
    ("mem_peak_optimizer_gib", "peak within clipping, the optimizer step and zero_grad"),
    ("peak_mem_gib", "peak of the run (the fullest rank)"),
)


def kind_of(name):
    return next(k for k, pat in KINDS if re.search(pat, name, re.I))


def kernels(path, steps):
    """Per kind and per kernel name: ms and launches per step; the GPU span per step (summarize.load)."""
    tot, cnt, span = summarize.load(path)
    by_kind = {}
    for name, ms in tot.items():
        k = by_kind.setdefault(kind_of(name), [0.0, 0])
        k[0] += ms / steps
        k[1] += cnt[name] / steps
    per_name = {n: (ms / steps, cnt[n] / steps) for n, ms in tot.items()}
    return dict(by_kind=by_kind, per_name=per_name, kernel_ms=sum(tot.values()) / steps, span_ms=span / steps)


def streams(path, steps):
    """The compute stream (the busiest without communication kernels): its span, busy and idle time, the part of
    that idle while NCCL ran; NCCL's busy time, the part of it beside a compute kernel on any stream and the
    part exposed; the GPU span and the time no kernel ran at all; ms per step."""
    ev = gaps.load(path)
    gpu = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
           and "dur" in e]
    if not gpu:
        return None
    is_comm = [e.get("cat") == "kernel" and bool(gaps.COMM.search(e.get("name", ""))) for e in gpu]
    comm = [e for e, c in zip(gpu, is_comm) if c]
    work = [e for e, c in zip(gpu, is_comm) if not c]
    stream = lambda e: e.get("args", {}).get("stream")  # noqa: E731
    comm_streams = {stream(e) for e in comm}
    by_stream = {}
    for e in gpu:
        by_stream.setdefault(stream(e), []).append(e)
    candidates = [s for s in by_stream if s not in comm_streams] or list(by_stream)
    compute = max(candidates, key=lambda s: sum(e["dur"] for e in by_stream[s]))

    def intervals(es):
        return gaps.merge([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in es])

    def length(iv):
        return sum(e - s for s, e in iv)

    def per_step(us):
        return round(us / 1e3 / steps, 2)

    busy = intervals(by_stream[compute])
    idle = [[e0, s1] for (_, e0), (s1, _) in zip(busy, busy[1:]) if s1 > e0]
    comm_iv, work_iv, all_iv = intervals(comm), intervals(work), intervals(gpu)
    span = all_iv[-1][1] - all_iv[0][0]
    comm_us = length(comm_iv)
    beside = gaps.overlap(comm_iv, work_iv)
    return dict(compute_stream=str(compute), comm_streams=sorted(str(s) for s in comm_streams),
                compute_span_ms=per_step(busy[-1][1] - busy[0][0]), compute_busy_ms=per_step(length(busy)),
                compute_idle_ms=per_step(length(idle)),
                compute_idle_while_nccl_ms=per_step(gaps.overlap(idle, comm_iv)),
                other_streams_compute_ms=per_step(sum(float(e["dur"]) for e in work if stream(e) != compute)),
                nccl_busy_ms=per_step(comm_us), nccl_beside_compute_ms=per_step(beside),
                nccl_beside_compute_fraction=round(beside / comm_us, 3) if comm_us else None,
                only_nccl_ms=per_step(comm_us - beside), gpu_span_ms=per_step(span),
                no_kernel_ms=per_step(span - length(all_iv)))


def tessera_memory(path, warm):
    """The largest of each mem_* key over the steps after `warm` of train_gpt's JSONL log, the breakdown times of
    its median step; None where the log or the key is missing."""
    if not path or not os.path.exists(path):
        return None
    steps = results.read_train_jsonl(path)[1]
    steps = steps[warm:] or steps
    if not steps:
        return None
    out = {k: (max(s[k] for s in steps if s.get(k) is not None) if any(s.get(k) is not None for s in steps) else None)
           for k, _ in MEMORY}
    med = sorted(steps, key=lambda s: s["step_ms"])[len(steps) // 2]
    out.update({k: med.get(k) for k in ("step_ms", "optimizer_ms", "compute_ms_est", "dp_sync_ms_est")})
    return out


def result_row(path, system):
    if not path or not os.path.exists(path):
        return None
    found = results.read_results(path)  # the last one, as the row `system`
    return dict(found[-1], system=system) if found else None


def fmt(v, nd=2):
    return "—" if v is None else ("%.*f" % (nd, v) if isinstance(v, float) else str(v))


def diff(a, b, nd=2):
    return "—" if a is None or b is None else "%+.*f" % (nd, a - b)


def kind_table(prof):
    """Kernel ms and launches per step by kind, then all kernels and the GPU span."""
    kinds = [k for k, _ in KINDS if any(k in p["by_kind"] for p in prof.values())]
    lines = ["| kind | tessera ms/step (launches) | compiled PyTorch ms/step (launches) | tessera − PyTorch ms |",
             "|---|---|---|---|"]
    for k in kinds:
        got = [prof[s]["by_kind"].get(k, (0.0, 0)) if s in prof else None for s in SYSTEMS]
        cells = ["%.2f (%.0f)" % tuple(g) if g else "—" for g in got]
        lines.append("| %s | %s | %s | %s |" % (k, cells[0], cells[1], diff(*[g and g[0] for g in got])))
    for label, key in (("**all kernels**", "kernel_ms"),
                       ("**GPU span** (first kernel start to last kernel end)", "span_ms")):
        lines.append("| %s | %s |" % (label, " | ".join(both(lambda s: prof[s][key] if s in prof else None))))
    return kinds, lines


def stream_table(gap):
    def side(s, key):
        return (gap.get(s) or {}).get(key)

    lines = ["| per step (ms) | tessera | compiled PyTorch | tessera − PyTorch |", "|---|---|---|---|"]
    for key, label in (("compute_span_ms", "compute stream's span"), ("compute_busy_ms", "compute stream busy"),
                       ("compute_idle_ms", "compute stream idle"),
                       ("compute_idle_while_nccl_ms", "of it while NCCL ran (waiting on communication)"),
                       ("other_streams_compute_ms", "non-NCCL kernels on other streams (copies, side work)"),
                       ("nccl_busy_ms", "NCCL kernels busy (merged; includes their waits for peers)"),
                       ("nccl_beside_compute_ms", "of it beside a compute kernel (any stream)"),
                       ("only_nccl_ms", "of it with no compute kernel beside it (exposed)"),
                       ("no_kernel_ms", "GPU span with no kernel at all")):
        lines.append("| %s | %s |" % (label, " | ".join(both(lambda s: side(s, key)))))
    lines.append("| NCCL time beside compute (fraction) | %s | %s | |" % tuple(
        fmt(side(s, "nccl_beside_compute_fraction"), 3) for s in SYSTEMS))
    return lines


def memory_table(mem):
    def kept(s):  # allocated before backward beyond the step's start: what forward keeps for backward
        m = mem[s] or {}
        if m.get("mem_before_backward_gib") is None or m.get("mem_step_start_gib") is None:
            return None
        return m["mem_before_backward_gib"] - m["mem_step_start_gib"]

    lines = ["| GiB (fullest rank) | tessera | compiled PyTorch | tessera − PyTorch |", "|---|---|---|---|"]
    for key, label in MEMORY:
        lines.append("| %s: %s | %s |" % (key, label, " | ".join(both(lambda s: (mem[s] or {}).get(key)))))
    lines.append("| activations (and anything else) kept from forward for backward: before backward − step "
                 "start | %s |" % " | ".join(both(kept)))
    t = mem["tessera"]
    if t:
        parts = ["%s%s ms" % (label, fmt(t[k])) for k, label in (
            ("step_ms", "step "), ("optimizer_ms", "optimizer "), ("compute_ms_est", "compute ~"),
            ("dp_sync_ms_est", "exposed dp communication ~")) if t.get(k) is not None]
        lines += ["", "tessera's traced run (--breakdown syncs the device; its own clocks, median step): %s."
                  % ", ".join(parts)]
    return lines


def top_table(prof, top):
    names = {}
    for p in prof.values():
        for n, (ms, _) in p["per_name"].items():
            names[n] = names.get(n, 0.0) + ms
    lines = ["| kernel | kind | tessera ms/step (launches) | compiled PyTorch ms/step (launches) |",
             "|---|---|---|---|"]
    for n in sorted(names, key=lambda n: -names[n])[:top]:
        cells = ["%.3f (%.0f)" % prof[s]["per_name"].get(n, (0.0, 0)) if s in prof else "—" for s in SYSTEMS]
        lines.append("| %s | %s | %s | %s |" % (n.replace("|", "/"), kind_of(n), cells[0], cells[1]))
    return lines


def both(f):  # the two sides' cells and their difference (tessera - PyTorch)
    t, p = f("tessera"), f("pytorch-compiled")
    return [fmt(t), fmt(p), diff(t, p)]


def write_report(doc, out, title, sections, header):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, doc["name"] + ".json"), "w") as f:
        json.dump(doc, f, indent=1)
    md = ["# " + title, ""] + ["- %s: %s" % (k, doc[k]) for k in ("date", "machine", "command", "config", "method")
                               if doc.get(k)] + ["- " + h for h in header]
    for heading, lines in sections + [("Notes", ["- " + n for n in doc.get("notes", [])])] * bool(doc.get("notes")):
        md += ["", "## " + heading, ""] + lines
    open(os.path.join(out, doc["name"] + ".md"), "w").write("\n".join(md) + "\n")
    return "\n".join(md)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for side in ("tessera", "torch"):
        ap.add_argument("--%s-trace" % side, default="")
        ap.add_argument("--%s-log" % side, default="")
    ap.add_argument("--tessera-breakdown", default="")
    ap.add_argument("--steps", type=int, default=2, help="steps in each trace")
    ap.add_argument("--warm", type=int, default=3, help="warm-up steps of the breakdown run's log")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--name", required=True)
    ap.add_argument("--out", required=True, help="the directory of the report (the run's logs)")
    ap.add_argument("--machine", required=True)
    ap.add_argument("--command", required=True)
    for opt in ("--title", "--config"):
        ap.add_argument(opt, default="")
    ap.add_argument("--run", action="append", default=[], help="NAME=COMMAND of one run, for the header")
    ap.add_argument("--note", action="append", default=[])
    a = ap.parse_args()

    traces = {s: p for s, p in zip(SYSTEMS, (a.tessera_trace, a.torch_trace)) if p and os.path.exists(p)}
    missing = [s + " trace" for s in SYSTEMS if s not in traces]
    prof = {s: kernels(p, a.steps) for s, p in traces.items()}
    gap = {s: streams(p, a.steps) for s, p in traces.items()}
    rows = [r for r in (result_row(a.tessera_log, "tessera-train-fsdp"),
                        result_row(a.torch_log, "pytorch-compiled-fsdp")) if r]
    for want, system in (("tessera untraced run", "tessera-train-fsdp"), ("PyTorch run", "pytorch-compiled-fsdp")):
        if not any(r["system"] == system for r in rows):
            missing.append(want)
    anchor = next((r for r in rows if r["system"] == "pytorch-compiled-fsdp"), None)
    for r in rows:
        r["tokens_per_s_per_gpu"] = round(r["tokens_per_s"] / r["gpus"]) if r.get("gpus") else None
        if anchor and r is not anchor:
            r["vs_compiled"] = round(r["tokens_per_s"] / anchor["tokens_per_s"], 3)
    mem = {"tessera": tessera_memory(a.tessera_breakdown, a.warm),
           "pytorch-compiled": ({k: anchor.get(k) for k, _ in MEMORY} if anchor else None)}
    if mem["tessera"] is None or all(mem["tessera"].get(k) is None for k, _ in MEMORY[:-1]):
        missing.append("tessera's memory phases (--breakdown's mem_* keys)")

    kinds, kind_lines = kind_table(prof)
    doc = dict(name=a.name, date=results.now(), machine=a.machine, command=a.command)
    if a.config:
        doc["config"] = a.config
    doc["method"] = ("kernel time per step from rank 0's trace of %d steps of each side, grouped by kernel name as "
                     "bench/profile/summarize.py (template arguments cut) and by kind (bench/profile/compare.py "
                     "KINDS); streams as bench/profile/gaps.py; memory: the caching allocator's counters, the "
                     "fullest rank, the largest over the timed steps; tok/s: the untraced runs (3 warm-ups, the "
                     "median step)" % a.steps)
    doc.update(runs=list(a.run), rows=rows, memory=mem, streams=gap,
               kernel_kinds={k: {s: dict(ms=round(p["by_kind"].get(k, (0, 0))[0], 3),
                                         calls=round(p["by_kind"].get(k, (0, 0))[1], 1)) for s, p in prof.items()}
                             for k in kinds},
               kernels_total_ms={s: round(p["kernel_ms"], 2) for s, p in prof.items()},
               gpu_span_ms={s: round(p["span_ms"], 2) for s, p in prof.items()})
    if a.note or missing:
        doc["notes"] = list(a.note) + (["missing: " + ", ".join(missing)] if missing else [])
    sections = [("Untraced throughput (same call)",
                 results.table(rows, ["system", "gpus", "tokens_per_s", "tokens_per_s_per_gpu", "step_ms", "mfu",
                                      "peak_mem_gib", "vs_compiled"])),
                ("GPU kernel time per step by kind (rank 0, traced steps)", kind_lines),
                ("Streams (rank 0, traced steps)", stream_table(gap)),
                ("Memory phases", memory_table(mem)),
                ("The %d kernels with the most time (both sides together)" % a.top, top_table(prof, a.top))]
    header = ["run %s: `%s`" % tuple(r.split("=", 1)) if "=" in r else "run " + r for r in a.run]
    print(write_report(doc, a.out, a.title or a.name, sections, header))
    if missing:
        print("compare.py: missing %s" % ", ".join(missing), file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
