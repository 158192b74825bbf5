#!/usr/bin/env bash
# FP8 on a GPU learns as bf16 does (issue 37's measured safety): train_gpt on one GPU, a Llama of
# llama-tiny's family widened so every GEMM dimension is a multiple of 16 (d 256, 4 heads, 2 kv heads,
# FFN 768, T 256), on the Brown corpus, the same seed and data with --fp8 off and tensorwise
# (bench/fp8/loss_gap.sh: the table and the overlaid PNG under OUT). Fails when FP8's final
# validation loss is more than TOL above bf16's, or when either run did not learn (validation
# loss not 1 below ln 4096). Exit 0 pass, 1 fail, 77 skip (no GPU, or no data/brown).
#   gpu_loss_gap.sh BUILD_DIR [OUT_DIR]      Env: STEPS (300), TOL (0.05), RECIPE (tensorwise)
set -uo pipefail
BUILD=$1 OUT=${2:-$(mktemp -d)}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DATA=$ROOT/data/brown/brown_sp4096_text_document
STEPS=${STEPS:-300} TOL=${TOL:-0.05} RECIPE=${RECIPE:-tensorwise}
if ! nvidia-smi -L >/dev/null 2>&1; then echo "SKIP: no GPU visible"; exit 77; fi
if [[ ! -f $DATA.bin ]]; then echo "SKIP: $DATA.bin missing (scripts/setup prepares it; carry data/brown)"; exit 77; fi
PY=$(command -v python3)
LAUNCH=torchrun NPROC=1 STEPS=$STEPS RECIPES="off $RECIPE" PYTHON=$PY DATA=$DATA \
  NOTE="one GPU ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)), bf16 autocast; tests/fp8/gpu_loss_gap.sh" \
  "$ROOT/bench/fp8/loss_gap.sh" "$BUILD" "$OUT" fp8_loss_gpu --model llama-tiny --hidden-size 256 --heads 4 --kv-heads 2 \
  --ffn 768 --seq-len 256 --batch 16 --precision bf16 --lr 3e-3 --lr-schedule cosine --warmup 50 --seed 7 \
  --eval-every 100 --eval-batches 8 || { echo "FAIL: a run failed"; exit 1; }
"$PY" - "$OUT/fp8_loss_gpu.json" "$TOL" <<'PY'
import json, math, sys
doc, tol = json.load(open(sys.argv[1])), float(sys.argv[2])
for r in doc["rows"]:
    v = r["valid"][-1]
    print(f"{r['recipe']}: final validation loss bf16 {v['off']:.4f}, fp8 {v['fp8']:.4f} (gap {v['gap']:+.4f}, "
          f"tolerance {tol}); largest training-loss gap {r['largest_gap']:+.4f} at step {r['largest_gap_step']}")
    if v["gap"] > tol or max(v["off"], v["fp8"]) > math.log(4096) - 1:
        sys.exit(1)
print("PASS")
PY
