#!/usr/bin/python3
"""Combines the JSON lines of bench/data/run.sh's runs (tessera_bench_data, torch_data.py,
tessera_py_data.py) into bench/results/data.json and data.md, or (--check) only checks that the
expected measurements are there (the smoke test).

    combine.py LOG.jsonl... --datasets DATASETS.json --machine M --command C --json OUT --md OUT
    combine.py LOG.jsonl... --check tessera:sample_read,pytorch-dataloader-w0:sample_read,...

Every stdout line that parses as a JSON object with "system" and "measurement" is a row; others
are reported and skipped. Exit status 1 when an expected row is missing (--check) or no row at all.
"""
import argparse
import datetime
import json
import sys

TARGET_US = 1000.0  # the target: the sampler's host time per step for GPT-735M's batch


def read_rows(paths):
    rows = []
    for path in paths:
        with open(path, errors="replace") as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    print(f"combine.py: unreadable line in {path}: {line[:200]}", file=sys.stderr)
                    continue
                if isinstance(row, dict) and "system" in row and "measurement" in row:
                    rows.append(row)
    return rows


def fmt(v, digits=1):
    if v is None:
        return "—"
    return f"{v:,.{digits}f}"


SAMPLE_WHAT = {
    "tessera": "readSamples (C++)",
    "tessera-python": "Sampler.batch() (Python)",
    "pytorch-dataloader-w0": "next(DataLoader)",
    "nanogpt-memmap": "get_batch()",
}


def what_of(r):
    """The Markdown's words for what a per-step row timed."""
    work = r.get("work_ms")
    if r["measurement"] == "loader_next":
        call = "BatchLoader.next()" if r["system"] == "tessera" else "next(DataLoader)"
        return f"{call}, {work:g} ms work/step" if work else f"{call}, no work (the loader's rate)"
    if r["system"].startswith("pytorch-dataloader-w") and r["system"] != "pytorch-dataloader-w0":
        return "next(DataLoader), no work (the workers' rate)"
    return SAMPLE_WHAT.get(r["system"], r["measurement"])


def markdown(doc):
    rows = doc["rows"]
    out = ["# Data loading: tessera vs PyTorch's ways (host, CPU)", "",
           f"- date: {doc['date']}", f"- machine: {doc['machine']}", f"- command: `{doc['command']}`",
           f"- config: {doc['config']}"]
    for d in doc.get("datasets", []):
        out.append(f"- dataset `{d['name']}`: {d['description']}")
    out.append(f"- method: {doc['method']}")
    out += ["", f"## Per-step host time, B={doc['batch']} × T={doc['seq_len']} "
                f"({doc['batch']} × {doc['seq_len'] + 1} tokens read; target < {TARGET_US:.0f} µs)", "",
            "| dataset | system | what | mean µs | p50 µs | p99 µs | M tokens/s | < 1 ms |",
            "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["measurement"] not in ("sample_read", "loader_next"):
            continue
        what = what_of(r)
        ok = "yes" if r["us_mean"] < TARGET_US and r["us_p99"] < TARGET_US else (
            "mean only" if r["us_mean"] < TARGET_US else "no")
        out.append(f"| {r['dataset']} | {r['system']} | {what} | {fmt(r['us_mean'])} | {fmt(r['us_p50'])} | "
                   f"{fmt(r['us_p99'])} | {fmt(r['tokens_per_s'] / 1e6)} | {ok} |")
    out += ["", "## Sequential read (every document in order, widened to int64)", "",
            "| dataset | system | how | page cache | M tokens/s | file MB/s | pass ms |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["measurement"] not in ("seq_read", "seq_read_cold"):
            continue
        cold = r["measurement"] == "seq_read_cold"
        mbs = r["file_MB_per_s"] if cold else r["tokens_per_s"] * r["token_bytes"] / 1e6
        cache = f"cold ({r['resident_before'] * 100:.0f}% cached before)" if cold else "warm"
        out.append(f"| {r['dataset']} | {r['system']} | {r.get('what', '')} | {cache} | {fmt(r['tokens_per_s'] / 1e6)} | {fmt(mbs, 0)} | "
                   f"{fmt(r['pass_ms'], 2)} |")
    out += ["", "## Index build (open the dataset, build the sample index) and the first batch after it", "",
            "| dataset | system | build ms | first batch ms |", "|---|---|---|---|"]
    for r in rows:
        if r["measurement"] == "build":
            out.append(f"| {r['dataset']} | {r['system']} | {fmt(r['build_ms'], 3)} | {fmt(r['first_batch_ms'], 3)} |")
    if doc.get("notes"):
        out += ["", "## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("logs", nargs="+")
    p.add_argument("--check", help="SYSTEM:MEASUREMENT,... that must be present; writes nothing")
    p.add_argument("--datasets", help="a JSON file: [{name, path, description}, ...]")
    p.add_argument("--machine", default="?")
    p.add_argument("--command", default="?")
    p.add_argument("--config", default="", help="the runs' options, for the record")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--note", action="append", help="a line for the Markdown's notes (repeatable)")
    p.add_argument("--json")
    p.add_argument("--md")
    args = p.parse_args()
    rows = read_rows(args.logs)
    if not rows:
        print("combine.py: no result rows in " + " ".join(args.logs), file=sys.stderr)
        return 1
    if args.check:
        have = {(r["system"], r["measurement"]) for r in rows}
        missing = [w for w in args.check.split(",") if tuple(w.split(":", 1)) not in have]
        for r in rows:
            if r["system"] == "tessera" and r["measurement"] == "sample_read":
                print(f"combine.py: tessera sample_read on {r['dataset']}: mean {r['us_mean']:.1f} us per step "
                      f"(target < {TARGET_US:.0f})", file=sys.stderr)
        if missing:
            print("combine.py: missing rows: " + ", ".join(missing), file=sys.stderr)
            return 1
        print(f"combine.py: all {len(args.check.split(','))} expected rows present ({len(rows)} rows)", file=sys.stderr)
        return 0
    datasets = json.load(open(args.datasets)) if args.datasets else []
    doc = {
        "name": "data",
        "date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"),
        "machine": args.machine,
        "command": args.command,
        "config": args.config,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "target": f"the sampler's host time per step for B={args.batch} x T={args.seq_len} "
                  f"(B x {args.seq_len + 1} tokens read) < {TARGET_US:.0f} us",
        "method": ("one process per system, one core's worth of work (torch threads 1) except the DataLoader "
                   "workers and tessera's loader thread; every per-step number is the median over runs "
                   "(--repeats) of each run's mean/p50/p99 (nearest rank) after warm-up steps; tokens/s = "
                   "B x (T+1) / mean step time; sequential read: median of passes after a warm-up pass; "
                   "cold: the dataset's files written back and dropped from the page cache "
                   "(fdatasync + POSIX_FADV_DONTNEED) just before opening; timers: std::chrono::steady_clock "
                   "and time.perf_counter"),
        "datasets": datasets,
        "rows": rows,
    }
    notes = []
    for r in rows:
        if r["system"] == "tessera" and r["measurement"] == "sample_read":
            verdict = "meets" if r["us_mean"] < TARGET_US and r["us_p99"] < TARGET_US else "MISSES"
            notes.append(f"{r['dataset']}: tessera's readSamples of {r['batch']} x {r['seq_len'] + 1} tokens takes "
                         f"{r['us_mean']:.1f} us mean, {r['us_p99']:.1f} us p99 per step: {verdict} the < "
                         f"{TARGET_US:.0f} us target")
        if r["measurement"] == "loader_next" and r.get("work_ms"):
            keeps = r["us_mean"] < 0.1 * r["work_ms"] * 1e3
            notes.append(f"{r['dataset']}: {r['system']}'s next() blocked the trainer {r['us_mean']:.1f} us on average "
                         f"(p99 {r['us_p99']:.1f} us) with {r['work_ms']:g} ms of work per step: the loader "
                         + ("keeps up (what remains is the hand-off)" if keeps else "does NOT keep up"))
    doc["notes"] = notes + (args.note or [])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
