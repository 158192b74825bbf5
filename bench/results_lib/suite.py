"""bench/results/<suite>.json and its Markdown twin <suite>.md: the suite's runs, the latest run of each
(run name, machine) pair. put_run() is the one way a run reaches a results directory: it completes the rows to
the schema (schema.complete), replaces the run of the same name on the same machine (or adds it), writes both
files and says what does not validate.
  <suite>.json  {"suite", "schema": 1, "runs": [run, ...]}
  run           {"run" (its name in the suite), "title", "date", "machine", "environment"?, "commit"?, "command",
                 "config"?, "method"?, "columns"? (the Markdown table's columns beyond the schema's), "rows",
                 "tables"? ([{"title", "columns", "rows"}]: what else the run measured), "missing"?, "notes"?,
                 "plot"? (a PNG beside the file: <suite>.<run>.png), ...the benchmark's own members}
Rows of different runs are never compared: each run is one command on one machine."""
import datetime
import json
import os

from . import schema

SCHEMA_VERSION = 1
HEAD = ("run", "title", "date", "machine", "environment", "commit", "command", "config", "method")
TAIL = ("columns", "rows", "tables", "missing", "notes")
# The schema's columns a Markdown table shows first (those equal in every row go to the run's header instead).
SHOWN = {"train": ["system", "model", "layout", "gpus", "seq_len", "global_batch", "precision", "tokens_per_s",
                   "tokens_per_s_per_gpu", "step_ms", "mfu", "peak_mem_gib"],
         "optimizer": ["system", "model", "step_ms"], "collective": ["system", "op", "size_mib", "busbw_gbs"],
         "data": ["system", "dataset", "measurement"], "memory": ["system", "model", "layout", "gpus"],
         "loss": ["system", "model", "layout", "gpus", "seq_len", "global_batch", "precision"]}


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def plot_name(suite, run):
    return f"{suite}.{run}.png"


def load(results, suite):
    path = os.path.join(results, suite + ".json")
    if not os.path.exists(path):
        return {"suite": suite, "schema": SCHEMA_VERSION, "runs": []}
    with open(path) as f:
        return json.load(f)


def ordered(run):
    """The run's members in reading order: who, where and what first, the rows and notes last."""
    keys = [k for k in HEAD if k in run] + [k for k in run if k not in HEAD and k not in TAIL]
    return {k: run[k] for k in keys + [k for k in TAIL if k in run]}


def put_run(results, suite, run, defaults=None):
    """Writes `run` into <results>/<suite>.{json,md} (see the module's doc); `defaults`: the rows' kind, model,
    layout, seq_len, precision, gpus where a row has none. Returns (the run's Markdown, the schema's problems)."""
    run = dict(run, date=run.get("date") or now())
    run["rows"] = [schema.complete(r, run, defaults or {}) for r in run.get("rows", [])]
    run = ordered(run)
    doc = load(results, suite)
    same = [i for i, r in enumerate(doc["runs"]) if (r["run"], r["machine"]) == (run["run"], run["machine"])]
    if same:
        doc["runs"][same[0]] = run
    else:
        doc["runs"].append(run)
    write(results, doc)
    return "\n".join(render_run(suite, run)) + "\n", schema.problems(doc)


def write(results, doc):
    os.makedirs(results, exist_ok=True)
    base = os.path.join(results, doc["suite"])
    with open(base + ".json", "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    with open(base + ".md", "w") as f:
        f.write(render(doc))


def cell(v, col=""):
    if v is None:
        return "—"
    if isinstance(v, list):
        return ", ".join(str(x) for x in v)
    if isinstance(v, float) and v.is_integer() and col.endswith("tokens_per_s"):
        v = int(v)
    if col.endswith("tokens_per_s") or col == "tokens_per_s_per_gpu":
        return "{:,}".format(v) if isinstance(v, int) else str(v)
    return str(v).replace("|", "\\|")


def table(rows, cols):
    """A Markdown table of `rows` (dicts) over `cols`; a missing member is "—"."""
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return out + ["| " + " | ".join(cell(r.get(c), c) for c in cols) + " |" for r in rows]


def split_columns(rows, base, extra=(), shared_ok=("model", "seq_len", "precision", "layout", "gpus", "global_batch")):
    """(columns to show, {column: value shared by every row}) for rows of one kind: `base` then `extra`, less the
    columns no row has and those every row has alike (when there are several rows)."""
    cols = list(dict.fromkeys(list(base) + list(extra)))
    shared = {}
    if len(rows) > 1:
        for c in shared_ok:
            if c in cols and rows[0].get(c) is not None and len({json.dumps(r.get(c)) for r in rows}) == 1:
                shared[c] = rows[0][c]
    return [c for c in cols if c not in shared and any(r.get(c) is not None for r in rows)], shared


def kind_tables(rows, extra=(), wanted=None):
    """Markdown of a run's rows: a table per kind of row (over `wanted`[kind] or SHOWN[kind], then `extra`),
    each after a line with the values every row of it shares."""
    md = []
    for kind in sorted({r["kind"] for r in rows}, key=lambda k: schema.KINDS.index(k) if k in schema.KINDS else 99):
        mine = [r for r in rows if r["kind"] == kind]
        cols, shared = split_columns(mine, (wanted or {}).get(kind) or SHOWN.get(kind, ["system"]), extra)
        if shared:
            md += ["Every row: " + ", ".join(f"{k} {v}" for k, v in shared.items()) + ".", ""]
        md += table(mine, cols) + [""]
    return md


def render_run(suite, run, heading="##"):
    rows = run.get("rows", [])
    md = [f"{heading} {run.get('title') or run['run']}", "", f"- run: `{run['run']}`"]
    for k in HEAD[2:]:
        if run.get(k):
            md.append(f"- {k}: " + (f"`{run[k]}`" if k == "command" else str(run[k])))
    conventions = list(dict.fromkeys(r["flop_convention"] for r in rows if r.get("flop_convention")))
    md += [f"- mfu: {c}" for c in conventions]
    if run.get("plot"):
        md.append(f"- plot: [{run['plot']}]({run['plot']})")
    md += [""] + (kind_tables(rows, run.get("columns", [])) if rows else ["(no rows)", ""])
    for t in run.get("tables", []):
        md += [f"{heading}# {t['title']}", ""] + table(t["rows"], t["columns"]) + [""]
    if run.get("missing"):
        md += ["Missing (see the run's logs): " + ", ".join(
            m if isinstance(m, str) else f"{m['run']} ({m['reason']})" for m in run["missing"]), ""]
    if run.get("notes"):
        md += ["Notes:", ""] + ["- " + n for n in run["notes"]]
    return md


def render(doc):
    from . import suites  # the suites' titles (suites.py also holds the performance page's words)
    md = [f"# {suites.title(doc['suite'])}", "",
          f"Written by bench/results.py from {doc['suite']}.json; docs/performance.md says how to reproduce it. "
          "Compare rows only within one run.", ""]
    for run in doc["runs"]:
        md += render_run(doc["suite"], run) + [""]
    return "\n".join(md).rstrip() + "\n"
