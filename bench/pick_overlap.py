#!/usr/bin/env python3
"""Reads a benchmark run's results and prints shell exports of the overlap settings that made
tessera fastest in it, for the next runs of the same session (scripts/gpu-check):
  ddp.json -> TESSERA_OVERLAP_SM_CARVEOUT: the sm_carveout of the fastest tessera-ddp row (fp32 gradients
              copied into buckets: the rows whose only variant part is carveN),
  tp.json  -> TESSERA_TP_FORWARD_CHUNKS (and the carveout, if the DDP file gave none): the fastest
              tessera-tp-sp row's forward_chunks / sm_carveout.
  eval "$(python3 bench/pick_overlap.py ddp.json [tp.json])"
Settings whose row is not faster than the run's base row are not exported (the defaults stay)."""
import json, sys


def rows(path):
    try:
        with open(path) as f:
            return json.load(f)["rows"]
    except (OSError, ValueError, KeyError) as e:
        print("# pick_overlap: cannot read %s: %s" % (path, e))
        return []


def main():
    out = {}
    for path in sys.argv[1:]:
        rs = rows(path)
        if any(r["system"].startswith("tessera-ddp") for r in rs):
            ddp = [r for r in rs if r["system"].startswith("tessera-ddp") and r.get("gpus", 1) > 1
                   and not any(k in r["system"] for k in ("bf16", "ctas", "view", "fused"))]
            base = next((r for r in ddp if r["system"] == "tessera-ddp"), None)
            best = max(ddp, key=lambda r: r["tokens_per_s"], default=None)
            carve = int(best.get("sm_carveout") or 0) if best else 0
            if best and base and best["tokens_per_s"] > base["tokens_per_s"] and carve > 0:
                out["TESSERA_OVERLAP_SM_CARVEOUT"] = carve
        tp = [r for r in rs if r["system"].startswith("tessera-tp-sp") and r.get("forward_chunks") is not None]
        if tp:
            best = max(tp, key=lambda r: r["tokens_per_s"])
            if int(best["forward_chunks"]) > 1:
                out["TESSERA_TP_FORWARD_CHUNKS"] = int(best["forward_chunks"])
            if "TESSERA_OVERLAP_SM_CARVEOUT" not in out and int(best.get("sm_carveout") or 0) > 0:
                out["TESSERA_OVERLAP_SM_CARVEOUT"] = int(best["sm_carveout"])
    for k, v in out.items():
        print("export %s=%s" % (k, v))
    print("# pick_overlap: %s" % (", ".join("%s=%s" % kv for kv in out.items()) or "defaults"))


if __name__ == "__main__":
    main()
