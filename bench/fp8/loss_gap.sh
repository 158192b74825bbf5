#!/usr/bin/env bash
# The loss curves of train_gpt with and without FP8 on the Brown corpus, the same seed and data
# (issue 37's measured safety): one run per recipe, then loss_gap.py writes OUT_DIR/NAME.{json,md} with the
# largest gap and tools/plot_run.py overlays the curves in OUT_DIR/NAME.png; with RESULTS set, the run RUN
# (default loss-NAME) of RESULTS/fp8.{json,md} files them (bench/results.py add).
#   bench/fp8/loss_gap.sh BUILD_DIR OUT_DIR NAME [train_gpt flags...]
# Env: NPROC (2), STEPS (500), RECIPES ("off tensorwise rowwise"), FP8_FLAGS (train_gpt flags for the FP8 runs
# only, e.g. "--fp8-skip-blocks 0,-1"), LAUNCH (mpirun; or torchrun), RESULTS, RUN,
# NOTE (a line for the table's notes: the machine, what the run stands for), PYTHON (/usr/bin/python3:
# the tables; the PNG is skipped with a message where it has no matplotlib).
# On the CPU --fp8 is the exact emulation (src/fp8); on GPUs the FP8 GEMMs (pass --precision bf16,
# LAUNCH=torchrun; tests/fp8/gpu_loss_gap.sh does).
set -euo pipefail
BUILD=$1 OUT=$2 NAME=$3
shift 3
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${DATA:-$HERE/../../data/brown/brown_sp4096_text_document}
NPROC=${NPROC:-2} STEPS=${STEPS:-500}
mkdir -p "$OUT"
logs=()
for r in ${RECIPES:-off tensorwise rowwise}; do
  log="$OUT/$NAME-$r.jsonl"
  only=()  # FP8_FLAGS: for the FP8 runs only (e.g. --fp8-skip-blocks 0,-1, which needs --fp8)
  [[ $r != off ]] && read -r -a only <<<"${FP8_FLAGS:-}"
  if [[ ${LAUNCH:-mpirun} == torchrun ]]; then
    launch=(torchrun --standalone --nproc_per_node="$NPROC" --no_python)
  else
    launch=(mpirun --allow-run-as-root --oversubscribe -np "$NPROC")
  fi
  "${launch[@]}" "$BUILD/bin/train_gpt" --data "$DATA" --vocab-size 4096 --split 98,2 --eod-token 2 \
    --steps "$STEPS" --fp8 "$r" --log-jsonl "$log" "$@" ${only[@]+"${only[@]}"} >"$OUT/$NAME-$r.log" 2>&1 ||
    { echo "loss_gap.sh: the $r run failed: $OUT/$NAME-$r.log" >&2; exit 1; }
  logs+=("$r=$log")
done
notes=()
[[ -n ${NOTE:-} ]] && notes=(--note "$NOTE")
PY=${PYTHON:-/usr/bin/python3}
"$PY" "$HERE/loss_gap.py" "$OUT/$NAME" "${logs[@]}" --command "bench/fp8/loss_gap.sh $* (NPROC $NPROC, STEPS $STEPS)" \
  "${notes[@]}"
"$PY" "$HERE/../../tools/plot_run.py" "${logs[@]}" -o "$OUT/$NAME.png" --title "$NAME: loss with and without FP8" ||
  echo "loss_gap.sh: no PNG (tools/plot_run.py failed: matplotlib?)" >&2
if [[ -n ${RESULTS:-} ]]; then
  source "$HERE/../run_lib.sh"  # machine, environment
  plot=()
  [[ -f $OUT/$NAME.png ]] && plot=(--plot "$OUT/$NAME.png")
  "$PY" "$HERE/../results.py" add "$OUT/$NAME.json" --suite fp8 --kind loss --run "${RUN:-loss-$NAME}" --results "$RESULTS" \
    --title "The loss with and without FP8: $NAME" --machine "$(machine "$NPROC")" --environment "$(environment)" \
    --command "NPROC=$NPROC STEPS=$STEPS${FP8_FLAGS:+ FP8_FLAGS=\"$FP8_FLAGS\"} bench/fp8/loss_gap.sh BUILD OUT $NAME $*" ${plot[@]+"${plot[@]}"} \
    --method "the same seed and data with --fp8 off and on; the largest gap of the training loss over every step (raw and of the 20-step moving average), the final losses, the validation losses" \
    --columns steps,largest_gap,largest_gap_step,largest_smoothed_gap,final_loss_off,final_loss,final_valid_gap,fp8_saturated_total
fi
