#!/usr/bin/env bash
# The Llama on N = NPROC GPUs: train_gpt in each layout beside the PyTorch Llama (torch_llama_parallel.py) under
# DDP, FSDP2, DTensor TP (± sequence parallel) and pipelining, eager and (torch >= 2, COMPILED=1) with each block
# under torch.compile, in one run; then the run RUN of bench/results/SUITE (each system scaled against its own
# 1-GPU row; vs_pytorch, vs_compiled over PyTorch's row of the same layout). The runs: the case below.
#   bench/llama/parallel.sh BUILD_DIR LOG_DIR [single] [dp] [fsdp] [tp] [pp] [3d] [fp8]  (default: single dp fsdp tp pp)
# Sequences per step: single B, dp and fsdp B per GPU, tp TP_B shared, pp PP_B in MB micro-batches, 3d as dp's
# (LAYOUTS_3D "DPxPPxTP[:fsdp][:sp][:mbM] ..."), fp8: FP8_LAYOUT (fsdp, single on one GPU) in bf16 and FP8 on both
# sides (--fp8 FP8_RECIPE; PyTorch: bench/fp8/torch_float8.py). Under torch 1.x only PyTorch's single and dp run.
# Env: NPROC (2), MODEL (llama3-1b; llama-tiny for a CPU smoke run, fp32), T (the preset's), LAYERS (the preset's;
# a slice), ACCUM (fp8 section: B sequences per GPU ACCUM times a step, gradients reduced once), B (4), TP_B (N x B),
# PP_B (16), MB (16), STEPS (10 after 3 warm-ups), RECOMPUTE (none|selective|full, both sides), COMPILED,
# EAGER (1; 0: no eager rows in single, dp, fsdp), DATA (train_gpt's Megatron prefix; default synthetic tokens),
# RUN_TIMEOUT (s per run, 150), BUDGET_S (0 = none: runs are cut or skipped so the results are written), PYTHON,
# RESULTS (bench/results), SUITE (scale; fp8 for the fp8 section alone), RUN (MODEL[-tT][-accumA]-SECTIONS: a later run of
# that name on the same machine replaces it). Exit status 0 when every run produced its row.
set -uo pipefail
BUILD=${1:?build dir}
LOGS=${2:?log dir}
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
SECTIONS=("$@")
[ ${#SECTIONS[@]} -eq 0 ] && SECTIONS=(single dp fsdp tp pp)
for s in "${SECTIONS[@]}"; do
  case $s in single | dp | fsdp | tp | pp | 3d | fp8) ;; *) echo "parallel.sh: unknown section $s (single dp fsdp tp pp 3d fp8)" >&2; exit 2 ;; esac
done
N=${NPROC:-2}
[[ $N =~ ^[1-9][0-9]*$ ]] || { echo "parallel.sh: NPROC=$N is not a GPU count" >&2; exit 2; }
if ((N < 2)) && [ "${SECTIONS[*]}" != single ] && [ "${SECTIONS[*]}" != fp8 ]; then
  echo "parallel.sh: NPROC=$N: the sections ${SECTIONS[*]} need 2 GPUs or more (only single and fp8 run on one)" >&2
  exit 2
fi
export MODEL=${MODEL:-llama3-1b} STEPS=${STEPS:-10}
B=${B:-4} TP_B=${TP_B:-$((N * ${B:-4}))} PP_B=${PP_B:-16} MB=${MB:-16}
RUN_TIMEOUT=${RUN_TIMEOUT:-150} BUDGET_S=${BUDGET_S:-0}
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
RECOMPUTE=${RECOMPUTE:-none}
case $RECOMPUTE in none | selective | full) ;; *) echo "parallel.sh: RECOMPUTE=$RECOMPUTE (none selective full)" >&2; exit 2 ;; esac
PRECISION=() TRAIN_ARGS=(--recompute "$RECOMPUTE")
nvidia-smi -L >/dev/null 2>&1 && PRECISION=(--precision bf16)
[ -n "${T:-}" ] && export T && TRAIN_ARGS+=(--seq-len "$T")
[ -n "${LAYERS:-}" ] && export LAYERS && TRAIN_ARGS+=(--num-layers "$LAYERS")
[ -n "${DATA:-}" ] && TRAIN_ARGS+=(--data "$DATA" --split 98,2 --eod-token 2)
[ -x "$BUILD/bin/train_gpt" ] || { echo "parallel.sh: $BUILD/bin/train_gpt was not built" >&2; exit 1; }
mkdir -p "$LOGS"
rc=0
logs=() expect=() notes=() VERSUS=() EXTRA_COLS=""
BENCH="llama parallel bench"
source "$HERE/../run_lib.sh"  # run NAME CMD..., torchrun_cmd, machine
torchrun_cmd                   # TORCHRUN=(torchrun --standalone [-r 1 -t 1 under torch 1.x])
TORCH_MAJOR=$("$PY" -c 'import torch;print(torch.__version__.split(".")[0])' 2>/dev/null)
COMPILED=${COMPILED:-$([ "$TORCH_MAJOR" = 1 ] && echo 0 || echo 1)}
EAGER=${EAGER:-1}

brun() {  # brun NAME CMD...: budget_run (run_lib.sh), the run expected in the table, a skip noted
  expect+=("$1")
  budget_run "$@" && return 0
  [ -n "$budget_skipped" ] && notes+=("$1: not run, the ${BUDGET_S} s budget was spent")
  return 1
}
torch_run() {  # torch_run NAME NPROC MODE [compiled] (B, MB, FP8 from the caller's environment)
  local name=$1 n=$2 mode=$3 compiled=0
  [ "${4:-}" = compiled ] && compiled=1
  if [ "$TORCH_MAJOR" = 1 ] && { [ $compiled = 1 ] || { [ "$mode" != single ] && [ "$mode" != ddp ]; }; }; then
    echo "=== $BENCH: $name left out: torch 1.x has no torch.compile, FSDP2, DTensor or pipelining"
    notes+=("$name: not run, torch $TORCH_MAJOR.x has no torch.compile, FSDP2, DTensor or pipelining")
    return 0
  fi
  COMPILE=$compiled RECOMPUTE=$RECOMPUTE FP8=${FP8:-0} brun "$name" "${TORCHRUN[@]}" --nproc_per_node="$n" \
    "$HERE/torch_llama_parallel.py" "$mode"
}
train() {  # train NAME NPROC train_gpt-flags...: then its RESULT line from the JSONL log (3 warm-ups)
  local name=$1 n=$2
  shift 2
  rm -f "$LOGS/$name.jsonl"
  brun "$name" "${TORCHRUN[@]}" --nproc_per_node="$n" --no_python "$BUILD/bin/train_gpt" --model "$MODEL" \
    "${PRECISION[@]}" "${TRAIN_ARGS[@]}" --steps $((STEPS + 3)) --log-jsonl "$LOGS/$name.jsonl" "$@" &&
    "$PY" "$HERE/../results.py" from-jsonl "$LOGS/$name.jsonl" "$name" 3 >>"$LOGS/$name.log" &&
    grep RESULT "$LOGS/$name.log" | cut -c1-300 | sed 's/^/  /'
}

for s in "${SECTIONS[@]}"; do
  case $s in
    single)
      [ "$EAGER" = 1 ] && B=$B torch_run pytorch-single 1 single
      [ "$COMPILED" = 1 ] && B=$B torch_run pytorch-compiled-single 1 single compiled
      train tessera-train-single 1 --layout 1x1x1 --batch "$B" ;;
    dp)
      [ "$EAGER" = 1 ] && B=$B torch_run pytorch-ddp "$N" ddp
      [ "$COMPILED" = 1 ] && B=$B torch_run pytorch-compiled-ddp "$N" ddp compiled
      train tessera-train-ddp "$N" --layout "${N}x1x1" --batch $((N * B)) ;;
    fsdp)
      [ "$EAGER" = 1 ] && B=$B torch_run pytorch-fsdp "$N" fsdp
      [ "$COMPILED" = 1 ] && B=$B torch_run pytorch-compiled-fsdp "$N" fsdp compiled
      train tessera-train-fsdp "$N" --layout "${N}x1x1" --dp-mode fsdp --batch $((N * B)) ;;
    tp)  # DTensor sequence parallel (pytorch-tp-sp) runs last, after every other section
      B=$TP_B torch_run pytorch-tp "$N" tp
      train tessera-train-tp "$N" --layout "1x1x${N}" --batch "$TP_B"
      train tessera-train-tp-sp "$N" --layout "1x1x${N}" --batch "$TP_B" --sp ;;
    pp)  # 1F1B, and zb-h1 (weight gradients deferred into the bubble); PyTorch unties the embedding and head
      B=$PP_B MB=$MB torch_run "pytorch-pp-mb$MB" "$N" pp
      [ "$COMPILED" = 1 ] && B=$PP_B MB=$MB torch_run "pytorch-compiled-pp-mb$MB" "$N" pp compiled
      train "tessera-train-pp-mb$MB" "$N" --layout "1x${N}x1" --batch "$PP_B" --micro-batches "$MB" --schedule 1f1b
      train "tessera-train-pp-zb-mb$MB" "$N" --layout "1x${N}x1" --batch "$PP_B" --micro-batches "$MB" --schedule zb-h1 ;;
    3d)
      for spec in ${LAYOUTS_3D:-2x1x2:fsdp:sp 1x2x2:sp:mb4}; do
        IFS=: read -r -a parts <<<"$spec"
        flags=(--layout "${parts[0]}" --batch $((N * B)))
        for f in "${parts[@]:1}"; do
          case $f in
            fsdp) flags+=(--dp-mode fsdp) ;;
            sp) flags+=(--sp) ;;
            mb[1-9]*) flags+=(--micro-batches "${f#mb}" --schedule 1f1b) ;;
            *) echo "parallel.sh: LAYOUTS_3D spec $spec: unknown part $f (fsdp sp mbM)" >&2; exit 2 ;;
          esac
        done
        train "tessera-train-3d-${spec//:/-}" "$N" "${flags[@]}"
      done
      [[ " ${VERSUS[*]} " == *" pytorch-compiled-fsdp "* ]] ||
        VERSUS+=(--versus pytorch-compiled-fsdp) EXTRA_COLS+=",vs_pytorch_compiled_fsdp" ;;
    fp8)
      L=${FP8_LAYOUT:-$( ((N > 1)) && echo fsdp || echo single)}
      A=${ACCUM:-1}  # micro-batches of B per GPU and step (the record's regime: B=1 ACCUM=16)
      case $L in
        single) lay=(--layout 1x1x1 --batch $((A * B))) tmode=single ;;
        fsdp) lay=(--layout "${N}x1x1" --dp-mode fsdp --batch $((N * A * B))) tmode=fsdp ;;
        dp) lay=(--layout "${N}x1x1" --batch $((N * A * B))) tmode=ddp ;;
        *) echo "parallel.sh: FP8_LAYOUT=$L (single fsdp dp)" >&2; exit 2 ;;
      esac
      n=$([ "$L" = single ] && echo 1 || echo "$N")
      ((A > 1)) && lay+=(--micro-batches "$A")
      [[ " ${SECTIONS[*]} " == *" $L "* ]] || train "tessera-train-$L" "$n" "${lay[@]}"
      train "tessera-train-$L-fp8" "$n" "${lay[@]}" --fp8 "${FP8_RECIPE:-tensorwise}"
      [[ " ${SECTIONS[*]} " == *" $L "* ]] || ACCUM=$A B=$B torch_run "pytorch-compiled-$L" "$n" "$tmode" compiled
      FP8=1 ACCUM=$A B=$B torch_run "pytorch-compiled-$L-fp8" "$n" "$tmode" compiled
      VERSUS+=(--versus "tessera-train-$L") EXTRA_COLS+=",vs_tessera_train_$L" ;;
  esac
done
# PyTorch's sequence parallel last: the one run whose plan (tp_sp) had not run on GPUs before this script.
[[ " ${SECTIONS[*]} " == *" tp "* ]] && B=$TP_B torch_run pytorch-tp-sp "$N" tp_sp

if [ ${#logs[@]} -eq 0 ]; then
  echo "parallel.sh: no run was made" >&2
  exit 1
fi
note_args=()
for n in "${notes[@]}"; do note_args+=(--note "$n"); done
expect_args=()
for e in "${expect[@]}"; do expect_args+=(--expect "$e"); done
ordered=()  # the sections in their canonical order: the run's default name
for s in single dp fsdp tp pp 3d fp8; do [[ " ${SECTIONS[*]} " == *" $s "* ]] && ordered+=("$s"); done
suite=scale
[ "${SECTIONS[*]}" = fp8 ] && suite=fp8
"$PY" "$HERE/../results.py" gpt "${logs[@]}" --suite "${SUITE:-$suite}" \
  --run "${RUN:-$MODEL${T:+-t$T}${ACCUM:+-accum$ACCUM}-$(IFS=-; echo "${ordered[*]}")}" --model "$MODEL" ${T:+--seq-len "$T"} \
  --precision "${PRECISION[1]:-fp32}" --fp8 "${FP8_RECIPE:-tensorwise}" \
  --results "${RESULTS:-$HERE/../results}" --machine "$(PYTHON=$PY machine "$N")" --environment "$(PYTHON=$PY environment)" \
  --command "NPROC=$N MODEL=$MODEL${T:+ T=$T}${LAYERS:+ LAYERS=$LAYERS}${ACCUM:+ ACCUM=$ACCUM} RECOMPUTE=$RECOMPUTE COMPILED=$COMPILED EAGER=$EAGER B=$B TP_B=$TP_B PP_B=$PP_B MB=$MB STEPS=$STEPS${LAYOUTS_3D:+ LAYOUTS_3D=\"$LAYOUTS_3D\"}${FP8_LAYOUT:+ FP8_LAYOUT=$FP8_LAYOUT}${FP8_RECIPE:+ FP8_RECIPE=$FP8_RECIPE} bench/llama/parallel.sh $BUILD $LOGS ${SECTIONS[*]}" \
  --title "$MODEL${LAYERS:+ (a slice of $LAYERS blocks)}${T:+, seq $T}${ACCUM:+, $ACCUM micro-batches a step}, ${ordered[*]} on $N GPU(s): train_gpt beside the PyTorch Llama" \
  --config "$MODEL${LAYERS:+ cut to $LAYERS blocks} ${PRECISION[*]:-fp32}; sequences per step: single B=$B, dp/fsdp B=$B per GPU, tp TP_B=$TP_B shared, pp PP_B=$PP_B in MB=$MB micro-batches; train_gpt ${DATA:-synthetic} tokens, PyTorch random tokens" \
  --method "3 warm-ups then the median of $STEPS steps (upper median): train_gpt's JSONL log (results.py from-jsonl; since 6c3ceb3 a step's time runs from the previous step's completion to its own, no sync inside a step), PyTorch's own timing (the device synchronised around each step); peak memory = max allocated by the caching allocator on the fullest rank" \
  --reference pytorch=pytorch-single --reference pytorch-compiled=pytorch-compiled-single \
  --reference tessera-train=tessera-train-single --vs-pytorch tessera-train- "${VERSUS[@]}" \
  --columns "mfu_causal,mode,micro_batches,scaled_against,scaling,vs_pytorch,vs_compiled$EXTRA_COLS,overhead_ms,notes" \
  --note "PyTorch's pp unties the embedding and the head (its stages hold them apart); train_gpt's keeps them tied, summing the table's gradient over the first and last stage" \
  --note "PyTorch: the Llama of tests/models/torch_llama.py in bf16 autocast over fp32 weights (FSDP2: bf16 parameters, fp32 reduction), AdamW fused (tp: foreach=False), gradient-norm clipping at 1.0 (pp: per stage); tp_sp gathers each norm's output once in bf16; recompute $RECOMPUTE on both sides" \
  --note "pytorch-compiled-*: the same runs with each block under torch.compile (torchtitan's per-block compile); vs_compiled: tessera's tokens/s over the compiled row of its layout; DTensor TP runs eager only" \
  "${note_args[@]}" "${expect_args[@]}" || rc=1
exit $rc
