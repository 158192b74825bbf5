#!/usr/bin/env python3
"""Fits a card's overlap_slowdown (plan/calibration.h) to its committed data-parallel rows.

The share of overlapped communication that still lengthens a step is the one cost tessera-plan
cannot measure on one GPU. This fits it, least squares in relative error, to every committed row
of that card with data parallelism alone (dp > 1, tp = pp = cp = 1) measured since --since, and
writes it with the list of rows into the calibration file. Those rows are then fitted, not
predicted; validate.py says so beside them.

  python3 bench/plan/fit_overlap.py --card "NVIDIA H200" [--since 2026-11-27] [--calibration FILE]
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import validate  # noqa: E402


def fit_rows(card, since):
    return [r for r in validate.rows_mod.rows(validate.ROOT)
            if r["scope"] == "in" and r["card"] == card and r["date"][:10] >= since and r["dp"] > 1
            and r["tp"] == 1 and r["pp"] == 1 and r["cp"] == 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--card", required=True)
    ap.add_argument("--since", default="2026-11-27")
    ap.add_argument("--calibration", default=os.path.join(HERE, "calibration.json"))
    ap.add_argument("--bin", default=os.path.join(validate.ROOT, "build", "bin", "tessera_plan"))
    a = ap.parse_args()
    with open(a.calibration) as f:
        cal = json.load(f)
    entry = next(c for c in cal["calibrations"] if c["card"] == a.card)
    s0 = entry["overlap_slowdown"]
    num = den = 0.0
    used = []
    rows = fit_rows(a.card, a.since)
    for r, (pred, err) in zip(rows, validate.predict_all(a.bin, a.calibration, rows)):
        if pred is None:
            print(f"skipped {r['suite']}/{r['run']}/{r['system']}: {err}")
            continue
        h = pred["hidden_comm_ms"] / r["step_ms"]
        base = (pred["step_ms"] - s0 * pred["hidden_comm_ms"]) / r["step_ms"]
        num += h * (1 - base)
        den += h * h
        used.append(f"{r['suite']}/{r['run']}/{r['system']} ({r['date'][:10]})")
    if den == 0:
        print("no data-parallel rows to fit")
        return 1
    s = round(num / den, 3)
    entry["overlap_slowdown"] = s
    entry["overlap_source"] = (f"fitted (bench/plan/fit_overlap.py, least squares in relative error) to the "
                               f"{len(used)} data-parallel rows of this card since {a.since}: " + "; ".join(used))
    validate.write_calibration(a.calibration, cal)
    print(f"overlap_slowdown {s} from {len(used)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
