#!/usr/bin/env python3
"""Combines bench/train/run.sh's runs into bench/results/train_gpt_<N>gpu.{json,md}.

Each log (LOG_DIR/<system>.log) holds one RESULT line; the file name names the row. Per row:
  scaling = tokens/s over (GPUs x the 1-GPU tokens/s of the same model: pytorch-single for the
            PyTorch and tessera-py rows (the anchor's Python GPT), tessera-train-single for train_gpt)
            when the single runs are in the same set of logs
  vs_pytorch = tokens/s over the PyTorch row of the same layout (single, dp, fsdp, tp, pp); none for
               layouts PyTorch's anchor has no equivalent of (the mixed dp x tp, pp x tp rows)
"""
import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from result_lines import read_results  # noqa: E402

LAYOUT_OF = {"single": "single", "ddp": "dp", "py-ddp": "dp", "fsdp": "fsdp", "py-fsdp": "fsdp", "tp": "tp", "tp-sp": "tp", "pp": "pp"}


def layout(system):
    for prefix in ("pytorch-", "tessera-train-", "tessera-"):
        if system.startswith(prefix):
            rest = system[len(prefix):]
            for key in sorted(LAYOUT_OF, key=len, reverse=True):
                if rest == key or rest.startswith(key + "-"):
                    return LAYOUT_OF[key]
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--results", required=True)
    ap.add_argument("--name", default="", help="result file name (default train_gpt_<N>gpu)")
    a = ap.parse_args()
    name = a.name or f"train_gpt_{a.gpus}gpu"
    rows = []
    for path in a.logs:
        system = os.path.splitext(os.path.basename(path))[0]
        found = read_results(path) if os.path.exists(path) else []
        if found:
            rows.append(dict(found[-1], system=system, gpus=found[-1].get("world", 1)))
    by = {r["system"]: r for r in rows}
    for r in rows:
        # The Python rows train the anchor's Python model: their 1-GPU reference is PyTorch's.
        same_model = r["system"].startswith(("pytorch", "tessera-py"))
        single = by.get("pytorch-single" if same_model else "tessera-train-single")
        if single and r["gpus"] > 0:
            r["scaling"] = round(r["tokens_per_s"] / (r["gpus"] * single["tokens_per_s"]), 3)
        lay = layout(r["system"])
        ref = next((x for x in rows if x["system"].startswith("pytorch-") and layout(x["system"]) == lay), None)
        if lay and ref and not r["system"].startswith("pytorch-"):
            r["vs_pytorch"] = round(r["tokens_per_s"] / ref["tokens_per_s"], 3)
    out = dict(name=name, date=datetime.date.today().isoformat(), machine=a.machine,
               command=a.command, rows=rows)
    os.makedirs(a.results, exist_ok=True)
    base = os.path.join(a.results, name)
    with open(base + ".json", "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    cols = ["system", "mode", "gpus", "step_ms", "tokens_per_s", "scaling", "vs_pytorch", "mfu_vs_989", "peak_mem_GiB"]
    with open(base + ".md", "w") as f:
        versus = " vs PyTorch" if any(r["system"].startswith("pytorch") for r in rows) else ""
        f.write(f"# train_gpt{versus} on {a.gpus} GPU(s), GPT-735M bf16\n\n{out['date']}, {a.machine}\n\n"
                f"`{a.command}`\n\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n")
        for r in rows:
            f.write("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |\n")
    print(open(base + ".md").read())
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
