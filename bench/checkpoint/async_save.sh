#!/usr/bin/env bash
# The cost of a checkpoint on the training step, asynchronous vs synchronous (issue 35): train_gpt on
# one GPU (default llama3-1b, batch 8 x 2048, bf16, fused kernels), STEPS steps with a save every
# EVERY steps, three runs: no checkpoint, --async-checkpoint off, --async-checkpoint on. Each step
# record's wall clock (wall_s) gives the time between steps; a save's cost is the extra time of the
# interval that holds it (bench/checkpoint/async_save.py). Writes the run MODEL of bench/results/checkpoint.{json,md}.
#   bench/checkpoint/async_save.sh BUILD_DIR
# Env: MODEL (llama3-1b), STEPS (60), EVERY (20), BATCH (8), CKPT_DIR (/tmp/tessera-async-ckpt), LOGS.
set -uo pipefail
BUILD=${1:?build dir}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODEL=${MODEL:-llama3-1b} STEPS=${STEPS:-60} EVERY=${EVERY:-20} BATCH=${BATCH:-8}
CKPT=${CKPT_DIR:-/tmp/tessera-async-ckpt}
LOGS=${LOGS:-$BUILD/async-ckpt-logs}
mkdir -p "$LOGS"
run() {  # run <name> <flags...>
  local name=$1
  shift
  rm -rf "$CKPT" "$CKPT.old" "$CKPT.tmp"
  echo "[async_save] $name: train_gpt --model $MODEL --steps $STEPS --batch $BATCH $*"
  torchrun --standalone --nproc_per_node=1 --no-python "$BUILD/bin/train_gpt" --model "$MODEL" --steps "$STEPS" --batch "$BATCH" --lr 3e-4 --warmup 5 \
    --log-jsonl "$LOGS/$name.jsonl" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  tail -n 3 "$LOGS/$name.log"
  ((rc == 0)) || { echo "[async_save] $name failed ($rc)"; tail -n 30 "$LOGS/$name.log"; }
  du -sh "$CKPT" 2>/dev/null
}
export TESSERA_BACKEND=nccl
run none
run sync --checkpoint-dir "$CKPT" --checkpoint-every "$EVERY" --async-checkpoint off
run async --checkpoint-dir "$CKPT" --checkpoint-every "$EVERY" --async-checkpoint on
rm -rf "$CKPT" "$CKPT.old" "$CKPT.tmp"
source "$ROOT/bench/run_lib.sh"  # machine, environment
python3 "$ROOT/bench/checkpoint/async_save.py" "$LOGS" --every "$EVERY" --machine "$(machine 1)" \
  --environment "$(environment)" --model "$MODEL" \
  --command "MODEL=$MODEL STEPS=$STEPS EVERY=$EVERY BATCH=$BATCH bench/checkpoint/async_save.sh $BUILD"
