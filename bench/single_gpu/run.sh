#!/usr/bin/env bash
# One GPU at the limit (issue 26), side by side in one run on one GPU:
#   gpt    GPT-735M, batch GPT_BATCH (8) x 1024: PyTorch eager, PyTorch torch.compile, train_gpt with
#          --fused-kernels off and on
#   llama  llama3-1b, batch LLAMA_BATCH (8) x 2048 (train_gpt's recompute-free batch that fills an
#          80 GB H100; PyTorch rows that run out of memory are reported so): the same four
#   adamw  the optimizer phase alone on each model's parameters: tessera's per-tensor and
#          multi-tensor AdamW (tessera_bench_adamw) vs torch.optim.AdamW(fused=True)
# bf16 autocast, synthetic tokens, STEPS (20) timed steps after 5 warm-ups per run. Writes
# bench/results/single_gpu.{json,md} (single_gpu.py combine: speed ratios, MFU, peak memory, the
# issue's targets).
#   bench/single_gpu/run.sh BUILD_DIR LOG_DIR [gpt] [llama] [adamw]     (default: all three)
# Env: STEPS, GPT_BATCH, LLAMA_BATCH, RUN_TIMEOUT (s per run, 300), PYTHON (python3: its torch runs
# PyTorch's side), RESULTS (default bench/results).
set -uo pipefail
BUILD=${1:?build dir}
LOGS=${2:?log dir}
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
SECTIONS=("$@")
[ ${#SECTIONS[@]} -eq 0 ] && SECTIONS=(gpt llama adamw)
STEPS=${STEPS:-20} GPT_BATCH=${GPT_BATCH:-8} LLAMA_BATCH=${LLAMA_BATCH:-8} RUN_TIMEOUT=${RUN_TIMEOUT:-300}
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$LOGS"
rc=0
logs=()
BENCH="single-gpu bench"
source "$HERE/../run_lib.sh"  # run NAME CMD...
# tessera MODEL BATCH SYSTEM FUSED: train_gpt on one GPU, its JSONL turned into a RESULT line.
tessera() {
  local model=$1 batch=$2 system=$3 fused=$4 name="$1.$3"
  run "$name" torchrun -r 1 -t 1 --standalone --nproc_per_node=1 --no_python "$BUILD/examples/train_gpt" \
    --model "$model" --batch "$batch" --precision bf16 --steps $((STEPS + 5)) --fused-kernels "$fused" \
    --log-jsonl "$LOGS/$name.jsonl"
  [ -f "$LOGS/$name.jsonl" ] && "$PY" "$HERE/../results.py" from-jsonl "$LOGS/$name.jsonl" "$system" 5 >>"$LOGS/$name.log"
}
pytorch() {  # pytorch MODEL(train_gpt preset) OURNAME BATCH MODE
  run "$1.pytorch-$4" "$PY" "$HERE/single_gpu.py" torch --model "$2" --mode "$4" --batch "$3" --steps "$STEPS"
}
for s in "${SECTIONS[@]}"; do
  case $s in
    gpt | llama)
      if [ "$s" = gpt ]; then m=735m n=gpt735m b=$GPT_BATCH; else m=llama3-1b n=llama3-1b b=$LLAMA_BATCH; fi
      pytorch "$m" "$n" "$b" eager
      pytorch "$m" "$n" "$b" compile
      tessera "$m" "$b" tessera-unfused off
      tessera "$m" "$b" tessera-fused on ;;
    adamw)
      for m in 735m llama3-1b; do
        n=$m; [ "$m" = 735m ] && n=gpt735m
        run "$m.tessera-adamw" env STEPS="$STEPS" torchrun -r 1 -t 1 --standalone --nproc_per_node=1 --no_python \
          "$BUILD/bench/tessera_bench_adamw" --model "$m"
        run "$m.pytorch-adamw" "$PY" "$HERE/single_gpu.py" adamw --model "$n" --steps "$STEPS"
      done ;;
    *) echo "run.sh: unknown section $s" >&2; exit 2 ;;
  esac
done
gpus=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 | sed 's/,/ driver/')
"$PY" "$HERE/single_gpu.py" combine "$LOGS" --results "${RESULTS:-$HERE/../results}" \
  --machine "1 ${gpus:-CPU}; torch $("$PY" -c 'import torch;print(torch.__version__)')" \
  --command "bench/single_gpu/run.sh $BUILD $LOGS ${SECTIONS[*]} (STEPS=$STEPS GPT_BATCH=$GPT_BATCH LLAMA_BATCH=$LLAMA_BATCH)" || rc=1
exit $rc
