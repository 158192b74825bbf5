#!/usr/bin/env python3
"""Checks tessera-plan's predictions against every committed tessera training row.

Each in-scope row of bench/results (bench/plan/rows.py says how a row becomes a layout) whose card
has an entry in the calibration file is predicted by `tessera_plan predict` and compared with the
measured step time and peak memory. Prints one line per row and a summary by suite.

  python3 bench/plan/validate.py [--bin build/bin/tessera_plan] [--calibration bench/plan/calibration.json]
                                 [--max-error 0.10] [--json OUT] [--since DATE] [--known bench/plan/known_misses.json]

Rows measured before --since ran an older runtime (bench/plan/README.md). --known lists rows the
model is known to miss, each with its reason. Exit status 1 when a row is off by more than
--max-error (a fraction) and not known, when a known row is no longer off (the list is stale), or
when a row is refused.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import rows as rows_mod  # noqa: E402


def model_spec(r):
    names = {"layers": "layers", "d": "d", "heads": "heads", "kv_heads": "kv", "ffn": "ffn", "vocab": "vocab",
             "tied": "tied"}
    over = [f"{names[k]}={int(v)}" for k, v in sorted(r["overrides"].items())]
    return r["model"] + (":" + ",".join(over) if over else "")


def layout(r):
    parts = [f"dp={r['dp']}", f"tp={r['tp']}", f"pp={r['pp']}", f"cp={r['cp']}",
             "fsdp" if r["sharding"] == "fsdp" else "ddp", f"mb={r['micro_batch']}", f"m={r['micro_batches']}"]
    if r["tp"] > 1 and not r["sp"]:
        parts.append("nosp")
    if r["pp"] > 1:
        parts.append(r["schedule"] or "1f1b")
    if r["keep_gathered"]:
        parts.append("keep")
    return ",".join(parts)


def request(r):
    return {"card": r["card"], "model": model_spec(r), "gpus": r["gpus"], "seq": r["seq_len"],
            "batch": r["global_batch"], "layout": layout(r), "recompute": r["recompute"],
            "fp8": r["precision"] == "fp8"}


def predict_all(binary, cal, rows):
    """[(prediction or None, error)] for rows, from one tessera_plan process."""
    with tempfile.TemporaryDirectory() as d:
        req, out = os.path.join(d, "requests.json"), os.path.join(d, "out.json")
        with open(req, "w") as f:
            json.dump([request(r) for r in rows], f)
        p = subprocess.run([binary, "predict-many", "--calibration", cal, "--requests", req, "--json", out],
                           capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"validate: {binary} predict-many failed: {p.stderr.strip() or p.stdout.strip()}")
        with open(out) as f:
            return [(None, x["error"]) if "error" in x else (x, "") for x in json.load(f)]


def write_calibration(path, cal):
    """Writes a calibration file as tessera_plan does (one-space indent, a final newline)."""
    with open(path, "w") as f:
        json.dump(cal, f, indent=1)
        f.write("\n")


def key(r):
    return f"{r['suite']}/{r['run']}/{r['system']}/{r['date']}/{r['card']}/{r['model']}/T{r['seq_len']}/{r['gpus']}"


def cards(cal):
    """card -> the overlap fit's source text (which names the rows it was fitted to)."""
    with open(cal) as f:
        return {c["card"]: c.get("overlap_source", "") for c in json.load(f)["calibrations"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "tessera_plan"))
    ap.add_argument("--calibration", default=os.path.join(HERE, "calibration.json"))
    ap.add_argument("--max-error", type=float, default=0.10)
    ap.add_argument("--since", default="", help="only rows measured on or after this date (YYYY-MM-DD)")
    ap.add_argument("--json", default="")
    ap.add_argument("--known", default="", help="JSON list of {key, reason}: rows known to be off")
    a = ap.parse_args()
    known = {}
    if a.known:
        with open(a.known) as f:
            known = {k["key"]: k["reason"] for k in json.load(f)}
    have = cards(a.calibration)
    checked, results = [], []
    todo = [r for r in rows_mod.rows(ROOT) if r["scope"] == "in" and r["card"] in have and r["date"][:10] >= a.since]
    for r, (pred, err) in zip(todo, predict_all(a.bin, a.calibration, todo)):
        res = dict(r, predicted=pred, error=err)
        results.append(res)
        tag = f"{r['suite']}/{r['run']}/{r['system']} [{r['date'][:10]}, {r['gpus']} GPU]"
        if f"{r['suite']}/{r['run']}/{r['system']} ({r['date'][:10]})" in have[r["card"]]:
            tag += " [fit: overlap]"
        if pred is None:
            print(f"REFUSED {tag}: {err}")
            continue
        e = pred["step_ms"] / r["step_ms"] - 1
        res["step_error"] = e
        checked.append(res)
        mem = f"mem {r['peak_mem_gib'] or 0:6.1f} -> {pred['memory_gib']:6.1f} GiB" if r["peak_mem_gib"] else ""
        res["key"] = key(r)
        off = abs(e) > a.max_error
        flag = ("  <-- off (known: " + known[key(r)] + ")") if off and key(r) in known else "  <-- off" if off else ""
        if not off and key(r) in known:
            flag = "  <-- listed as known to be off, but is not"
        print(f"{e:+7.1%}  {r['step_ms']:9.1f} -> {pred['step_ms']:9.1f} ms  {mem}  {tag} {layout(r)} "
              f"{r['recompute']} {r['precision']} {' '.join(r['flags'])}{flag}")
    bad = [c for c in checked if abs(c["step_error"]) > a.max_error and c["key"] not in known]
    stale = [c for c in checked if abs(c["step_error"]) <= a.max_error and c["key"] in known]
    off_known = [c for c in checked if abs(c["step_error"]) > a.max_error and c["key"] in known]
    errs = sorted(abs(c["step_error"]) for c in checked)
    if errs:
        print(f"{len(checked)} rows predicted ({len(results) - len(checked)} refused): "
              f"{len(checked) - len(bad) - len(off_known)} within {a.max_error:.0%}, {len(off_known)} known to be off, "
              f"{len(bad)} off and not known, {len(stale)} known but no longer off; median |error| "
              f"{errs[len(errs) // 2]:.1%}, worst {errs[-1]:.1%}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if bad or stale or len(checked) < len(results) else 0


if __name__ == "__main__":
    sys.exit(main())
