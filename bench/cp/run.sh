#!/usr/bin/env bash
# Context parallelism on 4 GPUs (issue 38): train_gpt --cp beside PyTorch's context_parallel + FSDP2
# (bench/cp/torch_cp.py, the independent PyTorch Llama), the same model, sequence length, batch (one
# sequence per data-parallel replica) and recompute, then bench/results/cp.{json,md} (bench/cp/results.py).
#   bench/cp/run.sh BUILD OUTDIR
# Runs, for each model in CP_MODELS, sequence length in CP_SEQS and layout in CP_LAYOUTS (each under
# `timeout RUN_TIMEOUT`, so an OOM or a hang costs one run; a failed run leaves its row out):
#   tessera-<model>-<T>-<layout>   train_gpt --layout DPx1xCPxTP --dp-mode fsdp --batch DP (bf16)
#   pytorch-<model>-<T>-<layout>   torch_cp.py (layouts without tp: PyTorch's CP with DTensor TP is not run)
# Layouts: cp4 (1x1x4x1), fsdp2xcp2 (2x1x2x1), cp2xtp2 (1x1x2x2). FSDP shards over dp x cp on both sides.
# Env: CP_MODELS (llama3-1b llama3-8b), CP_SEQS (8192 32768 65536 131072), CP_LAYOUTS (cp4 fsdp2xcp2 cp2xtp2),
# CP_SYSTEMS (tessera pytorch), STEPS (5 timed after 3 warm-ups), RUN_TIMEOUT (s per run, 240),
# BUDGET_S (s for this call, 540: a run that cannot start with 60 s left is skipped, so the results are
# written), RECOMPUTE (auto: full for llama3-8b and from 65536 tokens, else selective; or none|selective|full),
# PYTHON (python3: its torch runs PyTorch's side), RESULTS (bench/results). Logs accumulate in OUTDIR: call it
# several times with other sections (each device call is <= 10 min) and the table is rewritten from all of
# OUTDIR's logs each time. Exit status 0 when every run of this call produced its row.
set -uo pipefail
BUILD=${1:?build dir}
LOGS=${2:?output dir}
HERE=$(cd "$(dirname "$0")" && pwd)
read -r -a MODELS <<<"${CP_MODELS:-llama3-1b llama3-8b}"
read -r -a SEQS <<<"${CP_SEQS:-8192 32768 65536 131072}"
read -r -a LAYOUTS <<<"${CP_LAYOUTS:-cp4 fsdp2xcp2 cp2xtp2}"
read -r -a SYSTEMS <<<"${CP_SYSTEMS:-tessera pytorch}"
STEPS=${STEPS:-5} RUN_TIMEOUT=${RUN_TIMEOUT:-240} BUDGET_S=${BUDGET_S:-540} RECOMPUTE=${RECOMPUTE:-auto}
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -x "$BUILD/examples/train_gpt" ] || { echo "cp/run.sh: $BUILD/examples/train_gpt was not built" >&2; exit 1; }
mkdir -p "$LOGS"
rc=0 logs=()
BENCH="cp bench"
source "$HERE/../run_lib.sh"  # run NAME CMD..., torchrun_cmd, machine
torchrun_cmd
machine CPU >"$LOGS/machine.txt"
echo "CP_MODELS='${MODELS[*]}' CP_SEQS='${SEQS[*]}' CP_LAYOUTS='${LAYOUTS[*]}' STEPS=$STEPS RECOMPUTE=$RECOMPUTE bench/cp/run.sh $BUILD $LOGS" \
  >>"$LOGS/commands.txt"

factors() {  # factors LAYOUT -> "DP CP TP"
  case $1 in
    cp4) echo "1 4 1" ;;
    fsdp2xcp2) echo "2 2 1" ;;
    cp2xtp2) echo "1 2 2" ;;
    *) echo "cp/run.sh: unknown layout $1 (cp4 fsdp2xcp2 cp2xtp2)" >&2; return 1 ;;
  esac
}
recompute_of() {  # recompute_of MODEL T
  if [ "$RECOMPUTE" != auto ]; then echo "$RECOMPUTE"; elif [ "$1" = llama3-8b ] || (($2 >= 65536)); then echo full; else
    echo selective; fi
}
brun() {  # brun NAME CMD...: `run` within BUDGET_S
  local t=$RUN_TIMEOUT
  t=$((BUDGET_S - SECONDS < RUN_TIMEOUT ? BUDGET_S - SECONDS : RUN_TIMEOUT))
  if ((t < 60)); then
    echo "=== $BENCH: $1 SKIPPED: the ${BUDGET_S}s budget of this call is spent"
    rc=1
    return 1
  fi
  RUN_TIMEOUT=$t run "$@"
}

for model in "${MODELS[@]}"; do
  for T in "${SEQS[@]}"; do
    R=$(recompute_of "$model" "$T")
    for layout in "${LAYOUTS[@]}"; do
      read -r DP CP TP <<<"$(factors "$layout")" || exit 2
      N=$((DP * CP * TP))
      for sys in "${SYSTEMS[@]}"; do
        name="$sys-$model-$T-$layout"
        if [ "$sys" = tessera ]; then
          rm -f "$LOGS/$name.jsonl"
          before=$rc
          rc=0
          brun "$name" "${TORCHRUN[@]}" --nproc_per_node="$N" --no_python "$BUILD/examples/train_gpt" --model "$model" \
            --precision bf16 --seq-length "$T" --layout "${DP}x1x${CP}x${TP}" --dp-mode fsdp --batch "$DP" \
            --recompute "$R" --steps $((STEPS + 3)) --log-jsonl "$LOGS/$name.jsonl" &&
            "$PY" "$HERE/../results.py" from-jsonl "$LOGS/$name.jsonl" "$name" 3 >>"$LOGS/$name.log" &&
            grep RESULT "$LOGS/$name.log" | cut -c1-300 | sed 's/^/  /'
          rc=$((before | rc))
        elif [ "$sys" = pytorch ]; then
          ((TP == 1)) || continue
          MODEL=$model T=$T CP=$CP RECOMPUTE=$R STEPS=$STEPS brun "$name" "${TORCHRUN[@]}" --nproc_per_node="$N" \
            "$HERE/torch_cp.py"
        else
          echo "cp/run.sh: unknown system $sys (tessera pytorch)" >&2
          exit 2
        fi
      done
    done
  done
done

"$PY" "$HERE/results.py" "$LOGS" --results "${RESULTS:-$HERE/../results}" || rc=1
exit $rc
