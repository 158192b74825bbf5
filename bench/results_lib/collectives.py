"""The collectives benchmark (bench/collectives/run.sh): torch.distributed's NCCL beside tessera's communicator,
each side's rounds interleaved with the other's. A row per system, op and size (kind collective): its best
round's bus bandwidth (busbw_gbs, as nccl-tests count it), every round (runs), and for tessera's rows the
ratio over PyTorch's (busbw_ratio). A run with --diag-nonblocking adds one run of tessera on non-blocking NCCL
communicators as a table of its own (not rows: not the default)."""
import sys

from . import logs, suite

OPS = ("allreduce", "allgather", "reducescatter")
TARGET = 0.98  # tessera's busbw over PyTorch's from 64 MiB up


def bw_lines(path):
    """{(op, MiB): busbw} and the INFO lines of one run (torch_nccl_bw.py, tessera_bench_collectives)."""
    rows, info = {}, []
    with open(path) as f:
        for line in f:
            line = logs.strip_launcher(line)
            if line.startswith("INFO "):
                info.append(line[5:])
            parts = line.split()
            if len(parts) == 6 and parts[0] == "BW" and parts[1] in OPS:
                rows[(parts[1], int(parts[2]))] = float(parts[5])
    if not rows:
        sys.exit("results.py: no BW rows in %s" % path)
    return rows, info


def diagnostic(path, keys, best):
    d, _ = bw_lines(path)
    rows = [{"system": "tessera-nccl (TESSERA_NCCL_BLOCKING=0)", "op": op, "size_mib": mb, "busbw_gbs": d[(op, mb)],
             "busbw_ratio": round(d[(op, mb)] / best[("pytorch-nccl", op, mb)], 3)} for op, mb in keys if (op, mb) in d]
    return {"title": "Diagnostic: one run on non-blocking NCCL communicators (TESSERA_NCCL_BLOCKING=0; not the default)",
            "columns": ["op", "size_mib", "busbw_gbs", "busbw_ratio"], "rows": rows}


def command(a):
    sides = {"pytorch-nccl": [bw_lines(p) for p in a.torch], "tessera-nccl": [bw_lines(p) for p in a.tessera]}
    keys = sorted(sides["pytorch-nccl"][0][0], key=lambda k: (k[1], OPS.index(k[0])))
    best, rows = {}, []
    for system, runs in sides.items():
        for op, mb in keys:
            vals = [r[0][(op, mb)] for r in runs if (op, mb) in r[0]]
            best[(system, op, mb)] = max(vals)
            rows.append({"kind": "collective", "system": system, "op": op, "size_mib": mb, "busbw_gbs": max(vals),
                         "runs": vals})
    for row in rows:
        if row["system"] == "tessera-nccl":
            row["busbw_ratio"] = round(row["busbw_gbs"] / best[("pytorch-nccl", row["op"], row["size_mib"])], 3)
    pivot = [{"op": op, "MiB": mb, "PyTorch busbw GB/s": best[("pytorch-nccl", op, mb)],
              "tessera busbw GB/s": best[("tessera-nccl", op, mb)],
              "ratio": round(best[("tessera-nccl", op, mb)] / best[("pytorch-nccl", op, mb)], 3)}
             for op in OPS for op2, mb in keys if op2 == op]
    tables = [{"title": "Best round per side", "columns": list(pivot[0]), "rows": pivot}]
    if a.diag_nonblocking:
        tables.append(diagnostic(a.diag_nonblocking, keys, best))
    info = {s: sorted({i for r in runs for i in r[1]}) for s, runs in sides.items()}
    run = dict(run=a.run or "bf16", title=a.title or "tessera's NCCL communicator beside torch.distributed (NCCL)",
               machine=a.machine, environment=a.environment, command=a.command,
               method=a.method or ("5 warm-ups, 20 timed iterations between CUDA events on the caller's stream; busbw "
                                   "as nccl-tests; best of %d interleaved rounds per side; bf16" % len(a.torch)),
               info=info, columns=["busbw_ratio"], rows=rows, tables=tables, notes=a.note)
    md, problems = suite.put_run(a.results, a.suite or "collectives", run,
                                 dict(kind="collective", gpus=a.gpus, precision="bf16",
                                      layout="%d ranks, one per GPU" % a.gpus))
    print(md)
    bad = [(op, mb) for op, mb in keys
           if mb >= 64 and best[("tessera-nccl", op, mb)] < TARGET * best[("pytorch-nccl", op, mb)]]
    print("target: tessera >= %g x PyTorch at >= 64 MiB: %s" % (TARGET, "met" if not bad else "NOT met for %s" % bad))
    return problems
