#!/usr/bin/env bash
# train_gpt alone on NPROC GPUs: each layout's distance from its scaling target, named from traces, and the
# data-parallel variants the traces point at.
#   bench/llama/scale_traces.sh BUILD LOGS [variants] [traces]        (default: both)
# variants  untraced, each scaled against tessera-single: the run RUN of RESULTS/variants (bench/results.py gpt).
#           VARIANTS (default single single-gqarepeat single-zero ddp ddp-zero ddp-embreduce ddp-bf16 ddp-ctas8
#           ddp-simple fsdp fsdp-bf16) names LAYOUT[-KNOB]: a layout of `traces` with --gqa repeat, --zero-grads
#           zero, --emb-grad reduce, --grad-reduce bf16, --fsdp-emb-rows (-rows), NCCL_MIN/MAX_CTAS=8 (-ctas8),
#           NCCL_PROTO=Simple, TESSERA_NCCL_STREAM_PRIORITY=normal (-normalprio), TESSERA_NCCL_CTA_POLICY=efficiency
#           (-ctaeff): the case of `variants` below.
# traces    TRACES (single ddp fsdp tp-sp pp pp-zb) traced for steps 5 and 6 of 8 (--profile): LOGS/traces/, the
#           kernels of single, ddp, fsdp side by side (LOGS/kernels-dp.md), each trace's gaps beside communication
#           (LOGS/gaps-<name>.txt; every rank's for tp-sp, pp, pp-zb): trace readings, kept with the logs.
# Env: NPROC (4), MODEL (llama3-1b; llama-tiny on a CPU: the plumbing, fp32, Gloo), B (4 per GPU), TP_B (NPROC x B),
# PP_B (16), MB (16), STEPS (10 after 3 warm-ups), RUN_TIMEOUT (s per run, 120), BUDGET_S (0 = none), PYTHON,
# RESULTS (bench/results), SUITE (variants), RUN (MODEL; name another one when VARIANTS picks other variants).
set -uo pipefail
BUILD=${1:?build dir}
LOGS=${2:?log dir}
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
SECTIONS=("$@")
[ ${#SECTIONS[@]} -eq 0 ] && SECTIONS=(variants traces)
N=${NPROC:-4} MODEL=${MODEL:-llama3-1b} B=${B:-4} STEPS=${STEPS:-10}
TP_B=${TP_B:-$((N * B))} PP_B=${PP_B:-16} MB=${MB:-16}
RUN_TIMEOUT=${RUN_TIMEOUT:-120} BUDGET_S=${BUDGET_S:-0}
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[[ $N =~ ^[1-9][0-9]*$ ]] && ((N >= 2)) || { echo "scale_traces.sh: NPROC=$N: needs 2 GPUs or more" >&2; exit 2; }
[ -x "$BUILD/bin/train_gpt" ] || { echo "scale_traces.sh: $BUILD/bin/train_gpt was not built" >&2; exit 1; }
source "$HERE/../run_lib.sh"  # run, budget_run, torchrun_cmd, machine
torchrun_cmd
PRECISION=()
nvidia-smi -L >/dev/null 2>&1 && PRECISION=(--precision bf16)
mkdir -p "$LOGS/traces"
rc=0 logs=() BENCH=scale_traces.sh ENV_RUN=()

train() {  # train NAME NPROC STEPS flags...: train_gpt under torchrun (env ENV_RUN=(VAR=value ...) before
  # it), its RESULT line from the JSONL log
  local name=$1 n=$2 steps=$3
  shift 3
  budget_run "$name" env "${ENV_RUN[@]}" "${TORCHRUN[@]}" --nproc_per_node="$n" --no_python "$BUILD/bin/train_gpt" --model "$MODEL" \
    "${PRECISION[@]}" --recompute none --steps "$steps" --log-jsonl "$LOGS/$name.jsonl" "$@" &&
    "$PY" "$HERE/../results.py" from-jsonl "$LOGS/$name.jsonl" "$name" 3 >>"$LOGS/$name.log" &&
    grep RESULT "$LOGS/$name.log" | cut -c1-240 | sed 's/^/  /'
}
layout() {  # layout NAME: the flags of a layout name
  case $1 in
    single) echo --layout 1x1x1 --batch "$B" ;;
    ddp) echo --layout "${N}x1x1" --batch $((N * B)) ;;
    fsdp) echo --layout "${N}x1x1" --batch $((N * B)) --dp-mode fsdp ;;
    tp-sp) echo --layout "1x1x$N" --batch "$TP_B" --sp ;;
    pp) echo --layout "1x${N}x1" --batch "$PP_B" --micro-batches "$MB" --schedule 1f1b ;;
    pp-zb) echo --layout "1x${N}x1" --batch "$PP_B" --micro-batches "$MB" --schedule zb-h1 ;;
  esac
}
gpus() { [ "$1" = single ] && echo 1 || echo "$N"; }

for s in "${SECTIONS[@]}"; do
  case $s in
    variants)
      for v in ${VARIANTS:-single single-gqarepeat single-zero ddp ddp-zero ddp-embreduce ddp-bf16 ddp-ctas8 ddp-simple fsdp fsdp-bf16}; do
        base=${v%-*} extra=() ENV_RUN=()
        [ -n "$(layout "$v")" ] && base=$v  # a layout name itself (tp-sp, pp-zb)
        [ -n "$(layout "$base")" ] || { echo "scale_traces.sh: unknown variant $v" >&2; rc=1; continue; }
        case $v in
          *-bf16) extra=(--grad-reduce bf16) ;;
          *-zero) extra=(--zero-grads zero) ;;
          *-embreduce) extra=(--emb-grad reduce) ;;
          *-rows) extra=(--fsdp-emb-rows) ;;
          *-gqarepeat) extra=(--gqa repeat) ;;
          *-ctas8) ENV_RUN=(NCCL_MIN_CTAS=8 NCCL_MAX_CTAS=8) ;;
          *-simple) ENV_RUN=(NCCL_PROTO=Simple) ;;
          *-normalprio) ENV_RUN=(TESSERA_NCCL_STREAM_PRIORITY=normal) ;;
          *-ctaeff) ENV_RUN=(TESSERA_NCCL_CTA_POLICY=efficiency) ;;
        esac
        # shellcheck disable=SC2046
        train "tessera-$v" "$(gpus "$base")" $((STEPS + 3)) $(layout "$base") "${extra[@]}"
      done
      ENV_RUN=()
      "$PY" "$HERE/../results.py" gpt "${logs[@]}" --suite "${SUITE:-variants}" --run "${RUN:-$MODEL}" \
        --results "${RESULTS:-$HERE/../results}" --machine "$(PYTHON=$PY machine "$N")" \
        --environment "$(PYTHON=$PY environment)" --model "$MODEL" --precision "${PRECISION[1]:-fp32}" \
        --command "${VARIANTS:+VARIANTS='$VARIANTS' }NPROC=$N MODEL=$MODEL B=$B STEPS=$STEPS bench/llama/scale_traces.sh $BUILD $LOGS variants" \
        --title "$MODEL on $N GPU(s): train_gpt's data-parallel variants (gradients reduced in float32 and bf16)" \
        --config "$MODEL ${PRECISION[*]:-fp32}; B=$B sequences per GPU (tp-sp: TP_B=$TP_B in all; pp, pp-zb: PP_B=$PP_B in MB=$MB micro-batches); synthetic tokens; no recompute" \
        --method "3 warm-ups then the median of $STEPS steps (upper median) from train_gpt's JSONL log" \
        --reference tessera=tessera-single --columns "mode,scaled_against,scaling,overhead_ms" || rc=1 ;;
    traces)
      for t in ${TRACES:-single ddp fsdp tp-sp pp pp-zb}; do
        # shellcheck disable=SC2046
        train "traced-$t" "$(gpus "$t")" 8 $(layout "$t") --profile "$LOGS/traces/$t.json:5:2" || continue
        "$PY" "$HERE/../profile/gaps.py" "$LOGS/traces/$t.json" --top 12 >"$LOGS/gaps-$t.txt" 2>&1 &&
          sed -n 2,4p "$LOGS/gaps-$t.txt" | sed "s/^/  $t: /"
        # Pipelines and TP: every rank's idle time too (which stage sets the pace, which rank waits).
        case $t in
          pp | pp-zb | tp-sp)
            for f in "$LOGS"/traces/"$t".rank[0-9]*.json; do
              [ -f "$f" ] || continue
              r=${f##*.rank} r=${r%.json}
              "$PY" "$HERE/../profile/gaps.py" "$f" --top 12 >"$LOGS/gaps-$t.rank$r.txt" 2>&1 &&
                sed -n 3p "$LOGS/gaps-$t.rank$r.txt" | sed "s/^/  $t rank $r: /"
            done ;;
        esac
      done
      if [ -f "$LOGS/traces/single.json" ] && [ -f "$LOGS/traces/ddp.json" ] && [ -f "$LOGS/traces/fsdp.json" ]; then
        "$PY" "$HERE/../profile/summarize.py" --steps 2 --top 40 single="$LOGS/traces/single.json" \
          ddp="$LOGS/traces/ddp.json" fsdp="$LOGS/traces/fsdp.json" >"$LOGS/kernels-dp.md" 2>&1 || rc=1
        grep -E "all kernels|GPU span" "$LOGS/kernels-dp.md"
      fi
      rm -f "$LOGS"/traces/*.rank[0-9]*.json
      gzip -f "$LOGS"/traces/*.json 2>/dev/null ;;
    *) echo "scale_traces.sh: unknown section $s (variants traces)" >&2; exit 2 ;;
  esac
done
exit $rc
