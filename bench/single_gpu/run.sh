#!/usr/bin/env bash
# One GPU at the limit, side by side in one run (bf16 autocast, synthetic tokens, STEPS after 5 warm-ups):
#   gpt    GPT-735M, GPT_BATCH x 1024: PyTorch eager and torch.compile, train_gpt --fused-kernels off and on
#   llama  llama3-1b, LLAMA_BATCH x 2048 (PyTorch rows that run out of memory say so): the same four
#   adamw  the optimizer phase alone: tessera's per-tensor and multi-tensor AdamW (tessera_bench_adamw) beside
#          torch.optim.AdamW(fused=True), on each model's parameters
#   shapes Llamas that are not presets (SHAPES: shapes.py's specs over llama3-1b): PyTorch eager and compiled,
#          train_gpt --fused-kernels on; with PROFILE_DIR also 2 traced steps of compiled PyTorch and train_gpt per
#          shape and their kernels side by side there (trace readings: they stay in PROFILE_DIR)
# Then the run RUN (the sections, e.g. gpt-llama-adamw-shapes) of bench/results/single_gpu from every log in
# LOG_DIR (single_gpu.py combine: speed ratios, MFU, peak memory, the issue's targets).
#   bench/single_gpu/run.sh BUILD_DIR LOG_DIR [gpt] [llama] [adamw] [shapes]    (default: all four)
# Env: STEPS (20), GPT_BATCH (8), LLAMA_BATCH (8), SHAPES (space-separated; default below), PROFILE_DIR,
# RUN_TIMEOUT (s per run, 300), PYTHON (python3: its torch runs PyTorch's side), RESULTS (bench/results), RUN.
set -uo pipefail
BUILD=${1:?build dir}
LOGS=${2:?log dir}
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
SECTIONS=("$@")
[ ${#SECTIONS[@]} -eq 0 ] && SECTIONS=(gpt llama adamw shapes)
STEPS=${STEPS:-20} GPT_BATCH=${GPT_BATCH:-8} LLAMA_BATCH=${LLAMA_BATCH:-8} RUN_TIMEOUT=${RUN_TIMEOUT:-300}
# Four shapes no preset has, 8-16 K tokens a step each, estimated at 40-55 GiB in PyTorch eager (the hungriest;
# bf16 autocast over fp32 weights, AdamW, no recompute), so all three systems fit an 80 GB H100:
#   wide-shallow  d 4096, 4 layers, GQA 32/4, FFN 2.69 d, untied, an odd vocabulary (GPT-2's 50257), T 2048
#   deep-narrow   d 1024, 24 layers, MHA 16/16 (head dim 64), FFN 4 d, tied, vocabulary 32000, T 2048
#   seq-8k        T 8192 at batch 2, d 2048, 12 layers, GQA 16/2, FFN 2.75 d, untied, vocabulary 2^16, theta 1e6
#   seq-1k        T 1024, d 2560, 10 layers, GQA 32/8 (head dim 80), FFN 3.5 d, tied, vocabulary 151936 (Qwen2's)
SHAPES=${SHAPES:-"wide-shallow:d=4096,layers=4,heads=32,kv=4,ffn=11008,vocab=50257,T=2048,B=8,tied=0
deep-narrow:d=1024,layers=24,heads=16,kv=16,ffn=4096,vocab=32000,T=2048,B=8,tied=1
seq-8k:d=2048,layers=12,heads=16,kv=2,ffn=5632,vocab=65536,T=8192,B=2,tied=0,theta=1000000
seq-1k:d=2560,layers=10,heads=32,kv=8,ffn=8960,vocab=151936,T=1024,B=8,tied=1,theta=10000"}
PROFILE_DIR=${PROFILE_DIR:-}
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$LOGS"
rc=0
logs=()
BENCH="single-gpu bench"
source "$HERE/../run_lib.sh"  # run NAME CMD...
TRAIN_GPT=(torchrun -r 1 -t 1 --standalone --nproc_per_node=1 --no_python "$BUILD/bin/train_gpt" --precision bf16)
# tessera_run NAME SYSTEM FUSED TRAIN_GPT_ARGS...: train_gpt on one GPU, its JSONL turned into a RESULT line.
tessera_run() {
  local name=$1 system=$2 fused=$3
  shift 3
  rm -f "$LOGS/$name.jsonl"
  run "$name" "${TRAIN_GPT[@]}" "$@" --steps $((STEPS + 5)) --fused-kernels "$fused" --log-jsonl "$LOGS/$name.jsonl"
  [ -f "$LOGS/$name.jsonl" ] && "$PY" "$HERE/../results.py" from-jsonl "$LOGS/$name.jsonl" "$system" 5 >>"$LOGS/$name.log"
}
tessera() { tessera_run "$1.$3" "$3" "$4" --model "$1" --batch "$2"; }  # tessera MODEL BATCH SYSTEM FUSED
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
    shapes)
      [ -n "$PROFILE_DIR" ] && mkdir -p "$PROFILE_DIR"
      for spec in $SHAPES; do
        if ! flags=$("$PY" "$HERE/shapes.py" flags "$spec"); then rc=1; continue; fi
        read -r -a args <<<"$flags"
        n=shape-${spec%%:*}
        echo "$spec" >"$LOGS/$n.spec"  # the combiner's words for the shape
        trace=()
        if [ -n "$PROFILE_DIR" ]; then
          rm -f "$PROFILE_DIR/$n".{pytorch-compile.json,tessera-fused.json,kernels.md}
          trace=(--profile "$PROFILE_DIR/$n.pytorch-compile.json")
        fi
        run "$n.pytorch-eager" "$PY" "$HERE/single_gpu.py" torch --shape "$spec" --mode eager --steps "$STEPS"
        run "$n.pytorch-compile" "$PY" "$HERE/single_gpu.py" torch --shape "$spec" --mode compile --steps "$STEPS" \
          ${trace[@]+"${trace[@]}"}
        tessera_run "$n.tessera-fused" tessera-fused on "${args[@]}"
        if [ -n "$PROFILE_DIR" ]; then  # a run of its own: the traced steps stay out of the timed run's median
          run "$n.tessera-fused-trace" "${TRAIN_GPT[@]}" "${args[@]}" --steps 7 --fused-kernels on \
            --profile "$PROFILE_DIR/$n.tessera-fused.json:4:2"
          [ -f "$PROFILE_DIR/$n.pytorch-compile.json" ] && [ -f "$PROFILE_DIR/$n.tessera-fused.json" ] &&
            "$PY" "$HERE/../profile/summarize.py" --steps 2 --top 15 "pytorch-compile=$PROFILE_DIR/$n.pytorch-compile.json" \
              "tessera-fused=$PROFILE_DIR/$n.tessera-fused.json" >"$PROFILE_DIR/$n.kernels.md"
        fi
      done ;;
    *) echo "run.sh: unknown section $s" >&2; exit 2 ;;
  esac
done
settings=" (STEPS=$STEPS GPT_BATCH=$GPT_BATCH LLAMA_BATCH=$LLAMA_BATCH"
[[ " ${SECTIONS[*]} " == *" shapes "* ]] && settings+=" SHAPES='$(echo $SHAPES)'${PROFILE_DIR:+ PROFILE_DIR=$PROFILE_DIR}"
"$PY" "$HERE/single_gpu.py" combine "$LOGS" --results "${RESULTS:-$HERE/../results}" --profile-dir "$PROFILE_DIR" \
  --run "${RUN:-$(IFS=-; echo "${SECTIONS[*]}")}" --machine "$(PYTHON=$PY machine 1)" \
  --environment "$(PYTHON=$PY environment)" --command "bench/single_gpu/run.sh $BUILD $LOGS ${SECTIONS[*]}$settings)" || rc=1
exit $rc
