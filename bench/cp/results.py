#!/usr/bin/env python3
"""bench/cp/run.sh's logs -> bench/results/cp.{json,md}: one row per run (<system>-<model>-<T>-<layout>.log,
its RESULT line: train_gpt's through bench/results.py from-jsonl, PyTorch's from torch_cp.py), with
  mfu         tokens/s x F / (gpus x PEAK), F = 6 (L x block parameters + V d) + 12 L d T: train_gpt's and
              torchtitan's count, attention's two matmuls counted over every (query, key) pair, forward and
              backward (src/models/config.cpp flopsPerToken); PEAK 989e12 (H100/H200 bf16 dense)
  mfu_causal  the same with 6 L d T: only the causal half that is computed
  vs_pytorch  tokens/s over PyTorch's row of the same model, length and layout
  results.py OUTDIR... [--results DIR] [--name cp] [--peak-tflops 989]
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
LAYOUT_ORDER = ("cp4", "fsdp2xcp2", "cp2xtp2")
NAME = re.compile(r"^(tessera|pytorch)-(.+)-(\d+)-([a-z0-9]+)$")
COLS = ["model", "seq_len", "layout", "system", "gpus", "tokens_per_s", "step_ms", "mfu", "mfu_causal",
        "peak_mem_gib", "vs_pytorch", "recompute"]


def flops_per_token(model, seq_len, causal=False):
    c = MODELS[model]
    hd = c["d"] // c["heads"]
    block = 2 * c["d"] ** 2 + 2 * c["d"] * c["kv_heads"] * hd + 3 * c["d"] * c["ffn"] + 2 * c["d"]
    attention = (6.0 if causal else 12.0) * c["layers"] * c["d"] * seq_len
    return 6.0 * (c["layers"] * block + c["vocab"] * c["d"]) + attention


def jsonl_recompute(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("event") == "config":
                return r.get("recompute")
    return None


def rows_of(dirs, peak, failed):
    rows = []
    for d in dirs:
        for f in sorted(os.listdir(d)):
            m = NAME.match(f[:-4]) if f.endswith(".log") else None
            if not m or m.group(2) not in MODELS:
                continue
            found = common.read_results(os.path.join(d, f))
            if not found:
                failed.add(f[:-4])
                continue
            failed.discard(f[:-4])
            r = found[-1]
            system, model, seq, layout = m.group(1), m.group(2), int(m.group(3)), m.group(4)
            row = dict(model=model, seq_len=seq, layout=layout, system=system, gpus=r["gpus"],
                       tokens_per_s=r["tokens_per_s"], step_ms=r["step_ms"], peak_mem_gib=r.get("peak_mem_gib"),
                       recompute=r.get("recompute"), run=f[:-4])
            if row["recompute"] is None:  # train_gpt's: its JSONL log's config
                row["recompute"] = jsonl_recompute(os.path.join(d, f[:-4] + ".jsonl"))
            for key, causal in (("mfu", False), ("mfu_causal", True)):
                row[key] = round(r["tokens_per_s"] * flops_per_token(model, seq, causal) / (r["gpus"] * peak), 3)
            if r.get("last_loss") is not None:
                row["last_loss"] = r["last_loss"]
            rows = [x for x in rows if x["run"] != row["run"]] + [row]  # a later OUTDIR's run replaces it
    twins = {(r["model"], r["seq_len"], r["layout"]): r for r in rows if r["system"] == "pytorch"}
    for r in rows:
        twin = twins.get((r["model"], r["seq_len"], r["layout"]))
        if r["system"] == "tessera" and twin:
            r["vs_pytorch"] = round(r["tokens_per_s"] / twin["tokens_per_s"], 3)
    order = {k: i for i, k in enumerate(LAYOUT_ORDER)}
    rows.sort(key=lambda r: (r["model"], r["seq_len"], order.get(r["layout"], 99), r["system"] != "pytorch"))
    return rows


def read_text(dirs, name):
    lines = []
    for d in dirs:
        p = os.path.join(d, name)
        if os.path.exists(p):
            lines += [x.strip() for x in open(p) if x.strip()]
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--results", default=os.path.join(HERE, "..", "results"))
    ap.add_argument("--name", default="cp")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    a = ap.parse_args(argv)
    failed = set()
    rows = rows_of(a.dirs, a.peak_tflops * 1e12, failed)
    if not rows:
        print("cp/results.py: no RESULT lines in %s" % " ".join(a.dirs), file=sys.stderr)
        return 1
    machines = sorted(set(read_text(a.dirs, "machine.txt"))) or ["?"]
    doc = {"name": a.name, "date": common.now(), "machine": "; ".join(machines),
           "command": " && ".join(read_text(a.dirs, "commands.txt")) or "bench/cp/run.sh",
           "config": "bf16; one sequence per data-parallel replica; FSDP over dp x cp on both sides; K and V "
                     "all-gathered over cp, load-balanced chunks (r and 2 cp - 1 - r) on both sides",
           "method": "3 warm-ups then the median of STEPS steps, the device synchronised around each step; peak "
                     "memory = max allocated by the caching allocator on the fullest rank; mfu = tokens/s x (6 (L "
                     "block params + V d) + 12 L d T) / (gpus x %g TFLOP/s); mfu_causal the same with 6 L d T"
                     % a.peak_tflops,
           "notes": ["PyTorch: tests/models/torch_llama.py under torch.distributed.tensor.experimental.context_parallel "
                     "(SDPA is_causal, rotate method allgather, load balancing on) and FSDP2 fully_shard per block "
                     "and the root (bf16 parameters, fp32 reduction), AdamW fused, clipping at 1.0",
                     "cp2xtp2 has no PyTorch row (context_parallel with DTensor TP is not run here)",
                     "a (model, length, layout) without a row did not fit or did not finish: see the run's log"],
           "rows": rows}
    lines = common.table(rows, COLS)
    if failed:
        doc["missing"] = sorted(failed)
        lines += ["", "No row (out of memory, timed out or failed; see the logs): " + ", ".join(sorted(failed))]
    print(common.write(doc, a.results, "Context parallelism on %s GPUs: train_gpt --cp beside PyTorch's "
                       "context_parallel" % "/".join(sorted({str(r["gpus"]) for r in rows})),
                       [(None, lines)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
