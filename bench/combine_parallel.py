#!/usr/bin/env python3
"""Combines the RESULT lines of bench/parallel.sh's runs into bench/results/{tp,pp,fsdp,nocomm,emulated,pp_emulated}.{json,md}.

Each log is named after its row's system (LOG_DIR/<system>.log), and the file name names the row
(the anchor's PyTorch lines have no "system" key; a variant run of one binary gets its own name). Per section the rows are the two 1-GPU references
(pytorch-single, tessera-single, batch 8) and that section's runs.
  scaling = tokens/s over (GPUs x the 1-GPU tokens/s of the same system), as the anchors define it
  scaling_vs_pytorch_single = the same over PyTorch's 1-GPU tokens/s
TP also gets overhead_ms = step_ms - ideal_ms, ideal_ms = the same system's 1-GPU step_ms scaled
to this row's per-GPU share of the batch (batch / (8 x GPUs)): communication left exposed plus
any other cost of splitting (smaller GEMMs, work repeated on every rank). An estimate.
The nocomm section (the FAKE_WORLD probe, lines with "fake_world") gets the same overhead_ms for every
row, the ideal being the same system's 1-GPU step_ms scaled to the row's tokens per GPU per step:
there, with no communication at all, it is the cost of the parallel machinery alone, and "scaling"
is the bound that communication hidden for free would give.
The emulated section (the same probe over the timed fake communicator, FAKE_COMM_TIMED: lines whose
"fake_comm" is not "untimed") gets overhead_ms the same way: the machinery plus the modelled
communication left exposed by the schedule (src/comm/fake/fake_timing.h says what it leaves out).
The pp_emulated section (lines with "emulated", from tessera_bench_pp under PP_EMULATE,
bench/pp/pp_emulate.h) holds predictions: every unit's cost measured on one GPU, the P-stage
schedule simulated (src/pipeline/simulate.h); such a log holds several rows, each keeping its own
system name.
"""
import argparse, datetime, json, os, sys

from result_lines import read_results

SECTIONS = {"tp": "pytorch-tp", "pp": "pytorch-pp", "fsdp": "pytorch-fsdp", "nocomm": None, "emulated": None,
            "pp_emulated": None}
TITLES = {"tp": "Tensor parallel: tessera vs PyTorch DTensor TP",
          "pp": "Pipeline parallel: tessera vs torch.distributed.pipelining",
          "fsdp": "FSDP: tessera vs PyTorch FSDP2",
          "nocomm": "One GPU as rank 0 of 2, no communication (FAKE_WORLD=2): DDP, TP and FSDP, tessera and PyTorch",
          "emulated": "One GPU as rank 0 of 2, communication emulated (FAKE_WORLD=2 FAKE_COMM_TIMED=1): DDP, TP and FSDP",
          "pp_emulated": "Pipeline parallel on 2 GPUs predicted on one: unit costs measured, the schedule simulated "
                         "(PP_EMULATE=2)"}
SINGLE_BATCH = 8


def parse(path):
    system = os.path.splitext(os.path.basename(path))[0]
    # The run's name (its log file) names the row; a run of several in-process variants
    # (RESULT lines with "variant") gets a row per variant, <run>-<variant> ("base"/"default": <run>).
    rows = []
    for r in read_results(path):
        v = r.get("variant")
        if "emulated" in r:
            rows.append(r)
            continue
        rows.append(dict(r, system=system if v in (None, "base", "default") else "%s-%s" % (system, v)))
    return rows


def is_single(system):
    return system.startswith("pytorch-single") or system.startswith("tessera-single")


def tokens_per_gpu_step(r):
    return r["tokens_per_s"] * r["step_ms"] / 1e3 / r["world"]


def section_of(row):
    if "emulated" in row:
        return "pp_emulated"
    if "fake_world" in row:
        return "nocomm" if row.get("fake_comm", "untimed") == "untimed" else "emulated"
    system = row["system"]
    for s in SECTIONS:
        if system.startswith("pytorch-" + s) or system.startswith("tessera-" + s):
            return s
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--sections", nargs="+", default=list(SECTIONS))
    ap.add_argument("--machine", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--results", required=True)
    a = ap.parse_args()
    res = {}
    for p in a.logs:
        if os.path.exists(p):
            for r in parse(p):
                res[r["system"]] = r
    singles = {k: res.get(k + "-single") for k in ("pytorch", "tessera")}
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    ok = True
    for sec in a.sections:
        rows = []
        for system, r in res.items():
            if section_of(r) != sec and not is_single(system):
                continue
            family = system.split("-")[0]
            one = singles.get(family)
            gpus = r["world"]
            row = {"system": system, "gpus": gpus, "batch": r.get("batch"), "tokens_per_s": r["tokens_per_s"],
                   "step_ms": r["step_ms"], "mfu": r["mfu_vs_989"], "peak_mem_gib": r["peak_mem_GiB"]}
            if one:
                row["scaling"] = round(r["tokens_per_s"] / (gpus * one["tokens_per_s"]), 3)
            if singles["pytorch"]:
                row["scaling_vs_pytorch_single"] = round(r["tokens_per_s"] / (gpus * singles["pytorch"]["tokens_per_s"]), 3)
            if sec == "tp" and one and gpus > 1:
                batch = r.get("batch") or 16
                ideal = one["step_ms"] * batch / (SINGLE_BATCH * gpus)
                row["overhead_ms"] = round(r["step_ms"] - ideal, 2)
            if sec in ("nocomm", "emulated") and one and "fake_world" in r:
                ideal = one["step_ms"] * tokens_per_gpu_step(r) / tokens_per_gpu_step(one)
                row["overhead_ms"] = round(r["step_ms"] - ideal, 2)
            for k in ("sequence_parallel", "overlap", "micro_batches", "schedule", "partition", "peak_mem_GiB_per_rank",
                      "peak_in_flight_per_rank", "prefetch_budget_MiB", "peak_unsharded_units", "peak_unsharded_GiB",
                      "last_loss", "step_ms_all", "variant", "forward_chunks", "sm_carveout",
                      "mem_before_backward_GiB", "peak_through_forward_GiB", "fused_wgrad", "fake_world", "fake_comm",
                      "extra_warmup", "layers_per_stage", "pipeline_ms", "optimizer_ms", "idle_ms_per_rank",
                      "sequential_step_ms", "emulated"):
                if k in r:
                    row[k] = r[k]
            rows.append(row)
        rows.sort(key=lambda x: (x["gpus"], not x["system"].startswith("pytorch"), x["system"]))
        if not any(section_of(x) == sec for x in rows):
            print("combine_parallel.py: no %s rows" % sec, file=sys.stderr)
            ok = False
            continue
        doc = {"benchmark": sec, "date": date, "machine": a.machine, "command": a.command, "config": a.config,
               "method": "the anchors' GPT (bench/torch_anchor.py, bench/common/gpt.h); 3 warm-ups then the median "
                         "of STEPS steps, device synchronised around each step; peak memory = max allocated by the "
                         "caching allocator (PP: the larger of the two stages)",
               "rows": rows}
        with open(os.path.join(a.results, sec + ".json"), "w") as f:
            json.dump(doc, f, indent=1)
        cols = ["system", "gpus", "batch", "tokens_per_s", "step_ms", "scaling", "scaling_vs_pytorch_single", "mfu",
                "peak_mem_gib"]
        extra = {"tp": ["overhead_ms", "forward_chunks", "sm_carveout"],
                 "pp": ["fused_wgrad", "extra_warmup", "peak_mem_GiB_per_rank", "peak_in_flight_per_rank"],
                 "fsdp": ["prefetch_budget_MiB", "peak_unsharded_units", "peak_unsharded_GiB",
                          "mem_before_backward_GiB", "peak_through_forward_GiB"],
                 "nocomm": ["fake_world", "overhead_ms", "fused_wgrad", "mem_before_backward_GiB"],
                 "emulated": ["fake_world", "overhead_ms", "fused_wgrad", "mem_before_backward_GiB",
                              "forward_chunks", "prefetch_budget_MiB"],
                 "pp_emulated": ["extra_warmup", "layers_per_stage", "pipeline_ms", "optimizer_ms", "idle_ms_per_rank",
                                 "sequential_step_ms"]}[sec]
        cols += extra
        models = sorted({x["fake_comm"] for x in rows if "fake_comm" in x and sec == "emulated"})
        lines = ["# %s" % TITLES[sec], "", "- date: %s" % date, "- machine: %s" % a.machine,
                 "- command: `%s`" % a.command, "- config: %s" % a.config, "- method: %s" % doc["method"]]
        lines += ["- communication model: %s" % m for m in models]
        lines += ["- pipeline rows: %s" % m for m in sorted({x["emulated"] for x in rows if "emulated" in x})]
        lines += ["",
                 "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for row in rows:
            cells = []
            for c in cols:
                v = row.get(c, "—")
                if isinstance(v, list):
                    v = ", ".join(str(x) for x in v)
                elif isinstance(v, float) and c == "tokens_per_s":
                    v = "{:,.0f}".format(v)
                elif isinstance(v, int) and c == "tokens_per_s":
                    v = "{:,}".format(v)
                cells.append(str(v) if v is not None else "—")
            lines.append("| " + " | ".join(cells) + " |")
        with open(os.path.join(a.results, sec + ".md"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print("\n".join(lines[-len(rows) - 2:]))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
