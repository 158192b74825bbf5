#!/usr/bin/env bash
# The loss curves of train_gpt with and without FP8 on the Brown corpus, the same seed and data
# (issue 37's measured safety): one run per recipe, then loss_gap.py writes the JSON / Markdown
# table with the largest gap and tools/plot_run.py overlays the curves in one PNG.
#   bench/fp8/loss_gap.sh BUILD_DIR OUT_DIR NAME [train_gpt flags...]
# Env: NPROC (2), STEPS (500), RECIPES ("off tensorwise rowwise"), LAUNCH (mpirun; or torchrun),
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
  if [[ ${LAUNCH:-mpirun} == torchrun ]]; then
    launch=(torchrun --standalone --nproc_per_node="$NPROC" --no_python)
  else
    launch=(mpirun --allow-run-as-root --oversubscribe -np "$NPROC")
  fi
  "${launch[@]}" "$BUILD/bin/train_gpt" --data "$DATA" --vocab-size 4096 --split 98,2 --eod-token 2 \
    --steps "$STEPS" --fp8 "$r" --log-jsonl "$log" "$@" >"$OUT/$NAME-$r.log" 2>&1 ||
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
