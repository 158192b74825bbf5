#!/usr/bin/env python3
"""PyTorch's side of the one-GPU benchmark (bench/single_gpu/run.sh, issue 26) and the combiner.

  single_gpu.py torch (--model gpt735m|llama3-1b --batch B | --shape SPEC) --mode eager|compile [--steps N]
      One GPU, bf16 autocast over fp32 weights, random tokens: forward, cross-entropy in float32,
      backward, gradient clipping (max norm 1, as train_gpt's default), torch.optim.AdamW(fused=True)
      (no weight decay on norms and biases, as train_gpt), zero_grad. The GPT is the anchors' GPT-735M
      (bench/torch_anchor.py's model), the Llama the independent PyTorch Llama (tests/models/torch_llama.py)
      with llama3-1b's shape, or with a shape that is not a preset (--shape: shapes.py's spec, llama3-1b with
      overrides, the batch its B). Prints a RESULT line: the median step after 5 warm-ups, tokens/s, MFU
      (train_gpt's FLOP counts, 989 TFLOP/s peak), peak memory; "oom": true when it ran out of memory.
  single_gpu.py adamw --model gpt735m|llama3-1b [--steps N]
      The optimizer phase alone: torch.optim.AdamW(fused=True) over the model's parameters with fixed
      random gradients (tessera's side: tessera_bench_adamw). RESULT line with the mean step.
  single_gpu.py combine LOG_DIR --results DIR --machine TEXT --command TEXT
      Reads every RESULT line of LOG_DIR/*.log and writes DIR/single_gpu.{json,md} with bench/results.py's
      writer and format: each model's rows beside PyTorch eager's and compiled's (vs_pytorch_eager,
      vs_pytorch_compile), the optimizer rows beside PyTorch's fused AdamW (vs_pytorch_fused), and the
      issue's targets and whether they hold (the member "targets"); the shapes' logs (shape-NAME.*.log) as one
      table of their own (shapes.table), with the kernel summaries of --profile-dir where a shape misses.
"""
import argparse
import glob
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import results  # noqa: E402  (the one result format and writer)
import shapes  # noqa: E402  (the shapes that are not presets)

PEAK = 989e12
MODELS = {"gpt735m": "735m", "llama3-1b": "llama3-1b"}  # our name -> train_gpt's preset


def build(name, batch, shape=""):
    """(model, flops per token, seq len, vocab, no-decay predicate) for one of MODELS or a shape's spec."""
    import torch
    if name == "gpt735m" and not shape:
        os.environ["B"] = str(batch)
        import torch_anchor as ta  # the anchors' GPT-735M; its shape is read from the environment
        return ta.GPT(), ta.flops_per_token(), ta.T, ta.V, lambda n: n.endswith("bias") or ".ln" in n or n.startswith("ln")
    sys.path.insert(0, os.path.join(HERE, "..", "llama"))
    import torch_llama_train as tl
    cfg = tl.Config(**(shapes.config(shape)[1] if shape else tl.PRESETS[name]))
    model = tl.Llama(cfg)
    tl.tessera_init(model, 1234)
    torch.manual_seed(0)
    return model, tl.flops_per_token(cfg), cfg.seq_len, cfg.vocab, lambda n: n.endswith("norm.weight")


def optimizer(model, no_decay):
    import torch
    decay, rest = [], []
    for n, p in model.named_parameters():
        (rest if no_decay(n) else decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=1e-4, fused=True)


def run_torch(a):
    import torch
    import torch.nn.functional as F
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    res = dict(system=f"pytorch-{a.mode}", model=a.model, batch=a.batch)
    if a.shape:
        name, _, a.batch = shapes.config(a.shape)
        res.update(model="shape-" + name, spec=a.shape, batch=a.batch)
    try:
        model, fpt, seq, vocab, no_decay = build(a.model, a.batch, a.shape)
        model.to(dev)
        opt = optimizer(model, no_decay)
        run = torch.compile(model) if a.mode == "compile" else model
        g = torch.Generator(device=dev).manual_seed(1234)
        x = torch.randint(0, vocab, (a.batch, seq), device=dev, generator=g)
        y = torch.randint(0, vocab, (a.batch, seq), device=dev, generator=g)
        torch.cuda.reset_peak_memory_stats(dev)
        times = []

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = run(x)
                loss = F.cross_entropy(out.flatten(0, 1).float(), y.flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        for _ in range(a.warm + a.steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = step()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        if a.profile:  # two more steps under torch.profiler (bench/profile/summarize.py reads the trace)
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=acts) as prof:
                for _ in range(2):
                    step()
                torch.cuda.synchronize()
            prof.export_chrome_trace(a.profile)
        med = statistics.median(times[a.warm:])
        tps = a.batch * seq / med * 1e3
        res.update(seq_len=seq, step_ms=round(med, 2), tokens_per_s=round(tps), mfu=round(tps * fpt / PEAK, 4),
                   peak_mem_GiB=round(torch.cuda.max_memory_allocated(dev) / 2**30, 2), last_loss=round(loss.item(), 4))
    except torch.cuda.OutOfMemoryError:
        res.update(oom=True)
    print("RESULT " + json.dumps(res), flush=True)


def run_adamw(a):
    import torch
    dev = torch.device("cuda", 0)
    model, _, _, _, no_decay = build(a.model, 1)
    model.to(dev)
    opt = optimizer(model, no_decay)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-5  # a norm below 1 (tessera_bench_adamw's too): clipping keeps them
    for system in ("pytorch-adamw-fused", "pytorch-clip+adamw-fused"):
        def step():
            if system.startswith("pytorch-clip"):  # train_gpt's phase: clipping at 1.0 (foreach), then AdamW
                torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)  # norm < 1: scales by 1, unchanged
            opt.step()
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3 / a.steps
        print("RESULT " + json.dumps(dict(system=system, model=MODELS[a.model], tensors=len(params),
                                          params_M=round(sum(p.numel() for p in params) / 1e6, 1),
                                          step_ms=round(ms, 3))), flush=True)


# The targets, per model: (reference system, the least speed ratio against it).
TARGETS = {"735m": [("pytorch-compile", 1.00), ("pytorch-eager", 1.08)], "llama3-1b": [("pytorch-compile", 1.05)]}


def combine(a):
    rows = []
    for path in sorted(glob.glob(os.path.join(a.log_dir, "*.log"))):
        for r in results.read_results(path):  # logs are named MODEL.SYSTEM.log (run.sh)
            r.setdefault("model", os.path.basename(path).split(".")[0])
            r["model"] = MODELS.get(r["model"], r["model"])
            r.setdefault("gpus", 1)
            rows.append(r)
    shaped = [r for r in rows if str(r["model"]).startswith("shape-")]
    rows_preset = [r for r in rows if not str(r["model"]).startswith("shape-")]
    train = [r for r in rows_preset if "adamw" not in r["system"]]
    opt = [r for r in rows_preset if "adamw" in r["system"]]
    sections, verdicts = [], []
    for model in sorted({r["model"] for r in train}):
        mine = sorted((r for r in train if r["model"] == model), key=lambda r: r["system"])
        ref = {r["system"]: r for r in mine if "step_ms" in r}
        results.derive(ref, versus=("pytorch-eager", "pytorch-compile"))  # vs_<system>: tokens/s over its
        for r in mine:
            if "step_ms" not in r:
                r["step_ms"] = "out of memory"
        sections.append((model, results.table(mine, ["system", "batch", "step_ms", "tokens_per_s", "mfu", "peak_mem_gib",
                                                     "vs_pytorch_eager", "vs_pytorch_compile"])))
        fused = ref.get("tessera-fused")
        for system, least in TARGETS.get(model, []):
            if fused and system in ref:
                got = ref[system]["step_ms"] / fused["step_ms"]
                verdicts.append(f"{model}: tessera-fused {got:.3f}x {system} (target >= {least}): "
                                f"{'holds' if got >= least else 'NOT MET'}")
        if fused and "pytorch-eager" in ref:
            ok = fused["peak_mem_gib"] <= ref["pytorch-eager"]["peak_mem_gib"]
            verdicts.append(f"{model}: peak memory {fused['peak_mem_gib']} GiB vs PyTorch eager's "
                            f"{ref['pytorch-eager']['peak_mem_gib']} (target <=): {'holds' if ok else 'NOT MET'}")
    if opt:
        for r in opt:  # each against PyTorch's row of the same work (with or without the clipping)
            ref_system = "pytorch-clip+adamw-fused" if "clip+" in r["system"] else "pytorch-adamw-fused"
            torch_row = next((o for o in opt if o["model"] == r["model"] and o["system"] == ref_system), None)
            if torch_row:
                r["vs_pytorch_fused"] = round(torch_row["step_ms"] / r["step_ms"], 3)
            if r["system"] in ("tessera-adamw-multi-tensor", "tessera-adamw-clip+multi-tensor") and torch_row:
                what = "clipping + multi-tensor AdamW" if "clip+" in r["system"] else "multi-tensor AdamW"
                verdicts.append(f"{r['model']}: {what} {r['step_ms']} ms vs PyTorch's {torch_row['step_ms']} ms "
                                f"({ref_system}; target <=): "
                                f"{'holds' if r['step_ms'] <= torch_row['step_ms'] else 'NOT MET'}")
        opt.sort(key=lambda r: (r["model"], r["system"]))
        sections.append(("Optimizer phase alone (same parameters, fixed gradients)",
                         results.table(opt, ["system", "model", "tensors", "params_M", "step_ms", "vs_pytorch_fused"])))
    shape_verdicts = []
    if shaped:
        lines, shape_verdicts = shapes.table(shaped, a.log_dir, a.profile_dir)
        sections.append(("Shapes that are not presets (llama3-1b with overrides; tessera-fused vs compiled PyTorch, "
                         "issue 40)", lines))
    if verdicts or not shaped:  # the presets' targets (the shapes' are under their table)
        sections.append(("Targets", ["- " + v for v in verdicts] or ["- no complete pair of rows to judge"]))
    doc = {"name": "single_gpu", "date": results.now(), "machine": a.machine, "command": a.command,
           "method": "the median step after the warm-ups (bf16 autocast over fp32 weights, AdamW, gradient clipping); "
                     "MFU against 989 TFLOP/s with train_gpt's FLOP count; peak: the caching allocator's",
           "targets": verdicts + shape_verdicts, "rows": rows}
    print(results.write(doc, a.results, "One GPU at the limit: train step and optimizer phase (issue 26)", sections))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("torch")
    which = t.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", choices=sorted(MODELS))
    which.add_argument("--shape", default="", help="NAME:key=value,... (shapes.py): llama3-1b with overrides")
    t.add_argument("--mode", choices=["eager", "compile"], default="eager")
    t.add_argument("--batch", type=int, default=0, help="with --model (--shape: its B)")
    t.add_argument("--steps", type=int, default=20)
    t.add_argument("--warm", type=int, default=5)
    t.add_argument("--profile", default="", help="after the timed steps, a Chrome trace of 2 more steps here")
    o = sub.add_parser("adamw")
    o.add_argument("--model", choices=sorted(MODELS), required=True)
    o.add_argument("--steps", type=int, default=20)
    c = sub.add_parser("combine")
    c.add_argument("log_dir")
    c.add_argument("--results", required=True)
    c.add_argument("--machine", default="")
    c.add_argument("--command", default="")
    c.add_argument("--profile-dir", default="", help="run.sh's PROFILE_DIR: the shapes' kernel summaries")
    a = ap.parse_args()
    if a.cmd == "torch" and (a.batch <= 0) == bool(a.model):
        ap.error("torch: --model takes --batch B (> 0); --shape takes its batch from the spec's B")
    if a.cmd == "torch" and a.shape:
        try:
            shapes.config(a.shape)
        except ValueError as e:
            ap.error(str(e))
    {"torch": run_torch, "adamw": run_adamw, "combine": combine}[a.cmd](a)


if __name__ == "__main__":
    main()
