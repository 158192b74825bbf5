#!/usr/bin/env bash
# What separates train_gpt from the compiled PyTorch anchor on llama3-8b, FSDP over NPROC GPUs, from profiles:
# parallel.sh's fsdp rows with the same flags, traced: tessera-traced (train_gpt --breakdown --profile, steps 3
# and 4), pytorch-compiled-fsdp (3 warm-ups and STEPS timed, then 2 steps traced), tessera-train-fsdp (untraced;
# last, the one to lose under BUDGET_S). Then bench/profile/compare.py writes OUTDIR/RESULT_NAME.{json,md}
# (kernel ms per step by kind, the GPU span, the compute stream's idle time, NCCL beside compute, both sides'
# memory phases, the untraced tok/s) and gaps.py each rank-0 trace's gaps (OUTDIR/gaps-{tessera,torch}.txt):
# trace readings, kept with the logs and traces (OUTDIR/traces/*.json.gz), not in bench/results.
#   bench/llama/profile_8b.sh BUILD OUTDIR
# Env: NPROC (4), MODEL (llama3-8b; llama-tiny on a CPU: the plumbing, nothing traced), T (4096), B (1 per GPU),
# RECOMPUTE (selective), FP8 (off; tensorwise or rowwise on both sides), STEPS (8 after 3 warm-ups), RUN_TIMEOUT
# (s per run, 240), BUDGET_S (0 = none), PYTHON (python3), RESULT_NAME (profile_<model>_fsdp[_fp8]).
# Exit status 0 when every run produced its part.
set -uo pipefail
BUILD=${1:?build dir}
LOGS=${2:?output dir}
HERE=$(cd "$(dirname "$0")" && pwd)
N=${NPROC:-4}
[[ $N =~ ^[1-9][0-9]*$ ]] && ((N >= 2)) || { echo "profile_8b.sh: NPROC=$N: FSDP needs 2 GPUs or more" >&2; exit 2; }
export MODEL=${MODEL:-llama3-8b} STEPS=${STEPS:-8} T=${T:-4096}
B=${B:-1} RECOMPUTE=${RECOMPUTE:-selective} FP8=${FP8:-off}
case $FP8 in
  off) TORCH_FP8=0 FP8_FLAGS=() ;;
  tensorwise | rowwise) TORCH_FP8=1 FP8_FLAGS=(--fp8 "$FP8") ;;
  *) echo "profile_8b.sh: FP8=$FP8: off, tensorwise or rowwise" >&2; exit 2 ;;
esac
RUN_TIMEOUT=${RUN_TIMEOUT:-240} BUDGET_S=${BUDGET_S:-0}
PY=${PYTHON:-python3}
NAME=${RESULT_NAME:-profile_${MODEL//-/_}_fsdp$([ "$FP8" = off ] || echo _fp8)}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -x "$BUILD/bin/train_gpt" ] || { echo "profile_8b.sh: $BUILD/bin/train_gpt was not built" >&2; exit 1; }
PRECISION=()
nvidia-smi -L >/dev/null 2>&1 && PRECISION=(--precision bf16)
TRACES=$LOGS/traces
mkdir -p "$TRACES"
rm -f "$TRACES"/*.json "$TRACES"/*.json.gz
rc=0
BENCH="$MODEL profile"
source "$HERE/../run_lib.sh"  # run NAME CMD..., torchrun_cmd, machine
torchrun_cmd                   # TORCHRUN=(torchrun --standalone [-r 1 -t 1 under torch 1.x])

BUDGET_RESERVE_S=20  # kept for the comparison
brun() { budget_run "$@"; }  # run_lib.sh
# parallel.sh's fsdp rows: train NAME flags... (its `train`, with NPROC ranks) and the compiled anchor
TRAIN=("$BUILD/bin/train_gpt" --model "$MODEL" "${PRECISION[@]}" --recompute "$RECOMPUTE" --seq-len "$T"
  --layout "${N}x1x1" --dp-mode fsdp --batch $((N * B)) "${FP8_FLAGS[@]}")
train() {  # train NAME STEPS_IN_ALL flags...: then its RESULT line from the JSONL log (3 warm-ups)
  local name=$1 steps=$2
  shift 2
  rm -f "$LOGS/$name.jsonl"
  brun "$name" "${TORCHRUN[@]}" --nproc_per_node="$N" --no_python "${TRAIN[@]}" --steps "$steps" \
    --log-jsonl "$LOGS/$name.jsonl" "$@" &&
    "$PY" "$HERE/../results.py" from-jsonl "$LOGS/$name.jsonl" "$name" 3 >>"$LOGS/$name.log" &&
    grep RESULT "$LOGS/$name.log" | cut -c1-300 | sed 's/^/  /'
}

train tessera-traced 5 --breakdown --profile "$TRACES/tessera.json:3:2"
COMPILE=1 RECOMPUTE=$RECOMPUTE FP8=$TORCH_FP8 B=$B PROFILE=$TRACES/torch.json brun pytorch-compiled-fsdp "${TORCHRUN[@]}" \
  --nproc_per_node="$N" "$HERE/torch_llama_parallel.py" fsdp
train tessera-train-fsdp $((STEPS + 3))

runs=(--run "tessera-traced=torchrun --standalone --nproc_per_node=$N --no_python ${TRAIN[*]} --steps 5 --log-jsonl LOGS/tessera-traced.jsonl --breakdown --profile TRACES/tessera.json:3:2"
  --run "pytorch-compiled-fsdp=COMPILE=1 RECOMPUTE=$RECOMPUTE FP8=$TORCH_FP8 B=$B MODEL=$MODEL T=$T STEPS=$STEPS PROFILE=TRACES/torch.json torchrun --standalone --nproc_per_node=$N bench/llama/torch_llama_parallel.py fsdp"
  --run "tessera-train-fsdp=torchrun --standalone --nproc_per_node=$N --no_python ${TRAIN[*]} --steps $((STEPS + 3)) --log-jsonl LOGS/tessera-train-fsdp.jsonl")
"$PY" "$HERE/../profile/compare.py" --tessera-trace "$TRACES/tessera.json" --tessera-breakdown "$LOGS/tessera-traced.jsonl" \
  --tessera-log "$LOGS/tessera-train-fsdp.log" --torch-trace "$TRACES/torch.json" --torch-log "$LOGS/pytorch-compiled-fsdp.log" \
  --steps 2 --warm 3 --name "$NAME" --out "$LOGS" --machine "$(PYTHON=$PY machine "$N")" \
  --command "NPROC=$N MODEL=$MODEL T=$T B=$B RECOMPUTE=$RECOMPUTE FP8=$FP8 STEPS=$STEPS bench/llama/profile_8b.sh $BUILD LOGS" \
  --title "$MODEL, FSDP over $N GPUs, seq $T, $B sequence(s) per GPU, recompute $RECOMPUTE, FP8 $FP8: train_gpt beside compiled PyTorch, kernel by kernel" \
  --config "train_gpt ${PRECISION[*]:-fp32} ${FP8_FLAGS[*]} synthetic tokens (parallel.sh's tessera-train-fsdp); PyTorch: the Llama of tests/models/torch_llama.py, each block under torch.compile, FSDP2 (bf16 parameters, fp32 reduction), fused AdamW, clipping at 1.0, $([ "$FP8" = off ] || echo "the blocks' linears in FP8 over torch._scaled_mm (tensorwise), ")random tokens (parallel.sh's pytorch-compiled-fsdp)" \
  "${runs[@]}" \
  --note "Traced steps run slower than untraced ones (the profiler's CPU-op records slow the host; tessera's traced run also syncs the device for --breakdown), so the GPU span per step is longer than the untraced step_ms; compare kernel times, which the profiler barely moves" \
  --note "NCCL kernel time includes each kernel's wait for its peers: 'beside compute' is the part hidden behind compute kernels, 'exposed' the part with no compute kernel on any stream" ||
  rc=1
for s in tessera torch; do  # each rank-0 trace's largest gaps and the ops that launched the kernel after them
  ((BUDGET_S == 0 || BUDGET_S - SECONDS > 60)) && [ -f "$TRACES/$s.json" ] &&
    timeout 60 "$PY" "$HERE/../profile/gaps.py" "$TRACES/$s.json" --top 15 >"$LOGS/gaps-$s.txt" 2>&1
done
gzip -1 -f "$TRACES"/*.json 2>/dev/null
exit $rc
