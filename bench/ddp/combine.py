#!/usr/bin/env python3
"""Combines the RESULT lines of the DDP benchmark's runs (torch_ddp.py and tessera_bench_ddp)
into bench/results/ddp.json (DESIGN.md's format) and ddp.md beside it.

Rows: pytorch-single, tessera-single (1 GPU), pytorch-ddp, tessera-ddp,
tessera-ddp-view (bucket views; 2 GPUs), then any other rows the runs printed (variants, e.g.
tessera-ddp-carve16: 16 SMs kept free of backward's GEMMs; tessera-single-carve16: the same
carveout on one GPU over the whole step, i.e. what it costs without communication). scaling = tokens/s over (gpus x the 1-GPU tokens/s of the
same system); scaling_vs_pytorch_single uses PyTorch's 1-GPU row for every system. A tessera
variant with "fused" (weight gradients summed in fp32 in the GEMM) is scaled against
tessera-single-fused where that row ran: the same model code on one GPU, the faster reference.
Hidden communication is an estimate, not a measurement of overlap:
  exposed = (step_ms of the DDP row - step_ms of the same system's 1-GPU row) / allreduce_ms
  hidden  = 1 - exposed, clamped to [0, 1]
where allreduce_ms is the time to all-reduce every gradient bucket (same sizes, fp32) back to
back with nothing else running. Any extra cost of DDP (hooks, copies into buckets) counts as
exposed communication here.
"""
import argparse, datetime, json, os, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from result_lines import read_results as parse  # noqa: E402

ORDER = ("pytorch-single", "tessera-single", "pytorch-ddp", "tessera-ddp", "tessera-ddp-view",
         "tessera-ddp-bf16")
SINGLE = {s: ("pytorch-single" if s.startswith("pytorch") else "tessera-single") for s in ORDER if "-ddp" in s}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--machine", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--config", default="D=2048 L=12 V=32000 T=1024 B=8 STEPS=10")
    ap.add_argument("--json", required=True)
    ap.add_argument("--md", required=True)
    a = ap.parse_args()
    res = {}
    for p in a.logs:
        if os.path.exists(p):
            for r in parse(p):
                res[r["system"]] = r
    if not res:
        sys.exit("combine.py: no RESULT lines in %s" % " ".join(a.logs))
    rows = []
    # The known rows first, then any other run's rows (in-process variants) in the order they came.
    for system in list(ORDER) + [s for s in res if s not in ORDER]:
        r = res.get(system)
        if r is None:
            continue
        if system not in ORDER and "-single" not in system:
            SINGLE[system] = "pytorch-single" if system.startswith("pytorch") else "tessera-single"
            if "fused" in (r.get("variant") or "").split("+") and "tessera-single-fused" in res:
                SINGLE[system] = "tessera-single-fused"
        row = {"system": system, "gpus": r["world"], "tokens_per_s": r["tokens_per_s"], "step_ms": r["step_ms"],
               "scaling": 1.0, "mfu": r["mfu_vs_989"], "peak_mem_gib": r["peak_mem_GiB"],
               "zero_grad": r.get("zero_grad"), "step_ms_all": r.get("step_ms_all"),
               "variant": r.get("variant"), "sm_carveout": r.get("sm_carveout"), "fused_wgrad": r.get("fused_wgrad")}
        if system in SINGLE:
            row["scaled_against"] = SINGLE[system]
        if system in SINGLE:
            one = res.get(SINGLE[system])
            row["scaling"] = round(r["tokens_per_s"] / (r["world"] * one["tokens_per_s"]), 3) if one else None
            ps = res.get("pytorch-single")
            row["scaling_vs_pytorch_single"] = round(r["tokens_per_s"] / (r["world"] * ps["tokens_per_s"]), 3) if ps else None
            row["allreduce_ms"] = r.get("allreduce_ms")
            row["buckets"] = r.get("buckets")
            if r.get("bucket_mib"):
                row["bucket_mib"] = r["bucket_mib"]
            if one and r.get("allreduce_ms"):
                exposed = (r["step_ms"] - one["step_ms"]) / r["allreduce_ms"]
                row["exposed_comm_fraction"] = round(exposed, 3)
                row["hidden_comm_fraction"] = round(min(1.0, max(0.0, 1.0 - exposed)), 3)
        rows.append(row)
    missing = [s for s in ORDER if s not in res]
    # The best tessera DDP row of the run (any variant), against the same targets.
    best = max((r for r in rows if r["system"].startswith("tessera-ddp") and r.get("scaling") is not None),
               key=lambda r: r["scaling"], default=None)
    by = {r["system"]: r for r in rows}
    checks = {}
    t, p = by.get("tessera-ddp"), by.get("pytorch-ddp")
    if t and t.get("scaling") is not None:
        checks["tessera_ddp_scaling_ge_0.97"] = t["scaling"] >= 0.97
    if t and p:
        checks["tessera_ddp_peak_mem_le_pytorch_ddp"] = t["peak_mem_gib"] <= p["peak_mem_gib"]
    bv = by.get("tessera-ddp-view")
    if bv and bv.get("scaling") is not None:
        checks["tessera_ddp_view_scaling_ge_0.97"] = bv["scaling"] >= 0.97
    if bv and p:
        checks["tessera_ddp_view_peak_mem_le_pytorch_ddp"] = bv["peak_mem_gib"] <= p["peak_mem_gib"]
    if best:
        checks["best_tessera_ddp_variant"] = best["system"]
        checks["best_tessera_ddp_scaling_ge_0.97"] = best["scaling"] >= 0.97
        if p:
            checks["best_tessera_ddp_peak_mem_le_pytorch_ddp"] = best["peak_mem_gib"] <= p["peak_mem_gib"]
    method = ("the anchors' GPT (%s; heads of 128; %s M params), fp32 params under bf16 autocast, fused AdamW "
              "lr 1e-4, random tokens, batch B per GPU; 3 warm-ups then the median of STEPS steps, device "
              "synchronised around each step; peak memory = max allocated by the caching allocator"
              % (a.config, next(iter(res.values())).get("params_M")))
    hidden_def = ("hidden_comm_fraction = 1 - (DDP step_ms - same system's 1-GPU step_ms) / allreduce_ms, clamped "
                  "to [0,1]; allreduce_ms = all-reducing every gradient bucket (same sizes, fp32) back to back "
                  "without backward. An estimate: any other DDP overhead counts as exposed communication.")
    doc = {"name": "ddp", "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": a.machine, "command": a.command, "config": a.config, "method": method, "hidden_comm_definition": hidden_def,
           "params_M": next(iter(res.values())).get("params_M"), "rows": rows, "checks": checks, "missing": missing}
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    fmt = lambda v, spec: "—" if v is None else format(v, spec)
    md = ["# DDP: tessera vs PyTorch DDP on the anchors' GPT", "", "- date: %s" % doc["date"], "- machine: %s" % a.machine,
          "- command: `%s`" % a.command, "- method: %s" % method, "- hidden communication: %s" % hidden_def, "",
          "| system | GPUs | tokens/s | step ms | scaling | scaled against | MFU | peak GiB | all-reduce alone ms | hidden comm |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append("| %s | %d | %s | %.2f | %s | %s | %.3f | %.2f | %s | %s |" % (
            r["system"], r["gpus"], format(r["tokens_per_s"], ","), r["step_ms"], fmt(r["scaling"], ".3f"),
            r.get("scaled_against") or "—", r["mfu"], r["peak_mem_gib"], fmt(r.get("allreduce_ms"), ".2f"),
            fmt(r.get("hidden_comm_fraction"), ".2f")))
    if missing:
        md += ["", "Missing (their run failed; see the logs): %s" % ", ".join(missing)]
    with open(a.md, "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    for k, v in checks.items():
        print("DONE-WHEN %s: %s" % (k, v if isinstance(v, str) else "met" if v else "NOT met"))
    if missing:
        print("MISSING rows: %s" % ", ".join(missing))


if __name__ == "__main__":
    main()
