#!/usr/bin/env bash
# The Llama benchmark on one GPU: train_gpt (--model llama3-1b, bf16) beside the independent PyTorch
# Llama (bench/llama/torch_llama_train.py: eager and torch.compile) on the same Brown-corpus batches
# from the same initial weights, in one run. Writes the run MODEL of bench/results/llama_curves.{json,md}
# and its loss curves bench/results/llama_curves.MODEL.png (bench/results.py llama).
#   bench/llama/run.sh BUILD_DIR LOG_DIR [sections...]
# Sections (default: curves):
#   curves     tessera and PyTorch eager for STEPS (300) steps (the loss curves and their largest gap),
#              PyTorch compiled for COMPILE_STEPS (40): tokens/s, MFU, peak memory; batch B (4) x 2048
#   recompute  train_gpt with --recompute none|selective|full at batches RECOMPUTE_BATCHES (4 8 16),
#              RECOMPUTE_STEPS (8) steps each: step time and peak memory, or out of memory
# Env: PYTHONPATH must reach the built tessera module (tessera.data: the PyTorch side's batches);
# DATA (default data/brown/brown_sp4096_text_document); RUN_TIMEOUT (s per run, 300); MODEL
# (llama3-1b; llama-tiny on a CPU: a smoke run in fp32); RESULTS (default bench/results); SUITE and RUN
# (llama_curves and MODEL); PYTHON (default python3: its torch runs the PyTorch side).
set -uo pipefail
BUILD=${1:?build dir}
LOGS=${2:?log dir}
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
SECTIONS=("$@")
[ ${#SECTIONS[@]} -eq 0 ] && SECTIONS=(curves)
DATA=${DATA:-$HERE/../../data/brown/brown_sp4096_text_document}
STEPS=${STEPS:-300} COMPILE_STEPS=${COMPILE_STEPS:-40} B=${B:-4} MODEL=${MODEL:-llama3-1b}
PRECISION=()
if nvidia-smi -L >/dev/null 2>&1; then PRECISION=(--precision bf16); fi
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
PY=${PYTHON:-python3}  # an interpreter with torch (Debian's /usr/bin/python3 on our CPU machines)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$LOGS"
[ -f "$DATA.idx" ] || { echo "run.sh: $DATA.idx missing (carry data/brown to this machine)" >&2; exit 1; }
COMMON=(--lr 3e-4 --min-lr 3e-5 --warmup "${WARMUP:-30}")
rc=0
logs=()
BENCH="llama bench"
source "$HERE/../run_lib.sh"  # run NAME CMD..., machine
train() {  # train NAME STEPS train_gpt-flags...
  local name=$1 steps=$2
  shift 2
  run "$name" torchrun -r 1 -t 1 --standalone --nproc_per_node=1 --no_python "$BUILD/bin/train_gpt" --model "$MODEL" \
    "${PRECISION[@]}" --data "$DATA" --split 98,2 --eod-token 2 --lr-schedule cosine --steps "$steps" \
    --log-jsonl "$LOGS/$name.jsonl" "$@"
  [ -f "$LOGS/$name.jsonl" ] && "$PY" "$HERE/../results.py" from-jsonl "$LOGS/$name.jsonl" "$name" 5 >>"$LOGS/$name.log"
}
for s in "${SECTIONS[@]}"; do
  case $s in
    curves)
      train tessera "$STEPS" --batch "$B" "${COMMON[@]}"
      run pytorch-eager "$PY" "$HERE/torch_llama_train.py" --mode eager --model "$MODEL" --data "$DATA" \
        --steps "$STEPS" --batch "$B" "${COMMON[@]}" --log "$LOGS/pytorch-eager.jsonl"
      if ((COMPILE_STEPS > 0)); then
        run pytorch-compile "$PY" "$HERE/torch_llama_train.py" --mode compile --model "$MODEL" --data "$DATA" \
          --steps "$COMPILE_STEPS" --batch "$B" "${COMMON[@]}" --log "$LOGS/pytorch-compile.jsonl"
      fi ;;
    recompute)
      for r in none selective full; do
        for b in ${RECOMPUTE_BATCHES:-4 8 16}; do
          train "tessera-recompute-$r-b$b" "${RECOMPUTE_STEPS:-8}" --batch "$b" --recompute "$r" "${COMMON[@]}" --warmup 2
        done
      done ;;
    *) echo "run.sh: unknown section $s" >&2; exit 2 ;;
  esac
done
"$PY" "$HERE/../results.py" llama "$LOGS" --suite "${SUITE:-llama_curves}" --run "${RUN:-$MODEL}" \
  --machine "$(PYTHON=$PY machine 1)" --environment "$(PYTHON=$PY environment)" --model "$MODEL" \
  --precision "$([ ${#PRECISION[@]} -gt 0 ] && echo bf16 || echo fp32)" \
  --command "B=$B STEPS=$STEPS COMPILE_STEPS=$COMPILE_STEPS bench/llama/run.sh $BUILD $LOGS ${SECTIONS[*]}" \
  --title "$MODEL on one GPU, the Brown corpus: train_gpt beside the PyTorch Llama (same batches, same initial weights)" \
  --method "the median step after 5 warm-ups of each run's JSONL log (results.py from-jsonl; PyTorch: the same from its own log)" \
  --results "${RESULTS:-$HERE/../results}" || rc=1
exit $rc
