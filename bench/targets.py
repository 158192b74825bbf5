#!/usr/bin/env python3
"""The issues' 2-GPU targets read off the committed results (the runs ddp, tp, pp and fsdp of gpt735m.json,
the latest of each name on any machine), to say at once which issue a run settles. For each it lists the
2-GPU rows measured on real GPUs (rows from one GPU, emulated or without communication are left out), each
with the target it is held to, and says which rows meet it:

  issue 3, DDP  (run ddp):  scaling >= 0.97 and peak memory <= PyTorch DDP's in the same run
  issue 4, TP   (run tp):   scaling >= 0.85, both without and with sequence parallel
  issue 5, PP   (run pp):   1F1B, 16 micro-batches, scaling >= 0.90 (peak memory shown beside PyTorch's)
  issue 6, FSDP (run fsdp): scaling >= 0.97 and peak memory <= PyTorch FSDP2's in the same run

  bench/targets.py [RESULTS_DIR]   (default bench/results)
Reads only; exit status 0 whatever the verdicts (1 when a results file cannot be read).
"""
import json
import os
import sys


SUITE = "gpt735m"


def load(results, name):
    """The latest run `name` of the suite file (by date), KeyError when it has none."""
    with open(os.path.join(results, SUITE + ".json")) as f:
        runs = [r for r in json.load(f)["runs"] if r["run"] == name]
    if not runs:
        raise KeyError("no run %r" % name)
    return max(runs, key=lambda r: r.get("date", ""))


def measured_2gpu(rows, prefix):
    out = []
    for r in rows:
        s = r.get("system", "")
        if not s.startswith(prefix) or r.get("gpus") != 2:
            continue
        if any(w in s for w in ("emulated", "nocomm")) or r.get("fake_world"):
            continue
        out.append(r)
    return out


def row_of(rows, system):
    return next((r for r in rows if r.get("system") == system), None)


def line(r, ok, extra=""):
    mem = r.get("peak_mem_gib")
    return (f"  {'MEETS' if ok else '     '} {r['system']:<44} scaling {r.get('scaling', float('nan')):.3f}"
            f"  peak {mem if mem is not None else '—'} GiB{extra}")


def header(doc, title):
    return f"{title}: {doc.get('date', '?')}, {doc.get('machine', '?')}"


def check_against_pytorch(doc, title, ref_system, ref_name, prefix):
    """Rows meeting scaling >= 0.97 at no more peak memory than `ref_system` in the same run."""
    rows = doc["rows"]
    ref = row_of(rows, ref_system)
    cap = ref["peak_mem_gib"] if ref else None
    print(header(doc, f"{title}: scaling >= 0.97, peak <= {ref_name}'s"
                 + (f" ({cap} GiB, scaling {ref['scaling']:.3f})" if ref else f" (no {ref_name} row: not judged)")))
    met = False
    for r in measured_2gpu(rows, prefix):
        ok = cap is not None and r["scaling"] >= 0.97 and r["peak_mem_gib"] <= cap
        met |= ok
        print(line(r, ok))
    return met


def check_ddp(doc):
    return check_against_pytorch(doc, "issue 3, DDP", "pytorch-ddp", "PyTorch DDP", "tessera-ddp")


def check_tp(doc):
    rows = doc["rows"]
    print(header(doc, "issue 4, TP: scaling >= 0.85 without and with sequence parallel"))
    plain = sp = False
    for r in measured_2gpu(rows, "tessera-tp"):
        ok = r["scaling"] >= 0.85
        if "-sp" in r["system"]:
            sp |= ok
        else:
            plain |= ok
        print(line(r, ok))
    print(f"  without sequence parallel: {'met' if plain else 'not met'}; with: {'met' if sp else 'not met'}")
    return plain and sp


def check_pp(doc):
    rows = doc["rows"]
    ref = row_of(rows, "pytorch-pp-mb16")
    print(header(doc, "issue 5, PP: 1F1B with 16 micro-batches, scaling >= 0.90"
                 + (f" (PyTorch: {ref['scaling']:.3f}, peak {ref['peak_mem_gib']} GiB)" if ref else "")))
    met = False
    for r in measured_2gpu(rows, "tessera-pp-1F1B-mb16"):
        ok = r["scaling"] >= 0.90
        met |= ok
        per_rank = r.get("peak_mem_GiB_per_rank")
        print(line(r, ok, f" (per rank {per_rank})" if per_rank else ""))
    return met


def check_fsdp(doc):
    return check_against_pytorch(doc, "issue 6, FSDP", "pytorch-fsdp", "PyTorch FSDP2", "tessera-fsdp")


def main():
    results = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    verdicts = {}
    for issue, name, fn in ((3, "ddp", check_ddp), (4, "tp", check_tp), (5, "pp", check_pp), (6, "fsdp", check_fsdp)):
        try:
            verdicts[issue] = fn(load(results, name))
        except (OSError, ValueError, KeyError) as e:
            print(f"issue {issue}: cannot read the run {name} of {SUITE}.json in {results}: {e}")
            return 1
        print()
    print("targets met: " + ", ".join(f"issue {i} {'yes' if v else 'no'}" for i, v in verdicts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
