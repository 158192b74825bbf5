#!/usr/bin/env bash
# Issue 53's tensor-parallel benchmark: a slice of Llama-3-70B's widths (d 8192, 64 heads, 8 kv heads, ffn 28672,
# seq 4096, LAYERS blocks, an untied 32000-token vocabulary, bf16) trained by train_gpt on one GPU, TP 2 + SP and
# TP 4 + SP (bf16, and --fp8 tensorwise with FP8=1), beside the PyTorch Llama (bench/llama/torch_llama_parallel.py,
# preset llama70b-slice) on one GPU and under DTensor TP + SP, each block under torch.compile after the sharding,
# without and with async TP (inductor's micro-pipeline TP over symmetric memory: torchtitan's recipe); and the
# probe bench/tp/copy_overlap.py (copy engine against NCCL beside a GEMM of this width). Then the run RUN of
# bench/results/tp (each system scaled against its own one-GPU row; vs_compiled and vs_pytorch_asynctp: tessera's
# tokens/s over PyTorch's of the same layout) and, from the probe, the run RUN-copy-overlap.
#   bench/tp/slice70b.sh BUILD LOGS [tessera] [probe] [pytorch] [file]   (default: all four)
# pytorch is pytorch-single (its one-GPU row) and pytorch-tp (the TP rows, async TP first), which may run apart.
# The sections may run in separate calls on the same LOGS (their logs accumulate there; each records the machine
# in LOGS/machine.txt): `file` alone files what LOGS holds, here or on another machine.
# Sequences per step: B (2), shared by the TP group (every layout trains the same B x 4096 tokens a step).
# Env: NPROC (the GPUs here, at most 4: TP 4 needs 4), B (2), LAYERS (4), STEPS (6 after 3 warm-ups), FP8 (1: the
# --fp8 tensorwise rows single and TP 4 + SP), RUN_TIMEOUT (s per run, 300), BUDGET_S (0 = none), PYTHON,
# RESULTS (bench/results), RUN (slice70b), COMMAND (the command the filed run names; default this call's).
# Exit status 0 when every run of this call produced its row.
set -uo pipefail
BUILD=${1:?build dir}
LOGS=${2:?log dir}
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
SECTIONS=("$@")
[ ${#SECTIONS[@]} -eq 0 ] && SECTIONS=(tessera probe pytorch file)
for s in "${SECTIONS[@]}"; do
  case $s in
    tessera | probe | pytorch-single | pytorch-tp | file) ;;
    pytorch) SECTIONS+=(pytorch-single pytorch-tp) ;;
    *) echo "slice70b.sh: unknown section $s (tessera probe pytorch pytorch-single pytorch-tp file)" >&2; exit 2 ;;
  esac
done
has() { [[ " ${SECTIONS[*]} " == *" $1 "* ]]; }
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
N=${NPROC:-$((GPUS > 4 ? 4 : GPUS))}
B=${B:-2} LAYERS=${LAYERS:-4} STEPS=${STEPS:-6} FP8=${FP8:-1} RUN_TIMEOUT=${RUN_TIMEOUT:-300} BUDGET_S=${BUDGET_S:-0}
PY=${PYTHON:-python3} RUN=${RUN:-slice70b}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$LOGS"
rc=0 logs=()
BENCH="tp slice70b bench"
source "$HERE/../run_lib.sh"  # run, budget_run, torchrun_cmd, machine, environment
torchrun_cmd
if has tessera || has pytorch-single || has pytorch-tp || has probe; then
  ((GPUS >= 1)) || { echo "slice70b.sh: no GPU here (every section but file needs them)" >&2; exit 1; }
  machine "$N" >"$LOGS/machine.txt"
  PYTHON=$PY environment >"$LOGS/environment.txt"
fi
TPS=(2)
((N >= 4)) && TPS=(2 4)

# train_gpt's llama3-8b preset (untied, rope theta 500000) widened to the 70B's layers
SHAPE=(--model llama3-8b --hidden-size 8192 --layers "$LAYERS" --heads 64 --kv-heads 8 --ffn 28672 --vocab 32000
       --seq-len 4096 --untie-embeddings --precision bf16 --recompute none)
train() {  # train NAME NPROC train_gpt-flags...: then its RESULT line from the JSONL log (3 warm-ups)
  local name=$1 n=$2
  shift 2
  rm -f "$LOGS/$name.jsonl"
  budget_run "$name" "${TORCHRUN[@]}" --nproc_per_node="$n" --no_python "$BUILD/bin/train_gpt" "${SHAPE[@]}" \
    --batch "$B" --steps $((STEPS + 3)) --log-jsonl "$LOGS/$name.jsonl" "$@" &&
    "$PY" "$HERE/../results.py" from-jsonl "$LOGS/$name.jsonl" "$name" 3 >>"$LOGS/$name.log" &&
    grep RESULT "$LOGS/$name.log" | cut -c1-300 | sed 's/^/  /'
}
torch_run() {  # torch_run NAME NPROC MODE [ENV=VALUE...]: the PyTorch Llama, each block compiled
  local name=$1 n=$2 mode=$3
  shift 3
  budget_run "$name" env MODEL=llama70b-slice LAYERS="$LAYERS" B="$B" STEPS="$STEPS" COMPILE=1 RECOMPUTE=none "$@" \
    "${TORCHRUN[@]}" --nproc_per_node="$n" "$HERE/../llama/torch_llama_parallel.py" "$mode"
}

if has tessera; then
  [ -x "$BUILD/bin/train_gpt" ] || { echo "slice70b.sh: $BUILD/bin/train_gpt was not built" >&2; exit 1; }
  train tessera-train-single 1 --layout 1x1x1
  for t in "${TPS[@]}"; do train "tessera-train-tp$t-sp" "$t" --layout "1x1x$t" --sp; done
  if [ "$FP8" = 1 ]; then
    train tessera-train-fp8-single 1 --layout 1x1x1 --fp8 tensorwise
    train "tessera-train-fp8-tp${TPS[-1]}-sp" "${TPS[-1]}" --layout "1x1x${TPS[-1]}" --sp --fp8 tensorwise
  fi
fi
if has probe; then
  ((GPUS >= 2)) && budget_run copy-overlap "$PY" "$HERE/copy_overlap.py" --json "$LOGS/copy-overlap.json"
fi
has pytorch-single && torch_run pytorch-compiled-single 1 single
if has pytorch-tp; then  # the widest TP first, async TP (the anchor) before plain compiled: a budget cuts the rest
  for ((i = ${#TPS[@]} - 1; i >= 0; i--)); do
    t=${TPS[i]}
    torch_run "pytorch-asynctp-tp$t-sp" "$t" tp_sp ASYNC_TP=1
    torch_run "pytorch-compiled-tp$t-sp" "$t" tp_sp
  done
fi

if has file; then
  mach=$(cat "$LOGS/machine.txt" 2>/dev/null || machine "$N")
  envir=$(cat "$LOGS/environment.txt" 2>/dev/null || PYTHON=$PY environment)
  ntp=$(sed -n 's/^\([0-9]*\) x .*/\1/p' <<<"$mach")
  tps=(2)
  ((${ntp:-0} >= 4)) && tps=(2 4)
  expect=(tessera-train-single pytorch-compiled-single)
  for t in "${tps[@]}"; do expect+=("tessera-train-tp$t-sp" "pytorch-compiled-tp$t-sp" "pytorch-asynctp-tp$t-sp"); done
  [ "$FP8" = 1 ] && expect+=(tessera-train-fp8-single "tessera-train-fp8-tp${tps[-1]}-sp")
  expect_args=() train_logs=()
  for e in "${expect[@]}"; do
    expect_args+=(--expect "$e")
    [ -f "$LOGS/$e.log" ] && train_logs+=("$LOGS/$e.log")
  done
  cmd=${COMMAND:-NPROC=$N B=$B LAYERS=$LAYERS STEPS=$STEPS FP8=$FP8 bench/tp/slice70b.sh $BUILD $LOGS ${SECTIONS[*]}}
  shape="d 8192, 64 heads, 8 kv heads, ffn 28672, seq 4096, $LAYERS blocks, untied vocab 32000"
  if [ ${#train_logs[@]} -gt 0 ]; then
    "$PY" "$HERE/../results.py" gpt "${train_logs[@]}" --suite tp --run "$RUN" --model llama70b-slice \
      --seq-len 4096 --precision bf16 --fp8 tensorwise --results "${RESULTS:-$HERE/../results}" \
      --machine "$mach" --environment "$envir" --command "$cmd" \
      --title "A 70B-wide slice ($shape) in TP + SP: train_gpt beside PyTorch DTensor TP + SP, compiled and async" \
      --config "$shape; bf16 autocast over fp32 weights, AdamW, clip 1.0, no recompute; B=$B sequences per step in every layout (the TP group shares them); train_gpt synthetic tokens, PyTorch random tokens" \
      --method "3 warm-ups then the median of $STEPS steps (upper median): train_gpt's JSONL log (results.py from-jsonl), PyTorch's own timing (the device synchronised around each step); peak memory = max allocated by the caching allocator on the fullest rank" \
      --reference tessera-train-=tessera-train-single --reference tessera-train-fp8-=tessera-train-fp8-single \
      --reference pytorch-compiled-=pytorch-compiled-single --reference pytorch-asynctp-=pytorch-compiled-single \
      --vs-pytorch tessera-train- --vs-pytorch tessera-train-fp8- --twin pytorch-asynctp- \
      --columns "scaled_against,scaling,overhead_ms,vs_compiled,vs_pytorch_asynctp,async_tp_patterns" \
      --note "train_gpt runs the slice as --model llama3-8b with --hidden-size 8192 --layers $LAYERS --heads 64 --kv-heads 8 --ffn 28672 --vocab 32000 --seq-len 4096 --untie-embeddings; PyTorch as torch_llama_parallel.py's preset llama70b-slice (LAYERS=$LAYERS)" \
      --note "PyTorch's TP + SP (torch_llama_parallel.py tp_sp): DTensor ColwiseParallel wq wk wv w1 w3, RowwiseParallel wo w2 to sequence shards, the norms SequenceParallel; the embedding, final norm, head and loss replicated on every rank; each block under torch.compile after the sharding (torchtitan's order); pytorch-asynctp-*: the same with torch._inductor.config._micro_pipeline_tp (async_tp_patterns: the all-gather -> matmul and matmul -> reduce-scatter patterns inductor's pass rewrote, over the graphs it compiled)" \
      --note "tessera-train-fp8-*: --fp8 tensorwise (the blocks' linears), scaled against train_gpt's own FP8 one-GPU row; vs_compiled there is over PyTorch's bf16 row of the layout" \
      "${expect_args[@]}" || rc=1
  else
    echo "slice70b.sh: no train row in $LOGS" >&2
    rc=1
  fi
  if [ -f "$LOGS/copy-overlap.json" ]; then
    "$PY" "$HERE/../results.py" add "$LOGS/copy-overlap.json" --suite tp --kind collective --run "$RUN-copy-overlap" \
      --results "${RESULTS:-$HERE/../results}" --machine "$mach" --environment "$envir" \
      --command "${COMMAND_PROBE:-python3 bench/tp/copy_overlap.py --json LOGS/copy-overlap.json}" \
      --title "Collective matmul's transfer: copy engine against NCCL beside a 70B-wide GEMM" \
      --config "each of tp GPUs runs [8192 x 8192] x [8192 x 28672/tp] in bf16 and receives the other ranks' shards of the [8192 x 8192] bf16 input (sequence parallelism's all-gather), one process driving the GPUs: by the copy engines (copy-engine: ATen's cross-device copy_, pushed by the source behind its two-way event barrier; raw-copy-engine: cudaMemcpyAsync pulled by the destination, no barrier; a side stream per GPU pair) or by NCCL's all-gather (torch.cuda.nccl, a side stream per GPU)" \
      --method "median of 20 iterations after 3 warm-ups; each iteration gated (a spin kernel holds every stream until the host has issued it all); CUDA events on GPU 0 from the gate: span_ms to the later of the GEMM's end and GPU 0's receipt, gemm_ms the GEMM, comm_ms the receipt; hidden = (gemm alone + transfer alone - both) / transfer alone over span_ms; gemm_slowdown = gemm_ms beside the transfer over gemm_ms alone" \
      --columns "payload_mib,span_ms,gemm_ms,comm_ms,hidden,gemm_slowdown,gemm_tflops,gb_per_s_per_gpu" || rc=1
  fi
fi
exit $rc
