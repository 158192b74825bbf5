"""The data-loading benchmark on the host (bench/data/run.sh): every stdout line of its runs that is a JSON object
with "system" and "measurement" is a row (kind data): host time per step (us_mean, us_p50, us_p99), a reader's
rate (read_tokens_per_s), an index's build time. The run's tables: the per-step host time against the target,
the sequential reads, the index builds. --check (the smoke run): the expected rows are there; nothing written."""
import json
import sys

from . import suite

TARGET_US = 1000.0  # the sampler's host time per step for GPT-735M's batch
SAMPLE_WHAT = {"tessera": "readSamples (C++)", "tessera-python": "Sampler.batch() (Python)",
               "pytorch-dataloader-w0": "next(DataLoader)", "nanogpt-memmap": "get_batch()"}


def rows_of(paths):
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
                    print("results.py: unreadable line in %s: %s" % (path, line[:200]), file=sys.stderr)
                    continue
                if isinstance(row, dict) and "system" in row and "measurement" in row:
                    rows.append(row)
    return rows


def what(r):
    """What a per-step row timed, in words."""
    work = r.get("work_ms")
    if r["measurement"] == "loader_next":
        call = "BatchLoader.next()" if r["system"] == "tessera" else "next(DataLoader)"
        return "%s, %g ms work/step" % (call, work) if work else call + ", no work (the loader's rate)"
    if r["system"].startswith("pytorch-dataloader-w") and r["system"] != "pytorch-dataloader-w0":
        return "next(DataLoader), no work (the workers' rate)"
    return SAMPLE_WHAT.get(r["system"], r["measurement"])


def verdicts(rows):
    first, out = [], []
    for r in rows:
        if r["system"] == "tessera" and r["measurement"] == "sample_read":
            ok = r["us_mean"] < TARGET_US and r["us_p99"] < TARGET_US
            first.append("%s: tessera's readSamples of %d x %d tokens takes %.1f us mean, %.1f us p99 per step: %s the "
                          "< %.0f us target" % (r["dataset"], r["batch"], r["seq_len"] + 1, r["us_mean"], r["us_p99"],
                                                "meets" if ok else "MISSES", TARGET_US))
        if r["measurement"] == "loader_next" and r.get("work_ms"):
            keeps = r["us_mean"] < 0.1 * r["work_ms"] * 1e3
            out.append("%s: %s's next() blocked the trainer %.1f us on average (p99 %.1f us) with %g ms of work per "
                       "step: the loader %s" % (r["dataset"], r["system"], r["us_mean"], r["us_p99"], r["work_ms"],
                                                "keeps up" if keeps else "does NOT keep up"))
    return first + out


def tables(rows, batch, seq_len):
    per_step, seq, build = [], [], []
    for r in rows:
        m, rate = r["measurement"], r.get("tokens_per_s", r.get("read_tokens_per_s"))
        if m in ("sample_read", "loader_next"):
            ok = r["us_mean"] < TARGET_US and r["us_p99"] < TARGET_US
            per_step.append(dict(r, what=what(r), M_tokens_per_s=round(rate / 1e6, 1),
                                 **{k: round(r[k], 1) for k in ("us_mean", "us_p50", "us_p99")},
                                 under_1ms="yes" if ok else "mean only" if r["us_mean"] < TARGET_US else "no"))
        elif m in ("seq_read", "seq_read_cold"):
            cold = m == "seq_read_cold"
            seq.append(dict(r, M_tokens_per_s=round(rate / 1e6, 1),
                            page_cache="cold (%.0f%% cached before)" % (r["resident_before"] * 100) if cold else "warm",
                            file_MB_per_s=round(r["file_MB_per_s"] if cold else rate * r["token_bytes"] / 1e6)))
        elif m == "build":
            build.append(r)
    return [{"title": "Per-step host time, B=%d x T=%d (target < %.0f us)" % (batch, seq_len, TARGET_US),
             "columns": ["dataset", "system", "what", "us_mean", "us_p50", "us_p99", "M_tokens_per_s", "under_1ms"],
             "rows": per_step},
            {"title": "Sequential read (every document in order, widened to int64)",
             "columns": ["dataset", "system", "what", "page_cache", "M_tokens_per_s", "file_MB_per_s", "pass_ms"],
             "rows": seq},
            {"title": "Index build and the first batch after it",
             "columns": ["dataset", "system", "build_ms", "first_batch_ms"], "rows": build}]


def check(rows, wanted):
    have = {(r["system"], r["measurement"]) for r in rows}
    missing = [w for w in wanted.split(",") if tuple(w.split(":", 1)) not in have]
    if missing:
        print("results.py: missing rows: " + ", ".join(missing), file=sys.stderr)
        return 1
    print("results.py: all %d expected rows present (%d rows)" % (len(wanted.split(",")), len(rows)), file=sys.stderr)
    return 0


def command(a):
    """Returns the schema's problems (a list), or an exit status for --check and a run without rows."""
    rows = rows_of(a.logs)
    if not rows:
        print("results.py: no data rows in " + " ".join(a.logs), file=sys.stderr)
        return 1
    if a.check:
        return check(rows, a.check)
    datasets = json.load(open(a.datasets)) if a.datasets else []
    run = dict(run=a.run or "host", title=a.title or "Data loading: tessera beside PyTorch's ways (host)",
               machine=a.machine, environment=a.environment, command=a.command, config=a.config,
               method=a.method, datasets=datasets,
               target="the sampler's host time per step for B=%d x T=%d < %.0f us" % (a.batch, a.seq_len, TARGET_US),
               columns=["dataset", "measurement", "us_mean", "us_p99", "read_tokens_per_s"], rows=rows,
               tables=tables(rows, a.batch, a.seq_len), notes=verdicts(rows) + a.note)
    md, problems = suite.put_run(a.results, a.suite or "data", run, dict(kind="data", gpus=0))
    print(md)
    return problems
