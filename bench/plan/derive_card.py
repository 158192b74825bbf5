#!/usr/bin/env python3
"""Derives a calibration entry for a card we cannot measure from one we measured (an estimate).

GEMMs and attention are compute-bound: they keep the measured card's times when both cards have
the same tensor cores and clocks (H100 SXM and H200 are one GH100 die). The elementwise kernels,
casts, the loss and AdamW are memory-bound: their times scale by the ratio of memory bandwidths.
The links are kept (the same NVLink) unless --intra-link gives another. The entry's source says
all of this; tessera-plan reads it like a measured one, and bench/plan/validate.py checks it
against the committed rows of the derived card.

  python3 bench/plan/derive_card.py --from "NVIDIA H200" --card "NVIDIA H100 80GB HBM3" \
      --bandwidth-ratio 0.698 --memory-gib 79.1 [--calibration bench/plan/calibration.json]
"""
import argparse
import copy
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import validate  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="src", required=True)
    ap.add_argument("--card", required=True)
    ap.add_argument("--bandwidth-ratio", type=float, required=True, help="new card's memory bandwidth / measured's")
    ap.add_argument("--memory-gib", type=float, required=True)
    ap.add_argument("--calibration", default=os.path.join(HERE, "calibration.json"))
    a = ap.parse_args()
    with open(a.calibration) as f:
        cal = json.load(f)
    src = next(c for c in cal["calibrations"] if c["card"] == a.src)
    new = copy.deepcopy(src)
    new["card"] = a.card
    new["memory_gib"] = a.memory_gib
    new["element_ns"] = {k: v / a.bandwidth_ratio for k, v in src["element_ns"].items()}
    new["adamw_ns_per_param"] = src["adamw_ns_per_param"] / a.bandwidth_ratio
    new["source"] = (f"derived from the {a.src} calibration of {src['date']} (bench/plan/derive_card.py): GEMMs and "
                     f"attention as measured there; elementwise kernels and AdamW over a memory bandwidth ratio of "
                     f"{a.bandwidth_ratio}; {a.memory_gib} GiB; the same NVLink and overlap share. An estimate, "
                     f"not a measurement of this card")
    new["overlap_source"] = f"taken from the {a.src} entry, which was fitted to {a.src} rows only"
    cal["calibrations"] = [c for c in cal["calibrations"] if c["card"] != a.card] + [new]
    validate.write_calibration(a.calibration, cal)
    print(f"{a.card}: derived from {a.src}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
