#!/usr/bin/env python3
"""PyTorch's side of the one-GPU benchmark (bench/single_gpu/run.sh, issue 26) and the combiner.
  single_gpu.py torch (--model gpt735m|llama3-1b --batch B | --shape SPEC) --mode eager|compile [--steps N]
      One GPU, bf16 autocast over fp32 weights, random tokens: forward, float32 cross-entropy, backward,
      clipping at 1, torch.optim.AdamW(fused=True) (no decay on norms and biases), zero_grad, on the anchors'
      GPT-735M (bench/torch_anchor.py) or the PyTorch Llama (tests/models/torch_llama.py) as llama3-1b or a
      shape that is not a preset (shapes.py's spec). RESULT line: the median step after 5 warm-ups, tokens/s,
      MFU (train_gpt's FLOP count, 989 TFLOP/s), peak memory; "oom": true when it ran out of memory.
  single_gpu.py adamw --model gpt735m|llama3-1b [--steps N]
      The optimizer phase alone: torch.optim.AdamW(fused=True) over the model's parameters with fixed random
      gradients (tessera's side: tessera_bench_adamw). RESULT line with the mean step.
  single_gpu.py combine LOG_DIR --results DIR --run NAME --machine TEXT --command TEXT
      Every RESULT line of LOG_DIR/*.log as the run NAME of DIR/single_gpu.{json,md} (bench/results.py's
      writer): each model's rows beside PyTorch eager's and compiled's, the optimizer rows beside PyTorch's
      fused AdamW, the issue's targets in the notes, the shapes also as a table of their own (shapes.table).
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


def judge_presets(train, verdicts):
    """vs_<system> on each preset's rows (results.derive), and the issue's targets for them in words."""
    for model in sorted({r["model"] for r in train}):
        mine = [r for r in train if r["model"] == model]
        ref = {r["system"]: r for r in mine if "step_ms" in r}
        results.derive(ref, versus=("pytorch-eager", "pytorch-compile"))  # vs_<system>: tokens/s over its
        for r in mine:
            if "step_ms" not in r:
                r["status"] = "out of memory"
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


def judge_optimizer(opt, verdicts):
    """Each optimizer row against PyTorch's row of the same work (with or without the clipping)."""
    for r in opt:
        r["kind"] = "optimizer"
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


def combine(a):
    rows = []
    for path in sorted(glob.glob(os.path.join(a.log_dir, "*.log"))):
        for r in results.read_results(path):  # logs are named MODEL.SYSTEM.log (run.sh)
            r.setdefault("model", os.path.basename(path).split(".")[0])
            r["model"] = MODELS.get(r["model"], r["model"])
            r.setdefault("gpus", 1)
            rows.append(r)
    shaped = [r for r in rows if str(r["model"]).startswith("shape-")]
    preset = [r for r in rows if not str(r["model"]).startswith("shape-")]
    verdicts, tables = [], []
    judge_presets([r for r in preset if "adamw" not in r["system"]], verdicts)
    judge_optimizer([r for r in preset if "adamw" in r["system"]], verdicts)
    if shaped:
        shape_rows, shape_verdicts = shapes.table(shaped, a.log_dir)
        verdicts += shape_verdicts
        tables.append({"title": "Shapes that are not presets (llama3-1b with overrides; tessera-fused vs compiled "
                                "PyTorch, issue 40)", "rows": shape_rows,
                       "columns": ["shape", "system", "step_ms", "tokens_per_s", "mfu", "peak_mem_gib",
                                   "vs_pytorch_compile"]})
    notes = ["Kineto traces of 2 steps per shape and side, and their kernel summaries (bench/profile/summarize.py): "
             f"{a.profile_dir}/shape-NAME.{{pytorch-compile,tessera-fused}}.json, shape-NAME.kernels.md"] * bool(a.profile_dir)
    run = dict(run=a.run, title="One GPU at the limit: the train step and the optimizer phase", machine=a.machine,
               environment=a.environment, command=a.command,
               method="the median step after the warm-ups (bf16 autocast over fp32 weights, AdamW, gradient clipping); "
                      "peak: the caching allocator's",
               columns=["vs_pytorch_eager", "vs_pytorch_compile", "vs_pytorch_fused", "tensors", "params_M", "status"],
               rows=rows, tables=tables, notes=["target: " + v for v in verdicts] + notes)
    md, problems = results.put_run(a.results, "single_gpu", run, dict(precision="bf16", gpus=1))
    print(md)
    for p in problems:
        print("single_gpu.py: does not validate: " + p, file=sys.stderr)
    return 1 if problems else 0


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
    c.add_argument("--run", default="gpt-llama-adamw-shapes", help="the run's name in single_gpu.json")
    c.add_argument("--machine", default="")
    c.add_argument("--environment", default="")
    c.add_argument("--command", default="")
    c.add_argument("--profile-dir", default="", help="run.sh's PROFILE_DIR: where the shapes' traces are")
    a = ap.parse_args()
    if a.cmd == "torch" and (a.batch <= 0) == bool(a.model):
        ap.error("torch: --model takes --batch B (> 0); --shape takes its batch from the spec's B")
    if a.cmd == "torch" and a.shape:
        try:
            shapes.config(a.shape)
        except ValueError as e:
            ap.error(str(e))
    return {"torch": run_torch, "adamw": run_adamw, "combine": combine}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
