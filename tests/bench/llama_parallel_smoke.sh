#!/usr/bin/env bash
# bench/llama/parallel.sh on the CPU (2 ranks over Gloo, llama-tiny, fp32, 2 timed steps), the run
# llama-tiny-single-dp-pp of scale.json in a temporary directory, valid against the row schema: every run that
# torch 1.x can make writes its row under the name results.py scales and pairs (PyTorch's single and ddp;
# train_gpt's single, ddp, pp), each against its own system's single row,
# train_gpt's beside PyTorch's of the same layout; PyTorch's pp (torch 2 only) is noted as not run, and both
# systems' first losses are near ln(vocab) (sane initial weights).
#   llama_parallel_smoke.sh BUILD_DIR
set -uo pipefail
# torchrun's agent polls its workers every 0.1 s (PET_MONITOR_INTERVAL; its default of 5 s adds up to
# 5 s to every launch).
export PET_MONITOR_INTERVAL=${PET_MONITOR_INTERVAL:-0.1}
BUILD=$1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export TESSERA_BACKEND=gloo OMP_NUM_THREADS=1
PYTHON=/usr/bin/python3 MODEL=llama-tiny STEPS=2 B=2 PP_B=4 MB=2 RECOMPUTE=full RESULTS="$WORK/results" \
  timeout -k 10 270 bash "$(dirname "$0")/../../bench/llama/parallel.sh" "$BUILD" "$WORK/logs" single dp pp || {
  echo "FAIL: bench/llama/parallel.sh failed"; exit 1; }
/usr/bin/python3 - "$WORK" "$(cd "$(dirname "$0")/../.." && pwd)" <<'PY' || exit 1
import json, math, os, sys
w = sys.argv[1]
sys.path.insert(0, os.path.join(sys.argv[2], "bench"))
from results_lib import schema
doc = json.load(open(os.path.join(w, "results", "scale.json")))
assert not schema.problems(doc), schema.problems(doc)
(res,) = doc["runs"]
assert res["run"] == "llama-tiny-single-dp-pp" and res["machine"].startswith("CPU"), (res["run"], res["machine"])
rows = {r["system"]: r for r in res["rows"]}
want = {"pytorch-single": "pytorch-single", "tessera-train-single": "tessera-train-single",
        "pytorch-ddp": "pytorch-single", "tessera-train-ddp": "tessera-train-single",
        "tessera-train-pp-mb2": "tessera-train-single", "tessera-train-pp-zb-mb2": "tessera-train-single"}
assert set(rows) == set(want), sorted(rows)
assert "missing" not in res, res["missing"]
for s, ref in want.items():
    assert rows[s]["scaled_against"] == ref and rows[s]["scaling"] > 0, (s, rows[s])
assert rows["tessera-train-ddp"]["vs_pytorch"] > 0 and rows["tessera-train-single"]["vs_pytorch"] > 0, rows
assert rows["pytorch-ddp"]["gpus"] == 2 and rows["pytorch-ddp"]["batch"] == 4, rows["pytorch-ddp"]
assert rows["pytorch-ddp"]["global_batch"] == 4 and rows["pytorch-ddp"]["layout"] == "ddp 2", rows["pytorch-ddp"]
assert rows["tessera-train-pp-mb2"]["layout"] == "pp 2, 2 micro-batches", rows["tessera-train-pp-mb2"]
for pp in ("tessera-train-pp-mb2", "tessera-train-pp-zb-mb2"):
    assert rows[pp]["micro_batches"] == 2 and rows[pp]["batch"] == 4, rows[pp]
assert rows["pytorch-ddp"]["recompute"] == "full" and rows["pytorch-ddp"]["clip"] == 1.0, rows["pytorch-ddp"]
notes = " ".join(res["notes"])
assert "recompute full on both sides" in notes, notes
# The compiled anchor's rows (torch >= 2 only, so not made here): scaled against their own single row, and
# tessera's rows get vs_compiled beside vs_pytorch.
import importlib.util
spec = importlib.util.spec_from_file_location("results", os.path.join(sys.argv[2], "bench", "results.py"))
results = importlib.util.module_from_spec(spec)
spec.loader.exec_module(results)
syn = {s: dict(system=s, gpus=g, tokens_per_s=t, step_ms=100.0, batch=4 * g) for s, g, t in [
    ("pytorch-single", 1, 100.0), ("pytorch-compiled-single", 1, 125.0), ("tessera-train-single", 1, 130.0),
    ("pytorch-ddp", 2, 180.0), ("pytorch-compiled-ddp", 2, 240.0), ("tessera-train-ddp", 2, 252.0)]}
results.derive(syn, [("pytorch", "pytorch-single"), ("pytorch-compiled", "pytorch-compiled-single"),
                     ("tessera-train", "tessera-train-single")], layouts=["tessera-train-"])
assert syn["pytorch-compiled-ddp"]["scaled_against"] == "pytorch-compiled-single", syn["pytorch-compiled-ddp"]
assert syn["tessera-train-ddp"]["vs_pytorch"] == 1.4 and syn["tessera-train-ddp"]["vs_compiled"] == 1.05, syn
assert syn["tessera-train-single"]["vs_compiled"] == 1.04 and "vs_compiled" not in syn["pytorch-ddp"], syn
assert "pytorch-pp-mb2: not run" in notes, notes
tessera_first = next(json.loads(l)["loss"] for l in open(os.path.join(w, "logs", "tessera-train-single.jsonl"))
                     if '"step": 1,' in l)
losses = {"tessera-train-single (first)": tessera_first, "pytorch-single (last)": rows["pytorch-single"]["last_loss"]}
assert all(abs(v - math.log(4096)) < 1.0 for v in losses.values()), losses
print("PASS: %d rows, scaling %s; losses %s" % (len(rows), {s: r["scaling"] for s, r in rows.items()}, losses))
PY
