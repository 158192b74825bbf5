"""bench/llama/run.sh's logs (one GPU, the Brown corpus): a row per run (train_gpt and the PyTorch Llama, eager and
compiled), the loss curves of tessera and PyTorch eager compared step by step (the run's loss_curves, and a plot
<suite>.<run>.png by tools/plot_run.py), and the recompute runs (train_gpt --recompute at several batches) as a
table of their own, with their status (ok, out of memory, failed)."""
import json
import os
import re
import subprocess
import sys

from . import derive, logs, suite

HERE = os.path.dirname(os.path.abspath(__file__))


def loss_curve(path):
    out = {}
    if os.path.exists(path):
        for line in open(path):
            r = json.loads(line)
            if r.get("event") == "step":
                out[r["step"]] = r["loss"]
    return out


def recompute_rows(paths):
    out = []
    for path in paths:
        m = re.search(r"tessera-recompute-(\w+)-b(\d+)\.log$", path)
        found = logs.read_results(path)
        r = found[-1] if found else {}
        text = open(path, errors="replace").read()
        out.append(dict(recompute=m.group(1), batch=int(m.group(2)), step_ms=r.get("step_ms"),
                        tokens_per_s=r.get("tokens_per_s"), peak_mem_gib=r.get("peak_mem_gib"),
                        status="ok" if found else "out of memory" if "out of memory" in text else "failed"))
    return out


def curves(t, p):
    """The gap of two loss curves ({step: loss}) over their common steps ({} without one)."""
    common = sorted(set(t) & set(p))
    if not common:
        return {}
    gaps = [abs(t[s] - p[s]) for s in common]
    worst = max(range(len(common)), key=lambda i: gaps[i])
    means = [(sum(t[s] for s in common[i:i + 20]) - sum(p[s] for s in common[i:i + 20])) / 20
             for i in range(0, len(common) - 19, 20)]
    return dict(steps=len(common), max_abs_gap=round(gaps[worst], 4), at_step=common[worst],
                mean_abs_gap=round(sum(gaps) / len(gaps), 4),
                max_abs_gap_of_20_step_means=round(max(abs(x) for x in means), 4) if means else None,
                tessera_first_last=[round(t[common[0]], 4), round(t[common[-1]], 4)],
                pytorch_first_last=[round(p[common[0]], 4), round(p[common[-1]], 4)])


def command(a):
    paths = sorted(os.path.join(a.logs, f) for f in os.listdir(a.logs) if f.endswith(".log"))
    recompute = recompute_rows([p for p in paths if re.search(r"tessera-recompute-\w+-b\d+\.log$", p)])
    rows = logs.load_rows([p for p in paths if "tessera-recompute-" not in p])
    derive.derive(rows, versus=("pytorch-eager", "pytorch-compile"))
    tl, pl = os.path.join(a.logs, "tessera.jsonl"), os.path.join(a.logs, "pytorch-eager.jsonl")
    c = curves(loss_curve(tl), loss_curve(pl))
    name, s = a.run or a.model, a.suite or "llama_curves"
    run = dict(run=name, title=a.title or name, machine=a.machine, environment=a.environment, command=a.command,
               config=a.config, method=a.method, loss_curves=c,
               columns=["vs_pytorch_eager", "vs_pytorch_compile", "last_loss"], rows=list(rows.values()), notes=a.note)
    if c:
        run["notes"] = ["Loss curves over %d steps (same batches, same initial weights): largest gap %s at step %s, "
                        "mean gap %s, largest gap of 20-step means %s; tessera %s, PyTorch %s (first, last)" % (
                            c["steps"], c["max_abs_gap"], c["at_step"], c["mean_abs_gap"],
                            c["max_abs_gap_of_20_step_means"], c["tessera_first_last"], c["pytorch_first_last"])] + a.note
        run["plot"] = suite.plot_name(s, name)
        os.makedirs(a.results, exist_ok=True)
        subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "tools", "plot_run.py"), "tessera=" + tl,
                        "pytorch-eager=" + pl, "-o", os.path.join(a.results, run["plot"]), "--title", run["title"]],
                       check=False)
    if recompute:
        run["tables"] = [{"title": "Activation recompute (train_gpt)", "rows": recompute,
                          "columns": ["recompute", "batch", "step_ms", "tokens_per_s", "peak_mem_gib", "status"]}]
    if not rows and not recompute:
        print("results.py: no runs in %s" % a.logs, file=sys.stderr)
        return 1
    md, problems = suite.put_run(a.results, s, run, dict(model=a.model, seq_len=a.seq_len, precision=a.precision,
                                                         gpus=1))
    print(md)
    return problems
