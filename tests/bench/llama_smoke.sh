#!/usr/bin/env bash
# bench/llama/run.sh on the CPU: llama-tiny, fp32, 8 steps, both systems and the writer (the run llama-tiny of
# llama_curves.json in a temporary directory). train_gpt and the PyTorch Llama start from the same weights on
# the same batch, so their first losses agree (fp32: within 1e-4 relative); the rows validate, the loss gap and
# the plot exist.
#   llama_smoke.sh BUILD_DIR PYTHONPATH DATA_PREFIX
set -uo pipefail
# torchrun's agent polls its workers every 0.1 s (PET_MONITOR_INTERVAL; its default of 5 s adds up to
# 5 s to every launch).
export PET_MONITOR_INTERVAL=${PET_MONITOR_INTERVAL:-0.1}
BUILD=$1 PYPATH=$2 DATA=$3
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
[ -f "$DATA.idx" ] || { echo "FAIL: $DATA.idx missing: run scripts/setup"; exit 1; }
export PYTHONPATH="$PYPATH${PYTHONPATH:+:$PYTHONPATH}" TESSERA_BACKEND=gloo OMP_NUM_THREADS=1
PYTHON=/usr/bin/python3 MODEL=llama-tiny STEPS=8 COMPILE_STEPS=0 B=4 WARMUP=2 RESULTS="$WORK/results" DATA="$DATA" \
  timeout -k 10 240 bash "$(dirname "$0")/../../bench/llama/run.sh" "$BUILD" "$WORK/logs" curves || {
  echo "FAIL: bench/llama/run.sh failed"; exit 1; }
/usr/bin/python3 - "$WORK" "$(cd "$(dirname "$0")/../.." && pwd)" <<'PY' || exit 1
import json, os, sys
w = sys.argv[1]
sys.path.insert(0, os.path.join(sys.argv[2], "bench"))
from results_lib import schema
doc = json.load(open(os.path.join(w, "results", "llama_curves.json")))
assert not schema.problems(doc), schema.problems(doc)
(res,) = doc["runs"]
assert res["run"] == "llama-tiny", res["run"]
systems = {r["system"] for r in res["rows"]}
assert systems == {"tessera", "pytorch-eager"}, systems
first = [json.loads(l)["loss"] for name in ("tessera", "pytorch-eager")
         for l in open(os.path.join(w, "logs", name + ".jsonl")) if '"step": 1,' in l]
assert len(first) == 2 and abs(first[0] - first[1]) <= 1e-4 * abs(first[1]), f"first losses differ: {first}"
assert res["loss_curves"]["steps"] == 8, res["loss_curves"]
assert res["plot"] == "llama_curves.llama-tiny.png", res.get("plot")
assert os.path.getsize(os.path.join(w, "results", res["plot"])) > 10000
print(f"PASS: first loss tessera {first[0]:.6f} / PyTorch {first[1]:.6f}; gap over 8 steps {res['loss_curves']}")
PY
