#!/usr/bin/env python3
"""GPU kernel time by kernel name from Chrome traces (Kineto's, as torch.profiler and LibTorch's
profiler write them), side by side for several traces: total ms per step, calls per step, and the
difference to the first trace. Kernels are grouped by a short name (template arguments cut).
  summarize.py --steps 2 NAME=TRACE.json [NAME=TRACE.json ...] [--top 40]"""
import argparse, collections, json, re


def short(name):
    name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")  # both demanglers' spelling
    name = re.sub(r"<.*", "", name)          # template arguments
    name = re.sub(r"\(.*", "", name)         # parameter lists
    return name.strip()[:90]


def load(path):
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    tot, cnt = collections.Counter(), collections.Counter()
    busy = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        k = short(e.get("name", "?"))
        tot[k] += float(e.get("dur", 0)) / 1e3
        cnt[k] += 1
        busy.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))))
    busy.sort()
    span = (busy[-1][1] - busy[0][0]) / 1e3 if busy else 0.0
    return tot, cnt, span


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    named = [t.split("=", 1) for t in a.traces]
    data = [(n, *load(p)) for n, p in named]
    keys = collections.Counter()
    for _, tot, _, _ in data:
        for k, v in tot.items():
            keys[k] += v
    s = a.steps
    hdr = "| kernel | " + " | ".join("%s ms/step (calls)" % n for n, *_ in data) + " | diff ms/step |"
    print(hdr)
    print("|" + "---|" * (len(data) + 2))
    for k, _ in keys.most_common(a.top):
        cells = ["%.3f (%d)" % (tot[k] / s, cnt[k] // s) for _, tot, cnt, _ in data]
        diff = (data[-1][1][k] - data[0][1][k]) / s
        print("| %s | %s | %+.3f |" % (k, " | ".join(cells), diff))
    print("| **all kernels** | " + " | ".join("%.2f" % (sum(tot.values()) / s) for _, tot, _, _ in data) + " | |")
    print("| **GPU span** | " + " | ".join("%.2f" % (span / s) for *_, span in data) + " | |")


if __name__ == "__main__":
    main()
