#!/usr/bin/env python3
"""Combines the BW lines of PyTorch's and tessera's runs of the collectives benchmark into
bench/results/collectives.json (DESIGN.md's format) and a Markdown table beside it.

Each side may have run several rounds (interleaved with the other side's, in one device
call): a row's busbw_gbs is the best of its rounds, and `runs` lists every round's value.
busbw_ratio (tessera rows) = tessera busbw / PyTorch busbw for the same op and size.
"""
import argparse, datetime, json, os, re, sys

OPS = ("allreduce", "allgather", "reducescatter")


def parse(path):
    rows, info = {}, []
    with open(path) as f:
        for line in f:
            line = re.sub(r"^\[\w+\d*\]:", "", line.strip())  # torchrun's "[default0]:" prefix
            if line.startswith("INFO "):
                info.append(line[5:])
            parts = line.split()
            if len(parts) == 6 and parts[0] == "BW" and parts[1] in OPS:
                rows[(parts[1], int(parts[2]))] = float(parts[5])
    if not rows:
        sys.exit("combine.py: no BW rows in %s" % path)
    return rows, info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--torch", nargs="+", required=True)
    ap.add_argument("--tessera", nargs="+", required=True)
    ap.add_argument("--diag-nonblocking", nargs="*", default=[])
    ap.add_argument("--machine", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--md", required=True)
    a = ap.parse_args()
    sides = {"pytorch-nccl": [parse(p) for p in a.torch], "tessera-nccl": [parse(p) for p in a.tessera]}
    keys = sorted(sides["pytorch-nccl"][0][0], key=lambda k: (k[1], OPS.index(k[0])))
    best = {}
    rows = []
    for system, runs in sides.items():
        for op, mb in keys:
            vals = [r[0][(op, mb)] for r in runs if (op, mb) in r[0]]
            best[(system, op, mb)] = max(vals)
            rows.append({"system": system, "op": op, "size_mib": mb, "busbw_gbs": max(vals), "runs": vals})
    for row in rows:
        if row["system"] == "tessera-nccl":
            ref = best[("pytorch-nccl", row["op"], row["size_mib"])]
            row["busbw_ratio"] = round(row["busbw_gbs"] / ref, 3)
    diag = []
    for p in a.diag_nonblocking:
        d, _ = parse(p)
        for op, mb in keys:
            if (op, mb) in d:
                diag.append({"system": "tessera-nccl (TESSERA_NCCL_BLOCKING=0)", "op": op, "size_mib": mb,
                             "busbw_gbs": d[(op, mb)],
                             "busbw_ratio": round(d[(op, mb)] / best[("pytorch-nccl", op, mb)], 3)})
    info = {s: sorted({i for r in runs for i in r[1]}) for s, runs in sides.items()}
    doc = {"name": "collectives", "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": a.machine, "command": a.command, "dtype": "bfloat16", "ranks": 2,
           "method": "5 warm-ups, 20 timed iterations between CUDA events on the caller's stream; busbw as "
                     "nccl-tests; best of %d interleaved rounds per side" % len(a.torch),
           "info": info, "rows": rows}
    if diag:
        doc["diagnostics"] = {"note": "one run of tessera running its ops on non-blocking NCCL communicators (TESSERA_NCCL_BLOCKING=0; not the default)",
                              "rows": diag}
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    md = ["# Collectives: tessera's NCCL communicator vs PyTorch's torch.distributed (NCCL)", "",
          "- date: %s" % doc["date"], "- machine: %s" % a.machine, "- command: `%s`" % a.command,
          "- method: %s, bf16, 2 ranks" % doc["method"], ""]
    for s, lines in info.items():
        md += ["- %s: %s" % (s, "; ".join(lines))]
    md += ["", "| op | MiB | PyTorch busbw GB/s | tessera busbw GB/s | ratio |", "|---|---|---|---|---|"]
    for op in OPS:
        for op2, mb in keys:
            if op2 != op:
                continue
            t, p = best[("tessera-nccl", op, mb)], best[("pytorch-nccl", op, mb)]
            md.append("| %s | %d | %.1f | %.1f | %.3f |" % (op, mb, p, t, t / p))
    if diag:
        md += ["", "Diagnostic, one run: tessera running its ops on non-blocking NCCL communicators "
               "(TESSERA_NCCL_BLOCKING=0; the default runs them on a blocking twin):", "", "| op | MiB | busbw GB/s | ratio to PyTorch |", "|---|---|---|---|"]
        md += ["| %s | %d | %.1f | %.3f |" % (d["op"], d["size_mib"], d["busbw_gbs"], d["busbw_ratio"]) for d in diag]
    with open(a.md, "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    bad = [(op, mb) for op, mb in keys if mb >= 64 and best[("tessera-nccl", op, mb)] < 0.98 * best[("pytorch-nccl", op, mb)]]
    print("DONE-WHEN (tessera >= 0.98 x PyTorch at >= 64 MiB): %s" % ("met" if not bad else "NOT met for %s" % bad))


if __name__ == "__main__":
    main()
