#!/usr/bin/env python3
"""The committed tessera training rows of bench/results/*.json (kind "train", system "tessera*"), each turned into
a machine-readable description of the run that produced it: the train_gpt preset and the shape it changed, the
layout's degrees (dp x tp x pp x cp), how the global batch splits, schedule, precision, recompute and the knobs
the row's system name, command or notes reveal; with a scope ("in" or why the layout planner should not predict
the row). The per-suite readings follow the scripts that ran the rows (bench/llama/parallel.sh,
bench/llama/scale_traces.sh, bench/tp/slice70b.sh, bench/cp/run.sh, bench/train/run.sh, bench/parallel.sh,
bench/ddp/run.sh, bench/single_gpu/run.sh, bench/llama/run.sh, bench/checkpoint/async_save.sh).
  python3 bench/plan/rows.py [--json OUT] [--all]     (--all: the out-of-scope rows too, with their reason)
Conventions:
  global_batch = dp x micro_batch x micro_batches: the cp ranks of a replica share its sequences (each holds
    T / cp tokens of every one), the tp ranks share them too, so neither cp nor tp multiplies the batch.
  sharding: "fsdp" where the run chose --dp-mode fsdp (also over one rank, or over cp alone: bench/cp runs FSDP
    over dp x cp), else "ddp" where dp > 1, else "none".
  flags: the system name's words that are not layout, schedule or precision words, split at '+', verbatim but
    for "bf16" (a reduction dtype there) -> "bf16-reduce", and train_gpt's default "fused" left out; plus
    "bench-driver" (GPT-735M timed by bench/tessera_bench_* through bench/parallel.sh or bench/ddp/run.sh, not
    train_gpt: their variants' defaults differ, e.g. no fused weight gradients in "base"), "brown" (the Brown
    corpus, not synthetic tokens), "pre-fused-kernels" (the run's notes: train_gpt before its fused kernels).
  Not encoded: the code at a row's date. Llama rows before cede272 (2026-11-27 19:51) repeated k and v (today's
    --gqa repeat); DDP rows before c4475d3 (2026-11-27 19:20) reduced the tied table's rows (--emb-grad reduce)."""
import argparse
import glob
import json
import os
import re
import sys

PRESET_LAYERS = {"735m": 12, "llama3-1b": 16, "llama3-8b": 32, "olmoe-1b-7b": 16}  # src/models/config.cpp
MOE_PRESETS = ("olmoe-1b-7b", "qwen3-30b-a3b", "mixtral-8x7b", "moe-tiny")
CARD_GIB = {"NVIDIA H200": 140.4, "NVIDIA H100 80GB HBM3": 79.6}  # the device's total memory
KEEP_GATHERED_SINCE = "2026-11-29 04:06"  # ad63fa5: --fsdp-keep-gathered auto (FSDP, >= 2 micro-batches)
SHAPE_FLAGS = {"hidden-size": "d", "layers": "layers", "heads": "heads", "kv-heads": "kv_heads", "ffn": "ffn",
               "vocab": "vocab"}
CP_FACTORS = {"cp4": (1, 4, 1), "fsdp2xcp2": (2, 2, 1), "cp2xtp2": (1, 2, 2), "cp2": (1, 2, 1)}  # dp cp tp
NOT_A_KNOB = re.compile(r"^(tessera|train|single|ddp|fsdp|tp\d*|sp|pp|zb|fp8|1F1B|3d|mb\d+|accum\d+|\d+x\d+x\d+|"
                        r"\d+|none)$")
RENAMED_FLAGS = {"bf16": "bf16-reduce"}
KEYS = ("suite", "run", "system", "date", "card", "host_gpus", "model", "overrides", "gpus", "seq_len",
        "global_batch", "micro_batch", "micro_batches", "dp", "tp", "pp", "cp", "sharding", "sp", "schedule",
        "precision", "recompute", "keep_gathered", "flags", "step_ms", "tokens_per_s", "peak_mem_gib", "scope")


def is_bench_driver(run):
    """GPT-735M rows timed by bench/tessera_bench_{ddp,tp,pp,fsdp} (bench/parallel.sh, bench/ddp/run.sh)."""
    return bool(re.search(r"bench/(parallel\.sh|ddp/run\.sh)", run.get("command") or ""))


def flags_of(row, run):
    """The knobs the row's system name, its run's command and notes reveal (module docstring)."""
    driver = is_bench_driver(run)
    out = ["bench-driver"] if driver else []
    for word in str(row["system"]).split("-"):
        if NOT_A_KNOB.match(word):
            continue
        for part in word.split("+"):
            if part == "fused" and not driver:  # train_gpt's --fused-kernels default on GPUs
                continue
            out.append(RENAMED_FLAGS.get(part, part))
    if "bench/llama/run.sh" in (run.get("command") or ""):  # its DATA: data/brown (curves section)
        out.append("brown")
    if any("Before the fused kernels" in n for n in run.get("notes") or []):
        out.append("pre-fused-kernels")
    return out


def machine_of(run, row):
    """(card, GPUs) of the machine string "N x CARD"."""
    m = re.match(r"\s*(\d+) x (.+?)\s*$", str(row.get("machine") or run.get("machine") or ""))
    return (m.group(2), int(m.group(1))) if m else (None, None)


def model_of(row, run):
    """(train_gpt preset, overrides): the shape flags the run passed (the 70B-wide slice's from the run's note on
    how train_gpt ran it), a layer count cut by LAYERS= or "N of M layers"."""
    name = str(row.get("model") or "")
    preset = "llama3-8b" if name == "llama70b-slice" else name.split(",")[0].strip()
    overrides = {}
    for note in run.get("notes") or []:
        if re.match(r"train_gpt runs .* as --model " + re.escape(preset) + r"\b", note):
            for flag, key in SHAPE_FLAGS.items():
                m = re.search(r"--%s (\d+)\b" % flag, note)
                if m:
                    overrides[key] = int(m.group(1))
            if "--untie-embeddings" in note:
                overrides["tied"] = False
    m = (re.search(r"\bLAYERS=(\d+)", run.get("command") or "") or re.search(r"(\d+) of \d+ (?:layers|blocks)", name))
    layers = row.get("layers") or (int(m.group(1)) if m else None)
    if layers and layers != PRESET_LAYERS.get(preset):
        overrides["layers"] = int(layers)
    return preset, overrides


def parse_layout(text):
    """Degrees, sp, micro-batches and FSDP of a layout string ("fsdp 2 x tp 2 + sp", "pp 2 x tp 2, 8
    micro-batches", "single, 16 micro-batches", "cp 2", "single, fsdp")."""
    deg = {k: int(v) for k, v in re.findall(r"\b(ddp|fsdp|pp|tp|cp) (\d+)", text)}
    mb = re.search(r"(\d+) micro-batches", text)
    return dict(dp=deg.get("ddp", deg.get("fsdp", 1)), tp=deg.get("tp", 1), pp=deg.get("pp", 1),
                cp=deg.get("cp", 1), sp="+ sp" in text, micro_batches=int(mb.group(1)) if mb else 1,
                fsdp=bool(re.search(r"\bfsdp\b", text)))


def layout_of(row, suite, problems):
    """The layout from the row's layout string, checked against train_gpt's mode "DPxPPxTP dp_mode" (its JSONL
    config, authoritative) or bench/cp's layout name; disagreements go to `problems`."""
    lay = parse_layout(str(row.get("layout") or ""))
    m = re.match(r"(\d+)x(\d+)x(\d+) (ddp|fsdp)$", str(row.get("mode") or ""))
    if m:
        mode = dict(dp=int(m.group(1)), pp=int(m.group(2)), tp=int(m.group(3)), fsdp=m.group(4) == "fsdp")
        if any(lay[k] != mode[k] for k in ("dp", "pp", "tp")):
            problems.append("layout %r against mode %r" % (row.get("layout"), row.get("mode")))
        lay.update(mode)
    if row.get("sequence_parallel") is not None and bool(row["sequence_parallel"]) != lay["sp"]:
        problems.append("layout %r against sequence_parallel %s" % (row.get("layout"), row["sequence_parallel"]))
        lay["sp"] = bool(row["sequence_parallel"])
    if row.get("micro_batches") and row["micro_batches"] != lay["micro_batches"]:
        problems.append("layout %r against micro_batches %s" % (row.get("layout"), row["micro_batches"]))
        lay["micro_batches"] = row["micro_batches"]
    if suite == "cp":  # bench/cp/run.sh: --layout DPx1xCPxTP --dp-mode fsdp --batch DP
        dp, cp, tp = CP_FACTORS[row["cp_layout"]]
        if (dp, cp, tp) != (lay["dp"], lay["cp"], lay["tp"]):
            problems.append("layout %r against cp_layout %r" % (row.get("layout"), row["cp_layout"]))
        lay.update(dp=dp, cp=cp, tp=tp, fsdp=True)
    return lay


def schedule_of(row, pp):
    """The pipeline schedule: the row's (train_gpt's JSONL, the pp driver's "1F1B"), else the system name's zb
    (parallel.sh, scale_traces.sh: --schedule zb-h1), else train_gpt's and the driver's default 1f1b."""
    if pp == 1:
        return ""
    words = str(row["system"]).lower().split("-")
    if row.get("schedule"):
        return str(row["schedule"]).lower()
    return "zb-h1" if "zb" in words else "interleaved" if "interleaved" in words else "1f1b"


def recompute_of(row, run):
    """The row's (train_gpt's JSONL, bench/cp), else RECOMPUTE= of the command (bench/llama/parallel.sh passes
    --recompute $RECOMPUTE), else none: train_gpt's default and every other script's (scale_traces.sh and
    slice70b.sh pass --recompute none; the 735m drivers have none)."""
    if row.get("recompute"):
        return row["recompute"]
    m = re.search(r"\bRECOMPUTE=(none|selective|full)\b", run.get("command") or "")
    return m.group(1) if m else "none"


def keeps_gathered(d, row):
    """src/train/parallelize.cpp keepsGatheredThroughStep under --fsdp-keep-gathered auto (no script passes the
    flag): FSDP, >= 2 micro-batches, this rank's units all gathered (bf16, +2 bytes with FP8) within a quarter of
    the GPU; the flag exists since KEEP_GATHERED_SINCE."""
    if d["sharding"] != "fsdp" or d["micro_batches"] < 2 or str(d["date"]) < KEEP_GATHERED_SINCE:
        return False
    numel = (row.get("params_M") or 0) * 1e6 / d["pp"]
    gib = numel * (2 + (2 if d["precision"] == "fp8" else 0)) / 2 ** 30
    return 0 < gib <= 0.25 * CARD_GIB.get(d["card"], 0)


def scope_of(row, run, suite, preset):
    """"in", or why the planner should not predict the row."""
    system, layout = str(row["system"]), str(row.get("layout") or "")
    if system.startswith("tessera-py"):
        return "python binding (tessera-py), not train_gpt's step"
    if preset in MOE_PRESETS or suite == "moe":
        return "MoE model"
    if "rank 0 alone" in layout or row.get("fake_world"):
        how = "communication emulated" if row.get("fake_comm") else "no communication"
        return "probe: rank 0 of %s alone on one GPU, fake communicator (%s)" % (row.get("fake_world") or 2, how)
    if "predicted on one GPU" in layout or row.get("emulated"):
        return "probe: pipeline predicted on one GPU from unit costs (simulated schedule)"
    if suite == "checkpoint" and system != "tessera-none":
        return "checkpoint: the row measures a save's cost (%s saves), not a plain step" % system.split("-")[-1]
    return "in"


def describe(row, run, suite):
    """One row's description (KEYS), and the problems found while reading it."""
    problems = []
    card, host_gpus = machine_of(run, row)
    preset, overrides = model_of(row, run)
    lay = layout_of(row, suite, problems)
    gpus, gb, mbs = row.get("gpus"), row.get("global_batch"), lay["micro_batches"]
    mb = gb / (lay["dp"] * mbs) if gb else None
    if mb is not None and mb == int(mb):
        mb = int(mb)
    fsdp = lay["fsdp"] or re.search(r"\bfsdp\b", str(row.get("mode") or "")) is not None
    d = dict(suite=suite, run=run.get("run"), system=row["system"], date=row.get("date") or run.get("date"),
             card=card, host_gpus=host_gpus, model=preset, overrides=overrides, gpus=gpus,
             seq_len=row.get("seq_len"), global_batch=gb, micro_batch=mb, micro_batches=mbs, dp=lay["dp"],
             tp=lay["tp"], pp=lay["pp"], cp=lay["cp"],
             sharding="fsdp" if fsdp else "ddp" if lay["dp"] > 1 else "none", sp=lay["sp"],
             schedule=schedule_of(row, lay["pp"]), precision="fp8" if "fp8" in str(row.get("precision")) else "bf16",
             recompute=recompute_of(row, run), keep_gathered=False, flags=flags_of(row, run),
             step_ms=row.get("step_ms"), tokens_per_s=row.get("tokens_per_s"), peak_mem_gib=row.get("peak_mem_gib"),
             scope=scope_of(row, run, suite, preset))
    d["keep_gathered"] = keeps_gathered(d, row)
    return d, problems


def check(d):
    """The in-scope row's arithmetic: degrees against GPUs, the batch split, step time against tokens/s."""
    out = []
    if d["dp"] * d["tp"] * d["pp"] * d["cp"] != d["gpus"]:
        out.append("dp %d x tp %d x pp %d x cp %d != gpus %s" % (d["dp"], d["tp"], d["pp"], d["cp"], d["gpus"]))
    if not isinstance(d["micro_batch"], int) or d["dp"] * d["micro_batch"] * d["micro_batches"] != d["global_batch"]:
        out.append("global batch %s != dp %d x micro_batch %s x micro_batches %d"
                   % (d["global_batch"], d["dp"], d["micro_batch"], d["micro_batches"]))
    if d["tokens_per_s"] and d["step_ms"] and d["seq_len"] and d["global_batch"]:
        want = d["seq_len"] * d["global_batch"] / d["tokens_per_s"] * 1e3
        if abs(d["step_ms"] - want) > 0.02 * want:
            out.append("step_ms %s but seq_len x global_batch / tokens_per_s = %.2f ms (%+.1f %%)"
                       % (d["step_ms"], want, 100 * (d["step_ms"] / want - 1)))
    return out


def rows(repo_root, problems=None):
    """Every tessera train row of repo_root/bench/results/*.json, described (KEYS), in file and run order.
    `problems` (a list), when given, receives (description, problem) pairs: reading and arithmetic."""
    out = []
    for path in sorted(glob.glob(os.path.join(repo_root, "bench", "results", "*.json"))):
        with open(path) as f:
            doc = json.load(f)
        for run in doc.get("runs", []):
            for row in run.get("rows", []):
                if row.get("kind") != "train" or not str(row.get("system", "")).startswith("tessera"):
                    continue
                d, found = describe(row, run, doc.get("suite"))
                if d["scope"] == "in":
                    found += check(d)
                if problems is not None:
                    problems.extend((d, p) for p in found)
                out.append(d)
    return out


def line(d):
    """One row in words."""
    ov = ",".join("%s=%s" % kv for kv in d["overrides"].items())
    lay = "dp%d tp%d pp%d cp%d %s%s%s" % (d["dp"], d["tp"], d["pp"], d["cp"], d["sharding"], "+sp" * d["sp"],
                                          " " + d["schedule"] if d["schedule"] else "")
    text = "%-3s %s/%s %s [%s, %s]: %s%s T%s %d gpu %s gb %s = mb %s x %d %s rc=%s%s%s %s ms" % (
        "in" if d["scope"] == "in" else "out", d["suite"], d["run"], d["system"], d["card"], d["date"], d["model"],
        "(" + ov + ")" if ov else "", d["seq_len"], d["gpus"], lay, d["global_batch"], d["micro_batch"],
        d["micro_batches"], d["precision"], d["recompute"], " keep-gathered" * d["keep_gathered"],
        " flags=" + ",".join(d["flags"]) if d["flags"] else "", d["step_ms"])
    return text if d["scope"] == "in" else text + "  -- " + d["scope"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", metavar="OUT", help="write the rows (in scope; with --all every row) as JSON")
    ap.add_argument("--all", action="store_true", help="also the out-of-scope rows, with their reason")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    a = ap.parse_args(argv)
    problems = []
    found = [d for d in rows(a.root, problems) if a.all or d["scope"] == "in"]
    for d in found:
        print(line(d))
    n_in = sum(d["scope"] == "in" for d in found)
    print("# %d rows in scope%s" % (n_in, ", %d out" % (len(found) - n_in) if a.all else ""), file=sys.stderr)
    for d, p in problems:
        if a.all or d["scope"] == "in":
            print("# CHECK %s/%s %s (%s): %s" % (d["suite"], d["run"], d["system"], d["date"], p), file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{k: d[k] for k in KEYS} for d in found], f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
