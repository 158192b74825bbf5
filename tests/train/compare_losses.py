#!/usr/bin/env python3
"""Compares the loss curves of two train_gpt JSONL logs (the "step" records).

  compare_losses.py REF GOT [--rtol X] [--bitwise] [--steps a-b]

Exit 0 when every step in range is in both logs and |got - ref| <= rtol * |ref| (or equal,
with --bitwise); prints each step's losses and the worst relative difference either way."""
import argparse
import json
import sys


def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("event") == "step":
                out[rec["step"]] = (rec["loss"], rec["grad_norm"])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ref")
    ap.add_argument("got")
    ap.add_argument("--rtol", type=float, default=0.0)
    ap.add_argument("--bitwise", action="store_true")
    ap.add_argument("--steps", default="")
    a = ap.parse_args()
    ref, got = losses(a.ref), losses(a.got)
    steps = sorted(ref)
    if a.steps:
        lo, hi = (int(x) for x in a.steps.split("-"))
        steps = [s for s in steps if lo <= s <= hi]
    if not steps:
        print(f"no steps to compare in {a.ref}")
        return 1
    worst, ok = 0.0, True
    for s in steps:
        if s not in got:
            print(f"step {s}: missing from {a.got}")
            return 1
        (rl, rn), (gl, gn) = ref[s], got[s]
        rel = abs(gl - rl) / abs(rl)
        worst = max(worst, rel)
        good = (gl == rl and gn == rn) if a.bitwise else rel <= a.rtol
        ok = ok and good
        print(f"step {s}: loss {gl:.9g} vs reference {rl:.9g} (rel {rel:.2e}); grad norm {gn:.6g} vs {rn:.6g}"
              f"{'' if good else '  <-- differs'}")
    what = "bitwise" if a.bitwise else f"rtol {a.rtol:g}"
    print(f"{'match' if ok else 'MISMATCH'}: {len(steps)} steps, worst relative loss difference {worst:.2e} ({what})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
