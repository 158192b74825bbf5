#!/usr/bin/env python3
"""Files a bench/moe/run.sh log directory as one run of suite moe (bench/results/moe.{json,md}) through
bench/results.py's writer (put_run): train_gpt's rows from its JSONL logs (3 warm-ups, then the median step; the
fullest rank's peak over all steps; moe_load_max_over_mean: the worst layer's max / mean expert load of a step,
loads summed over the data-parallel ranks, its median over the timed steps), the anchor's RESULT lines
(bench/moe/anchor.py), and the correctness check (check.json) as a table of the run.
  bench/moe/file.py LOGS --machine M --environment E --command C [--run R] [--results DIR]
A tessera row named *-balanced ran with --moe-force-balanced (the anchor's balanced rule), one with -fp8 in its
name --fp8 tensorwise (-fp8-experts: with --fp8-experts; the precision column says which; the anchor's rows are
bf16). vs_pytorch: tokens/s
over the anchor's row of the same routing on the same GPUs (compiled; eager where only that ran); mem_vs_pytorch:
peak memory over that row's."""
import argparse
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import results  # noqa: E402  (bench/results.py: the one writer)

WARM = 3
# Per model: its title, its full depth, the shape both sides ran and what each side left out of the real model.
MODELS = {
    "olmoe-1b-7b": dict(
        title="OLMoE-1B-7B shape", layers=16,
        shape="d 2048, {L} blocks, 16 heads, 16 kv heads, 64 experts top 8 of FFN 1024, vocab 50304 untied, "
              "q/k norm {qk}",
        model_note="no auxiliary load-balancing or z-loss (OLMoE trains with 0.01 and 0.001: left out on both sides), "
                   "no shared expert, top-8 probabilities not renormalised, dropless, softmax router in float32, "
                   "untied 50304-token head, RoPE theta 10000."),
    "qwen3-30b-a3b": dict(
        title="Qwen3-30B-A3B shape", layers=48,
        shape="d 2048, {L} blocks, 32 heads of 128, 4 kv heads, 128 experts top 8 of FFN 768, vocab 151936 untied, "
              "q/k norm {qk}, RoPE theta 1e6",
        model_note="no auxiliary load-balancing loss (Qwen3-MoE trains with 0.001: left out on both sides), no "
                   "shared expert, top-8 probabilities renormalised (norm_topk_prob), dropless, softmax router in "
                   "float32, untied 151936-token head, RMSNorm eps 1e-6."),
}


def median(xs):
    s = sorted(xs)
    return s[len(s) // 2]  # the upper median, as results.py from-jsonl


def layout(system, gpus):
    base = system.replace("-balanced", "").replace("-fp8-experts", "").replace("-fp8", "")
    if gpus == 1:  # tessera-single: DDP's path on one rank; *-fsdp and the anchor: FSDP over one rank
        return "single, fsdp" if base.endswith("-fsdp") or base.startswith("pytorch") else "single"
    return f"ep {gpus} + {'ddp' if base.endswith('-ddp') else 'fsdp'} {gpus}"


def precision(system):
    if system.endswith("-fp8-experts"):
        return "fp8 tensorwise + experts"
    return "fp8 tensorwise" if system.endswith("-fp8") else "bf16"


def tessera_row(path):
    cfg, steps = results.read_train_jsonl(path)
    timed = steps[WARM:]
    if not timed:
        print(f"file.py: {path}: {len(steps)} steps, none after {WARM} warm-ups", file=sys.stderr)
        return None
    system = os.path.splitext(os.path.basename(path))[0]
    med = median([s["step_ms"] for s in timed])
    at = min(timed, key=lambda s: abs(s["step_ms"] - med))
    spread = [s["moe_load_max_over_mean"] for s in timed if s.get("moe_load_max_over_mean") is not None]
    return dict(system=system, layout=layout(system, cfg["world"]), gpus=cfg["world"],
                routing="balanced" if system.endswith("-balanced") else "real",
                precision=precision(system), global_batch=cfg["batch"], seq_len=cfg["seq_len"], step_ms=round(med, 2),
                tokens_per_s=round(cfg["batch"] * cfg["seq_len"] / med * 1e3),
                mfu=at["mfu"] and round(at["mfu"] * at["step_ms"] / med, 3),
                peak_mem_gib=round(max(s["peak_mem_gib"] for s in steps), 2),
                load_max_over_mean=round(median(spread), 3) if spread else None,
                last_loss=round(steps[-1]["loss"], 4), params_M=round(cfg["params"] / 1e6, 1),
                layers=cfg["layers"], step_ms_all=[round(s["step_ms"], 2) for s in timed])


def anchor_rows(path):
    out = []
    for r in results.read_results(path):
        r = dict(r)
        gpus = r.get("gpus", 1)
        r.update(layout=layout(r["system"].replace("-balanced", ""), gpus), global_batch=r.pop("batch", None),
                 precision="bf16",
                 mfu=round(r["mfu"], 3) if r.get("mfu") is not None else None)
        r.pop("flops_per_token", None)
        out.append(r)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("logs")
    ap.add_argument("--results", default=os.path.join(HERE, "..", "results"))
    ap.add_argument("--run", default=None, help="the run's name (default: the model's)")
    ap.add_argument("--machine", required=True)
    ap.add_argument("--environment", default="")
    ap.add_argument("--command", required=True)
    ap.add_argument("--note", action="append", default=[], help="a note of this run (repeatable)")
    a = ap.parse_args()
    L = a.logs
    read = lambda name, default="": open(os.path.join(L, name)).read().strip() if os.path.exists(  # noqa: E731
        os.path.join(L, name)) else default
    settings = dict(kv.split("=", 1) for kv in read("settings.txt").split() if "=" in kv)
    name = settings.get("MODEL", "olmoe-1b-7b")
    spec = MODELS[name]
    full = spec["layers"]
    layers = int(settings.get("LAYERS", full))
    qk = settings.get("QK_NORM", "whole")

    rows = [r for p in sorted(glob.glob(os.path.join(L, "tessera-*.jsonl"))) for r in [tessera_row(p)] if r]
    rows += [r for p in sorted(glob.glob(os.path.join(L, "pytorch-*.log"))) for r in anchor_rows(p)]
    if not rows:
        print(f"file.py: no rows in {L}", file=sys.stderr)
        return 1
    for r in rows:  # tessera against the anchor on the same GPUs (compiled, else eager)
        if not r["system"].startswith("tessera"):
            continue
        same = [p for p in rows if p["system"].startswith("pytorch") and p["gpus"] == r["gpus"]
                and p["routing"] == r["routing"]]
        ref = next((p for p in same if "eager" not in p["system"]), None) or next(iter(same), None)
        if ref:
            r["vs_pytorch"] = round(r["tokens_per_s"] / ref["tokens_per_s"], 3)
            r["mem_vs_pytorch"] = round(r["peak_mem_gib"] / ref["peak_mem_gib"], 3)
    rows.sort(key=lambda r: (r["gpus"], not r["system"].startswith("tessera"), r["system"]))
    model = name if layers == full else f"{name}, {layers} of {full} layers"
    gpus = max(r["gpus"] for r in rows)

    tables, notes = [], []
    check = json.loads(read("check.json", "null"))
    if check:
        trows = [dict(run=name, backend=check["backend"].split(";")[0].split(" (")[0], losses=" ".join(f"{x:.7f}" for x in (ls or [])) or "none",
                      max_rel_gap="%.2e" % check["max_rel"][name] if name in check["max_rel"] else "—")
                 for name, ls in check["losses"].items()]
        verdict = "passed" if check["passed"] else "FAILED"
        tables.append(dict(title=f"Correctness of expert parallelism: --ep 2 against one rank, moe-tiny, fp32 ({verdict}, "
                                 f"tolerance {check['tolerance']:g} relative)",
                           columns=["run", "backend", "losses", "max_rel_gap"], rows=trows))
        notes.append(f"Correctness ({verdict}): train_gpt --model moe-tiny on the Brown corpus (--data "
                     "data/brown/brown_sp4096_text_document --vocab-size 4096 --split 98,2 --eod-token 2), fp32, "
                     "seed 1234, global batch 8, 5 steps: one rank (check-ep1) against --ep 2 in DDP and --ep 2 "
                     f"--dp-mode fsdp on two ranks ({check['backend']}); largest relative loss gaps "
                     + ", ".join(f"{k} {v:.1e}" for k, v in check["max_rel"].items()) + ".")
    else:
        notes.append("No correctness check in this run's logs.")
    if gpus < 4:
        notes.append(f"Issue 54 asks for 4 GPUs; this run had {gpus} (ep = the GPUs, one sequence per GPU)"
                     + (": no expert parallelism, and the anchor's FSDP2 spans one rank (its all-gathers are local "
                        "bf16 copies of the weights)." if gpus == 1 else "."))
    if layers != full:
        notes.append(f"{layers} of the model's {full} blocks: the fp32 weights, gradients and Adam moments of all "
                     f"of them (16 bytes a parameter) leave too little room for the activations on {gpus} GPU"
                     f"{'s' if gpus > 1 else ''}.")
    notes += [
        "Routing: real (the router's top 8) and balanced (token i of a rank's batch -> experts (i k + j) mod E, "
        "weighted by the router's probabilities of those: train_gpt --moe-force-balanced, the anchor's --routing "
        "balanced); vs_pytorch and mem_vs_pytorch compare rows of the same routing. load_max_over_mean: per step "
        "the worst layer's max / mean expert load over all ranks (train_gpt: the median over the timed steps).",
        f"Both systems: q/k norm {qk} (RMSNorm in float32 "
        + {"whole": "over the whole q and k projections, OLMoE's", "per-head": "over each head before RoPE, Qwen3's",
           "none": "left out on both sides"}.get(qk, qk) + "), " + spec["model_note"],
        "MFU on active parameters: train_gpt's flopsPerToken, 6 x (L x active block parameters + V x d) + 12 x L x H "
        "x hd x T per token (H heads of hd), active block parameters = attention + norms + router (E x d) + the 8 "
        "chosen experts' 3 x d x f; the flop_convention column's 'block parameters' are these active ones.",
        f"train_gpt: --model {name} --num-layers L --qk-norm Q "
        + ("--moe-norm-topk off " if name == "olmoe-1b-7b" else "") + "--moe-aux-loss-coeff 0 "
        "--moe-z-loss-coeff 0 --moe-shared-expert-intermediate-size 0 --moe-first-dense-layers 0 --untie-embeddings "
        "--seq-len 4096 --precision bf16 --recompute none --batch <gpus> --ep <gpus> [--dp-mode fsdp] "
        "[--moe-force-balanced], synthetic "
        "tokens; its expert GEMMs are at::_grouped_mm on the device; with ep > 1 the counts are read on the host "
        "(docs/design/models.md, \"Mixture of experts\").",
        "The anchor (bench/moe/anchor.py, torchtitan-style, written for this benchmark): FSDP2 fully_shard on each "
        "block and the root over all ranks (bf16 parameters, fp32 reduction), each layer's experts their own unit "
        "over the ranks holding the same experts (world / ep), the router a float32 unit; experts as 3D weights "
        "through torch._grouped_mm (int32 cumulative offsets on the device); expert parallel by "
        "all_to_all_single (counts first, one host read per layer, tokens permuted by expert); fused AdamW, clip "
        "1.0; torch.compile on each block's static-shape parts (attention sub-layer, router) and the SwiGLU "
        "product, the dispatch and grouped GEMMs eager; random tokens, one fixed batch; balanced routing: token i "
        "-> experts (i k + j) mod E. Its rows named pytorch-eager-* (if any) ran with no compile.",
    ]
    where = "on one GPU (ep 1)" if gpus == 1 else f"expert parallel over {gpus} GPUs"
    notes += a.note
    run = dict(run=a.run or name, title=f"{spec['title']}{'' if layers == full else f' ({layers} of {full} blocks)'} {where}: "
                                "train_gpt beside a torchtitan-style PyTorch MoE",
               date=read("date.txt") or None, machine=a.machine, environment=a.environment, command=a.command,
               config=f"{model}: " + spec["shape"].format(L=layers, qk=qk) + ", seq 4096, bf16 over fp32 weights, "
                      "AdamW, clip 1.0, no recompute; "
                      "one sequence per GPU a step (global batch = the GPUs)",
               method="train_gpt: 3 warm-ups then the median of the timed steps of its JSONL log; the anchor: 3 "
                      "warm-ups (2 more before its balanced steps) then the median of 10 steps, the device "
                      "synchronised around each; peak memory = the caching allocator's max allocated on the "
                      "fullest rank",
               columns=["routing", "load_max_over_mean", "vs_pytorch", "mem_vs_pytorch"],
               rows=rows, tables=tables, notes=notes)
    run = {k: v for k, v in run.items() if v not in (None, "", [])}
    md, problems = results.put_run(a.results, "moe", run, dict(kind="train", model=model, seq_len=4096,
                                                                precision="bf16"))
    print(md)
    for p in problems:
        print("file.py: does not validate: " + p, file=sys.stderr)
    return 1 if problems or (check and not check["passed"]) else 0


if __name__ == "__main__":
    sys.exit(main())
