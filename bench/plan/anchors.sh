#!/usr/bin/env bash
# tessera-plan against the published Megatron-Bridge anchors (llama3 8B on 8, 70B on 64, 405B on 1,024
# H100s, FP8, seq 8192): for each, the prediction for tessera on the published layout (DDP or FSDP,
# whichever is faster, with the least recompute that fits) and the best layout tessera-plan finds,
# on the derived H100 entry of bench/plan/calibration.json and bench/plan/clusters/dgx-h100-ib.json.
#   bench/plan/anchors.sh [BUILD_DIR]     (prints Markdown rows; docs/design/plan.md holds them)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export TESSERA_BUILD_DIR=${1:-$ROOT/build}
PLAN=("$ROOT/tools/tessera-plan")
COMMON=(--cluster "$ROOT/bench/plan/clusters/dgx-h100-ib.json" --card "NVIDIA H100 80GB HBM3" --seq 8192 --fp8)
M70="llama3-8b:d=8192,layers=80,heads=64,kv=8,ffn=28672"
M405="llama3-8b:d=16384,layers=126,heads=128,kv=8,ffn=53248"
# row NAME PUBLISHED MODEL GPUS BATCH LAYOUT (SHARD: ddp or fsdp, the faster that fits with the least recompute)
row() {
  local name=$1 published=$2 model=$3 gpus=$4 batch=$5 layout=$6 rc sh line fit="" best nocp
  for rc in none selective full; do
    for sh in ddp fsdp; do
      line=$("${PLAN[@]}" predict "${COMMON[@]}" --model "$model" --gpus "$gpus" --batch "$batch" \
        --layout "${layout/SHARD/$sh}" --recompute "$rc" 2>/dev/null | sed -n 4p) || continue
      if [ -z "$fit" ] || [ "$(echo "$line" | awk '{print $5}')" -gt "$(echo "$fit" | awk '{print $5}')" ]; then
        fit=$line
      fi
    done
    [ -n "$fit" ] && break
  done
  best=$("${PLAN[@]}" search "${COMMON[@]}" --model "$model" --gpus "$gpus" --batch "$batch" --top 1 --refused 0 |
    sed -n 4p)
  nocp=$("${PLAN[@]}" search "${COMMON[@]}" --model "$model" --gpus "$gpus" --batch "$batch" --top 1 --refused 0 \
    --max-cp 1 | sed -n 4p)
  read -r _ l1 r1 _ t1 _ <<<"${fit:-- (does-not-fit) - -}"
  read -r _ l2 r2 _ t2 _ <<<"$best"
  read -r _ l3 r3 _ t3 _ <<<"$nocp"
  echo "| $name | $published | \`$l1\` $r1 | $t1 | \`$l2\` $r2 | $t2 |" \
    "\`$l3\` $r3 | $t3 |"
}
echo "| anchor | published tok/s/GPU | tessera on that layout | predicted | tessera-plan's choice | predicted |" \
  "best without CP | predicted |"
echo "|---|---|---|---|---|---|---|---|"
row "llama3 8B, 8 x H100, FSDP 8, GBS 128" 14451 llama3-8b 8 128 "dp=8,SHARD,mb=1,m=16,shardacc"
row "llama3 70B, 64 x H100, TP 4 PP 8 VP 5, GBS 256" 1664 "$M70" 64 256 \
  "dp=2,tp=4,pp=8,SHARD,mb=1,m=128,interleaved,vp=5"
row "llama3.1 405B, 1024 x H100, TP 8 PP 8 CP 2, GBS 512 (assumed)" 326 "$M405" 1024 512 \
  "dp=8,tp=8,pp=8,cp=2,SHARD,mb=1,m=64,1f1b"
