#!/usr/bin/env bash
# tessera.train (examples/python/train_llama.py) against train_gpt: the same flags drive the same C++
# Trainer, so each step's loss and gradient norm are bitwise train_gpt's. The small Llama on the
# Brown corpus under torchrun on 4 ranks (Gloo). Exit 0 pass, 1 fail, 77 skip.
#
#   train_test.sh <python> <train_gpt> <case>
# cases: ddp_2x2      DDP, dp 2 x tp 2, with validation; the MoE twin (moe-tiny) with its experts over --ep 2
#        fsdp_2x2     FSDP, dp 2 x tp 2, saved at step 3 by Python and resumed by train_gpt to step 5
#        cp2_fp8      dp 2 x cp 2 with --fp8 tensorwise (the CPU emulation)
#        pp2_zb       pp 2 x tp 2 with the zero-bubble schedule (ZB-H1) and the tied table over pp
#        kwargs       a Trainer built from keyword arguments (tessera.train.Config(...)) equals the flags'
set -uo pipefail

PY=$1 TRAIN=$2 CASE=$3
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LIMIT=${TESSERA_TRAIN_TEST_TIMEOUT_S:-240}
export TESSERA_TIMEOUT_S=${TESSERA_TIMEOUT_S:-60} TESSERA_BACKEND=gloo OMP_NUM_THREADS=1
# torchrun's agent polls its workers every 0.1 s (its default of 5 s adds up to 5 s to every launch).
export PET_MONITOR_INTERVAL=${PET_MONITOR_INTERVAL:-0.1}
WORK=$(mktemp -d)
OUT=$WORK/out.txt
trap 'rm -rf "$WORK"' EXIT
source "$ROOT/tests/launch/lib.sh"
COMPARE=$ROOT/tests/train/compare_losses.py
DATA=${TESSERA_TRAIN_DATA:-$ROOT/data/brown/brown_sp4096_text_document}
[[ -f $DATA.idx && -f $DATA.bin ]] || { echo "FAIL: $DATA.idx/.bin missing: run scripts/setup (it prepares the Brown corpus)"; exit 1; }
FLAGS=(--model llama-tiny --seq-len 32 --batch 16 --steps 5 --lr 1e-2 --lr-schedule cosine --warmup 2 --min-lr 1e-3
       --clip 0.3 --seed 7 --data "$DATA" --vocab 4096 --split 98,2 --eod-token 2)

gpt() {  # gpt <log> <flags...>: train_gpt on 4 ranks
  local log=$1
  shift
  launch torchrun -r 1 -t 1 --master_port="$(free_port)" --nproc_per_node=4 --no_python "$TRAIN" "${FLAGS[@]}" \
    --log-jsonl "$WORK/$log.jsonl" "$@"
  ((RC == 0)) || fail "train_gpt $* exited with $RC"
}
py() {  # py <script> <log> <flags...>: a Python program on 4 ranks
  local script=$1 log=$2
  shift 2
  launch "$PY" -m torch.distributed.run -r 1 -t 1 --master_port="$(free_port)" --nproc_per_node=4 \
    "$script" "${FLAGS[@]}" --log-jsonl "$WORK/$log.jsonl" "$@"
  ((RC == 0)) || fail "$(basename "$script") $* exited with $RC"
}
example() { py "$ROOT/examples/python/train_llama.py" "$@"; }
same() {  # same <ref log> <log> [--steps a-b]: bitwise equal losses and gradient norms
  python3 "$COMPARE" "$WORK/$1.jsonl" "$WORK/$2.jsonl" --bitwise "${@:3}" || fail "$2 differs from $1"
}

case $CASE in
  ddp_2x2)
    gpt ref --dp 2 --tp 2 --eval-every 5 --eval-batches 2 --model moe-tiny --ep 2
    example got --dp 2 --tp 2 --eval-every 5 --eval-batches 2 --model moe-tiny --ep 2
    grep -qE "step 5/5 loss [0-9.]+ \| valid loss [0-9.]+ \| lr" "$OUT" || fail "no progress line with validation"
    grep -qE "step 5/5 .* \| moe: load max/mean [0-9.]+" "$OUT" || fail "no MoE routing in the progress line"
    same ref got
    ;;
  fsdp_2x2)
    gpt ref --dp 2 --tp 2 --dp-mode fsdp
    example cut --dp 2 --tp 2 --dp-mode fsdp --checkpoint-dir "$WORK/ckpt" --checkpoint-every 3 --stop-after 3
    same ref cut --steps 1-3
    gpt resumed --dp 2 --tp 2 --dp-mode fsdp --checkpoint-dir "$WORK/ckpt"
    grep -q "resumed from $WORK/ckpt/step-3 at step 3" "$OUT" || fail "train_gpt did not resume Python's checkpoint at step 3"
    same ref resumed --steps 4-5
    ;;
  cp2_fp8)
    gpt ref --dp 2 --cp 2 --fp8 tensorwise
    example got --dp 2 --cp 2 --fp8 tensorwise
    same ref got
    ;;
  pp2_zb)
    gpt ref --pp 2 --tp 2 --schedule zb-h1
    example got --pp 2 --tp 2 --schedule zb-h1
    same ref got
    ;;
  kwargs)
    gpt ref --dp 2 --tp 2
    cat >"$WORK/kwargs.py" <<'PYEOF'
import sys
import tessera
from tessera import train
tessera.init()
log = sys.argv[sys.argv.index("--log-jsonl") + 1]
data = sys.argv[sys.argv.index("--data") + 1]
cfg = train.Config(model="llama-tiny", seq_len=32, batch=16, steps=5, lr=1e-2, lr_schedule="cosine", warmup=2,
                   min_lr=1e-3, clip=0.3, seed=7, data=data, vocab=4096, split="98,2", eod_token=2, dp=2, tp=2,
                   log_jsonl=log)
assert cfg["tp"] == 2 and cfg["dp-mode"] == "ddp", cfg.as_dict()
reports = train.Trainer(cfg).fit()
assert [r.step for r in reports] == [1, 2, 3, 4, 5], reports
PYEOF
    py "$WORK/kwargs.py" got
    same ref got
    ;;
  *) fail "unknown case $CASE" ;;
esac
echo "PASS ($CASE)"
