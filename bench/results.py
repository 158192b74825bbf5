#!/usr/bin/env python3
"""The one writer of bench/results: every benchmark's run reaches bench/results/<suite>.{json,md} through it
(results_lib/suite.py put_run: the latest run of each run name and machine; results_lib/schema.py: the row
schema), and docs/performance.md is generated from those files.
  results.py gpt LOG... --suite S --run R --machine M --command C [--reference PREFIX=SYSTEM]... [--versus SYSTEM]...
  results.py llama LOG_DIR --machine M --command C           (bench/llama/run.sh: rows, loss curves, recompute)
  results.py collectives --torch LOG... --tessera LOG... --machine M --command C
  results.py data LOG.jsonl... (--check SYSTEM:MEASUREMENT,... | --datasets F --machine M --command C)
  results.py cp DIR... | cp --summary LOG                     (bench/cp/run.sh's run logs)
  results.py add SUITE ROWS.json --run R --machine M --command C   (rows a tool outside bench/ measured)
  results.py from-jsonl LOG.jsonl SYSTEM [WARM]               (train_gpt's JSONL log -> its RESULT line)
  results.py render | docs [--check] | check                  (the .md files; docs/performance.md; validate all)
Common options: --results DIR (bench/results), --suite, --run, --title, --config, --method, --note (repeatable),
--environment, and the rows' defaults --model, --seq-len, --precision, --fp8, --gpus. A writing command exits 1
when a row does not validate (it still writes the run)."""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from results_lib import collectives, cp, data, derive as _derive, llama, logs, page, suite  # noqa: E402

# What other scripts import from here (single_gpu.py, shapes.py, async_save.py, profile/compare.py, the tests).
now, table, put_run, derive = suite.now, suite.table, suite.put_run, _derive.derive
read_results, read_train_jsonl, normalise, strip_launcher = (logs.read_results, logs.read_train_jsonl, logs.normalise,
                                                             logs.strip_launcher)
ROOT = os.path.dirname(HERE)
DOC = os.path.join(ROOT, "docs", "performance.md")
METHOD = ("3 warm-ups then the median of STEPS steps, the device synchronised around each step; peak memory = "
          "max allocated by the caching allocator (the fullest rank)")


def defaults(a, **more):
    out = {k: getattr(a, k) for k in ("model", "seq_len", "precision", "fp8", "gpus") if getattr(a, k, None)}
    return dict(out, **more)


def cmd_gpt(a):
    rows = logs.load_rows(a.logs)
    if not rows:
        print("results.py: no RESULT lines in %s" % " ".join(a.logs), file=sys.stderr)
        return 1
    for r in rows.values():  # derive's mfu_causal needs the model
        if a.model:
            r.setdefault("model", a.model)
    derive(rows, [tuple(x.split("=", 1)) for x in a.reference], a.versus, a.vs_pytorch, a.twin)
    ordered = sorted(rows.values(), key=lambda r: (r["gpus"], not r["system"].startswith("pytorch")))
    models = sorted({r["fake_comm"] for r in ordered if r.get("fake_comm", "untimed") != "untimed"})
    run = dict(run=a.run, title=a.title or a.run, machine=a.machine, environment=a.environment, command=a.command,
               config=a.config, method=a.method or METHOD, columns=[c for c in a.columns.split(",") if c],
               rows=ordered, notes=["communication model: " + m for m in models] + a.note)
    missing = [s for s in a.expect if s not in rows]
    if missing:
        run["missing"] = missing
    md, problems = put_run(a.results, a.suite, {k: v for k, v in run.items() if v not in (None, "")}, defaults(a))
    print(md)
    return problems


def cmd_from_jsonl(a):
    res = logs.from_jsonl(a.log, a.system, a.warm)
    if res is None:
        return 1
    print("RESULT", json.dumps(res))
    return 0


def cmd_add(a):
    """Rows measured by a tool outside bench/ (a JSON list of rows, or an object with "rows" and optional "meta"
    whose "notes" join the run's), filed as one run of SUITE."""
    with open(a.rows) as f:
        got = json.load(f)
    rows = got if isinstance(got, list) else got["rows"]
    notes = (got.get("meta", {}).get("notes", []) if isinstance(got, dict) else []) + a.note
    run = dict(run=a.run, title=a.title or a.run, machine=a.machine, environment=a.environment, command=a.command,
               config=a.config, method=a.method, columns=[c for c in a.columns.split(",") if c], rows=rows, notes=notes)
    if a.plot:
        run["plot"] = suite.plot_name(a.suite, a.run)
        os.makedirs(a.results, exist_ok=True)
        with open(a.plot, "rb") as src, open(os.path.join(a.results, run["plot"]), "wb") as dst:
            dst.write(src.read())
    md, problems = put_run(a.results, a.suite, {k: v for k, v in run.items() if v not in (None, "", [])},
                           defaults(a, kind=a.kind))
    print(md)
    return problems


def cmd_cp(a):
    if a.summary:
        try:
            print(cp.summary(a.summary))
        except Exception as e:  # noqa: BLE001  (run.sh's progress line must not stop the run)
            print("no summary: %s: %s" % (type(e).__name__, e))
        return 0
    return cp.command(a)


def cmd_render(a):
    for d in page.load_all(a.results):
        suite.write(a.results, d)
    return 0


def cmd_docs(a):
    text = page.page(a.results)
    if a.check:
        same = os.path.exists(a.out) and open(a.out).read() == text
        print("%s %s" % (a.out, "is up to date" if same else "differs from what bench/results.py docs writes"))
        return 0 if same else 1
    with open(a.out, "w") as f:
        f.write(text)
    print("wrote %s" % a.out)
    return 0


def cmd_check(a):
    problems = page.check(a.results, a.out)
    print("\n".join(problems) or "bench/results and %s: all files valid, the page up to date" % a.out)
    return 1 if problems else 0


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def command(name, **kw):
        p = sub.add_parser(name, **kw)
        p.add_argument("--results", default=os.path.join(HERE, "results"))
        return p

    def writer(name, suite_default, machine=True, **kw):
        p = command(name, **kw)
        p.add_argument("--suite", default=suite_default, required=suite_default is None)
        p.add_argument("--run", default="")
        for opt in ("--title", "--config", "--method", "--environment", "--model", "--precision", "--fp8"):
            p.add_argument(opt, default="")
        p.add_argument("--machine", required=machine, default="")
        p.add_argument("--command", required=machine, default="")
        p.add_argument("--seq-len", type=int, default=0)
        p.add_argument("--gpus", type=int, default=0)
        p.add_argument("--note", action="append", default=[])
        p.add_argument("--columns", default="", help="more Markdown columns, comma-separated")
        return p

    g = writer("gpt", None, help="training rows from RESULT lines")
    g.add_argument("logs", nargs="+")
    g.add_argument("--reference", action="append", default=[], help="PREFIX=SYSTEM: the 1-GPU row of rows named PREFIX...")
    g.add_argument("--versus", action="append", default=[], help="SYSTEM: add vs_<system> to every other row")
    g.add_argument("--vs-pytorch", action="append", default=[],
                   help="PREFIX: rows named PREFIX<layout> get vs_pytorch, over pytorch-<layout>'s tokens/s")
    g.add_argument("--twin", action="append", default=[],
                   help="PREFIX (pytorch-asynctp-): the --vs-pytorch rows get vs_<prefix>, over PREFIX<layout>'s tokens/s")
    g.add_argument("--expect", action="append", default=[], help="SYSTEM that must be there (else listed as missing)")
    ll = writer("llama", "llama_curves", help="bench/llama/run.sh's log directory")
    ll.add_argument("logs")
    ll.set_defaults(model="llama3-1b")
    c = writer("collectives", "collectives")
    c.add_argument("--torch", nargs="+", required=True)
    c.add_argument("--tessera", nargs="+", required=True)
    c.add_argument("--diag-nonblocking", default="")
    c.set_defaults(gpus=2)
    d = writer("data", "data", machine=False)
    d.add_argument("logs", nargs="+")
    d.add_argument("--check", help="SYSTEM:MEASUREMENT,... that must be present; writes nothing")
    d.add_argument("--datasets", help="a JSON file: [{name, path, description}, ...]")
    d.add_argument("--batch", type=int, default=8)
    d.set_defaults(seq_len=1024)
    k = writer("cp", "cp", machine=False)
    k.add_argument("dirs", nargs="*")
    k.add_argument("--summary", default="", help="one run's log: its row or why there is none, on one line")
    k.set_defaults(precision="bf16")
    ad = writer("add", None)
    ad.add_argument("rows")
    ad.add_argument("--kind", default="train")
    ad.add_argument("--plot", default="", help="a PNG to keep beside the suite (<suite>.<run>.png)")
    j = sub.add_parser("from-jsonl", help="train_gpt's JSONL log -> RESULT line")
    j.add_argument("log")
    j.add_argument("system")
    j.add_argument("warm", nargs="?", type=int, default=3)
    command("render", help="rewrite every suite's .md from its .json")
    for name in ("docs", "check"):
        p = command(name)
        p.add_argument("--out", default=DOC)
        if name == "docs":
            p.add_argument("--check", action="store_true", help="only say whether the page is up to date")
    return ap


def main(argv=None):
    a = parser().parse_args(argv)
    if a.cmd in ("gpt", "add") and not a.run:
        a.run = a.suite
    got = {"gpt": cmd_gpt, "from-jsonl": cmd_from_jsonl, "collectives": collectives.command, "data": data.command,
           "llama": llama.command, "cp": cmd_cp, "add": cmd_add, "render": cmd_render, "docs": cmd_docs,
           "check": cmd_check}[a.cmd](a)
    if isinstance(got, list):
        for p in got:
            print("results.py: does not validate: " + p, file=sys.stderr)
        return 1 if got else 0
    return got


if __name__ == "__main__":
    sys.exit(main())
