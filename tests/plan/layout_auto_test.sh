#!/usr/bin/env bash
# train_gpt --layout auto on 4 CPU ranks (Gloo, under mpirun): a calibration of this CPU made by
# tessera_plan, the layout it chooses applied exactly (the same losses, bitwise, as the explicit
# flags of that layout), and the errors without --plan-calibration, for a card it lacks and for a
# mixture-of-experts model (which the cost model refuses by name).
#   layout_auto_test.sh TRAIN_GPT TESSERA_PLAN LINK_JSON
set -euo pipefail
TRAIN=$1 PLAN=$2 LINK=$3
command -v mpirun >/dev/null || { echo "layout_auto_test: no mpirun: skipped"; exit 77; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
fail() { echo "layout_auto_test: FAIL: $*" >&2; exit 1; }
run() {  # run LOG train_gpt-args... (MODEL: llama-tiny)
  local log=$1
  shift
  TESSERA_BACKEND=gloo timeout 120 mpirun --allow-run-as-root --oversubscribe -np 4 -x TESSERA_BACKEND "$TRAIN" \
    --model "${MODEL:-llama-tiny}" --batch 8 --steps 3 --seed 7 "$@" >"$log" 2>&1
}
"$PLAN" calibrate --out cal.json --models llama-tiny --tp 1 2 4 --tokens 32 128 --seqs 32 64 --intra-link "$LINK" \
  >calibrate.log 2>&1 || { cat calibrate.log; fail "tessera_plan calibrate"; }
run auto.log --layout auto --plan-calibration cal.json --log-jsonl auto.jsonl || { cat auto.log; fail "the auto run"; }
chosen=$(grep -o -- '--layout auto: [^ ]*' auto.log | head -1 | cut -d' ' -f3)
[ -n "$chosen" ] || { cat auto.log; fail "no choice logged"; }
recompute=$(grep -o -- '--layout auto: [^ ]* with [a-z]*' auto.log | head -1 | awk '{print $NF}')
echo "chosen: $chosen, recompute $recompute"
# The same layout spelled with train_gpt's flags.
declare -A k
for part in ${chosen//,/ }; do
  case $part in *=*) k[${part%%=*}]=${part#*=} ;; *) k[$part]=1 ;; esac
done
flags=(--layout "${k[dp]}x${k[pp]}x${k[cp]}x${k[tp]}" --micro-batches "${k[m]}" --recompute "$recompute")
keep=off
[ -n "${k[keep]:-}" ] && keep=on
[ -n "${k[fsdp]:-}" ] && flags+=(--dp-mode fsdp --fsdp-keep-gathered "$keep")
[ -n "${k[shardacc]:-}" ] && flags+=(--fsdp-accumulate sharded)
[ "${k[tp]}" -gt 1 ] && [ -z "${k[nosp]:-}" ] && flags+=(--sp)
for s in 1f1b gpipe zb-h1 zbv; do [ -n "${k[$s]:-}" ] && flags+=(--schedule "$s"); done
[ -n "${k[interleaved]:-}" ] && flags+=(--schedule interleaved --chunks "${k[vp]}")
run explicit.log "${flags[@]}" --log-jsonl explicit.jsonl || { cat explicit.log; fail "the explicit run ${flags[*]}"; }
losses() { grep '"event": "step"' "$1" | grep -o '"loss": [0-9.e+-]*'; }
[ "$(losses auto.jsonl)" = "$(losses explicit.jsonl)" ] || fail "auto's losses differ from ${flags[*]}'s"
[ "$(losses auto.jsonl | wc -l)" = 3 ] || fail "auto ran $(losses auto.jsonl | wc -l) steps, not 3"
# Errors: no calibration file given; a calibration without this card.
if run nocal.log --layout auto; then fail "--layout auto without --plan-calibration ran"; fi
grep -q -- "--layout auto needs --plan-calibration" nocal.log ||
  { cat nocal.log; fail "no error naming --plan-calibration"; }
sed 's/"card": "CPU"/"card": "Some GPU"/' cal.json >other.json
if run other.log --layout auto --plan-calibration other.json; then fail "a calibration of another card was used"; fi
grep -q "no entry for card 'CPU' (it has: Some GPU)" other.log || { cat other.log; fail "no error naming the card"; }
if MODEL=moe-tiny run moe.log --layout auto --plan-calibration cal.json; then fail "an MoE model was planned"; fi
grep -q "the model has 8 experts (top 2): the cost model does not cost mixture-of-experts" moe.log ||
  { cat moe.log; fail "no error naming the experts"; }
echo "layout_auto_test: passed (${flags[*]})"
