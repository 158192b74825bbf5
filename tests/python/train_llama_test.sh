#!/usr/bin/env bash
# examples/python/train_llama.py against train_gpt: the small Llama on the Brown corpus, the same
# flags, seed and layout, under torchrun on 4 ranks (Gloo): each step's loss within rtol 1e-5
# (tests/train/compare_losses.py; the layouts differ only in float32 summation order: the
# Python model splits wq/wk/wv and w1/w3 into separate GEMMs where the C++ one fuses them).
# Exit 0 pass, 1 fail, 77 skip.
#
#   train_llama_test.sh <python> <train_gpt> <case>
# cases: dp2_tp2      DDP, dp 2 x tp 2, against train_gpt's dp 2 x tp 2 (with validation)
#        fsdp_resume  FSDP dp 2 x tp 2 stops after saving at step 3; resumed as pp 2 x tp 2 (DDP, tied
#                     embeddings on both end stages) to step 5: both parts against train_gpt's
#                     uninterrupted dp 2 x tp 2
#        batch_lr_resume  no --batch: dp 2 x tp 2 (batch 16) saves at step 3 of 3 (cosine to 0); resumed
#                     as dp 4 with --steps 6: the global batch stays 16 (not 8 x 4), and step 4's
#                     learning rate is the 6-step schedule's (train_gpt's), not the old run's last (0)
set -uo pipefail

PY=$1 TRAIN=$2 CASE=$3
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LIMIT=${TESSERA_TRAIN_TEST_TIMEOUT_S:-240}
export TESSERA_TIMEOUT_S=${TESSERA_TIMEOUT_S:-60} TESSERA_BACKEND=gloo OMP_NUM_THREADS=1
# torchrun's agent polls its workers every 0.1 s (PET_MONITOR_INTERVAL; its default of 5 s adds up to
# 5 s to every launch).
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
py() {  # py <log> <flags...>: train_llama.py on 4 ranks
  local log=$1
  shift
  launch "$PY" -m torch.distributed.run -r 1 -t 1 --master_port="$(free_port)" --nproc_per_node=4 \
    "$ROOT/examples/python/train_llama.py" "${FLAGS[@]}" --log-jsonl "$WORK/$log.jsonl" "$@"
  ((RC == 0)) || fail "train_llama.py $* exited with $RC"
}
compare() {  # compare <ref log> <log> [options]
  python3 "$COMPARE" "$WORK/$1.jsonl" "$WORK/$2.jsonl" --rtol 1e-5 "${@:3}" || fail "$2's loss curve differs from $1's"
}

case $CASE in
  dp2_tp2)
    gpt ref --dp 2 --tp 2 --eval-every 5 --eval-batches 2
    py got --dp 2 --tp 2 --eval-every 5 --eval-batches 2
    grep -qE "^\[default0\]:step 5/5 loss [0-9.]+ \| valid loss [0-9.]+ \| lr" "$OUT" || fail "no progress line with validation"
    compare ref got
    python3 - "$WORK/ref.jsonl" "$WORK/got.jsonl" <<'EOF' || fail "validation loss or gradient norms differ"
import json, sys
ref, got = ([json.loads(l) for l in open(p) if '"step"' in l] for p in sys.argv[1:])
for r, g in zip(ref, got):
    assert abs(g["grad_norm"] - r["grad_norm"]) <= 1e-4 * r["grad_norm"], (r, g)
    assert abs(g["lr"] - r["lr"]) <= 1e-12 + 1e-9 * r["lr"], (r, g)
assert ref[-1]["grad_norm"] > 0.3 or any(r["grad_norm"] > 0.3 for r in ref), "the clip (0.3) never acted"
vr, vg = ref[-1]["valid_loss"], got[-1]["valid_loss"]
assert vr is not None and vg is not None and abs(vg - vr) <= 1e-5 * vr, (vr, vg)
print(f"grad norms and learning rates agree; valid loss {vg:.9g} vs train_gpt {vr:.9g}")
EOF
    echo "PASS ($CASE)"
    ;;
  fsdp_resume)
    gpt ref --dp 2 --tp 2
    py cut --dp 2 --tp 2 --dp-mode fsdp --checkpoint-dir "$WORK/ckpt" --checkpoint-every 3 --stop-after 3
    compare ref cut --steps 1-3
    py resumed --pp 2 --tp 2 --checkpoint-dir "$WORK/ckpt"
    grep -q "resumed from $WORK/ckpt at step 3" "$OUT" || fail "the second run did not resume at step 3"
    compare ref resumed --steps 4-5
    echo "PASS ($CASE)"
    ;;
  batch_lr_resume)
    FLAGS=(--model llama-tiny --seq-len 32 --steps 6 --lr 1e-2 --lr-schedule cosine --warmup 1 --clip 0.3 --seed 7
           --data "$DATA" --vocab 4096 --split 98,2 --eod-token 2)
    gpt ref --dp 2 --tp 2
    py cut --dp 2 --tp 2 --steps 3 --checkpoint-dir "$WORK/ckpt"
    py resumed --dp 4 --checkpoint-dir "$WORK/ckpt"
    grep -q "resumed from $WORK/ckpt at step 3" "$OUT" || fail "the second run did not resume at step 3"
    grep -q "keeping the checkpoint's global batch of 16 sequences" "$OUT" || fail "the global batch was not kept"
    grep -q "| batch 16 " "$OUT" || fail "the resumed run does not train with batch 16"
    python3 - "$WORK/ref.jsonl" "$WORK/resumed.jsonl" <<'EOF' || fail "step 4's learning rate is not the schedule's"
import json, sys
ref, got = ({r["step"]: r for r in map(json.loads, open(p)) if r.get("event") == "step"} for p in sys.argv[1:])
assert sorted(got) == [4, 5, 6], sorted(got)
for s in (4, 5, 6):
    assert got[s]["lr"] > 0 and abs(got[s]["lr"] - ref[s]["lr"]) <= 1e-9 * ref[s]["lr"], (s, got[s]["lr"], ref[s]["lr"])
print("steps 4-6: the learning rates of the 6-step schedule", [got[s]["lr"] for s in (4, 5, 6)])
EOF
    echo "PASS ($CASE)"
    ;;
  *) fail "unknown case $CASE" ;;
esac
