#!/usr/bin/env bash
# Context parallelism: train_gpt --cp beside PyTorch's context_parallel + FSDP2 (bench/cp/torch_cp.py), the same
# model, sequence length, batch (one sequence per data-parallel replica) and recompute, run by run (the most
# valuable first: llama3-8b at 131072, llama3-1b at 131072 down to 8192, then llama3-8b's shorter lengths), each
# layout of CP_LAYOUTS, tessera then PyTorch (tessera-<model>-<T>-<layout>.log, pytorch-...; no PyTorch row with
# tp); then the run RUN (its layouts) of bench/results/cp.{json,md} (bench/results.py cp, after every run).
#   bench/cp/run.sh BUILD OUTDIR
# Layouts: cp4 (1x1x4x1), fsdp2xcp2 (2x1x2x1), cp2xtp2 (1x1x2x2), cp2 (1x1x2x1). Each run has its own steps and
# timeout (plan below); one cut by its timeout after two steps gives a row marked partial, one without a row its
# reason. Logs accumulate in OUTDIR: a later run of the same name replaces the earlier in the table.
# Env: CP_MODELS, CP_SEQS, CP_LAYOUTS (cp4), CP_SYSTEMS filter that order; CP_RUNS ("SYSTEM:MODEL:T:LAYOUT ...")
# replaces it. WARM, STEPS, RUN_TIMEOUT replace the plan's; BUDGET_S (0 = none: runs cut to what is left,
# skipped below MIN_RUN_S, 20); RECOMPUTE (auto: full from 4096 tokens per rank for llama3-8b, 16384 for the
# others, else selective); SDPA; PRECISION (bf16); PYTHON; RESULTS (bench/results); RUN; PYTORCH_CUDA_ALLOC_CONF
# (expandable_segments:True on both sides). Exit status 0 when every run of this invocation produced its row.
set -uo pipefail
BUILD=${1:?build dir}
LOGS=${2:?output dir}
HERE=$(cd "$(dirname "$0")" && pwd)
read -r -a MODELS <<<"${CP_MODELS:-llama3-8b llama3-1b}"
read -r -a SEQS <<<"${CP_SEQS:-131072 65536 32768 8192}"
read -r -a LAYOUTS <<<"${CP_LAYOUTS:-cp4}"
read -r -a SYSTEMS <<<"${CP_SYSTEMS:-tessera pytorch}"
BUDGET_S=${BUDGET_S:-0} MIN_RUN_S=${MIN_RUN_S:-20} RECOMPUTE=${RECOMPUTE:-auto} PRECISION=${PRECISION:-bf16}
PY=${PYTHON:-python3} RESULTS_DIR=${RESULTS:-$HERE/../results}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
[ -x "$BUILD/bin/train_gpt" ] || { echo "cp/run.sh: $BUILD/bin/train_gpt was not built" >&2; exit 1; }
mkdir -p "$LOGS"
BENCH="cp bench"
source "$HERE/../run_lib.sh"  # torchrun_cmd, machine
torchrun_cmd
machine >>"$LOGS/machine.txt"
has() { local x=$1; shift; for y in "$@"; do [ "$x" = "$y" ] && return 0; done; return 1; }

factors() {  # factors LAYOUT -> "DP CP TP"
  case $1 in
    cp4) echo "1 4 1" ;;
    fsdp2xcp2) echo "2 2 1" ;;
    cp2xtp2) echo "1 2 2" ;;
    cp2) echo "1 2 1" ;;
    *) return 1 ;;
  esac
}

# The order of the runs: most valuable first.
ORDER=(llama3-8b:131072 llama3-1b:131072 llama3-1b:65536 llama3-1b:32768 llama3-1b:8192
  llama3-8b:65536 llama3-8b:32768 llama3-8b:8192)
if [ -n "${CP_RUNS:-}" ]; then
  read -r -a RUNS <<<"$CP_RUNS"
else
  RUNS=()
  for mt in "${ORDER[@]}"; do
    has "${mt%%:*}" "${MODELS[@]}" && has "${mt##*:}" "${SEQS[@]}" || continue
    for layout in "${LAYOUTS[@]}"; do
      for sys in "${SYSTEMS[@]}"; do RUNS+=("$sys:$mt:$layout"); done
    done
  done
  for m in "${MODELS[@]}"; do  # a model or length outside ORDER (llama-tiny for a smoke run) goes last
    for T in "${SEQS[@]}"; do
      has "$m:$T" "${ORDER[@]}" && continue
      for layout in "${LAYOUTS[@]}"; do for sys in "${SYSTEMS[@]}"; do RUNS+=("$sys:$m:$T:$layout"); done; done
    done
  done
fi
for spec in "${RUNS[@]}"; do  # every run's spec checked before the first starts
  IFS=: read -r sys model T layout <<<"$spec"
  [[ $sys =~ ^(tessera|pytorch)$ && -n $model && $T =~ ^[0-9]+$ ]] && factors "$layout" >/dev/null ||
    { echo "cp/run.sh: bad run '$spec' (SYSTEM:MODEL:T:LAYOUT; tessera|pytorch; cp4|fsdp2xcp2|cp2xtp2|cp2)" >&2; exit 2; }
done
settings=$(env | grep -E '^(CP_[A-Z_]+|WARM|STEPS|RUN_TIMEOUT|BUDGET_S|MIN_RUN_S|RECOMPUTE|SDPA|PRECISION|PYTORCH_CUDA_ALLOC_CONF)=' | sort |
  while IFS='=' read -r k v; do [[ $v == *" "* ]] && printf '%s="%s" ' "$k" "$v" || printf '%s=%s ' "$k" "$v"; done)
echo "${settings}bench/cp/run.sh $BUILD $LOGS" >>"$LOGS/commands.txt"
echo "=== $BENCH: ${#RUNS[@]} runs in this order, ${BUDGET_S} s: ${RUNS[*]}"

recompute_of() {  # recompute_of MODEL T CP
  local per=$(($2 / $3))
  if [ "$RECOMPUTE" != auto ]; then echo "$RECOMPUTE"
  elif { [ "$1" = llama3-8b ] && ((per >= 4096)); } || ((per >= 16384)); then echo full
  else echo selective; fi
}
plan() {  # plan SYSTEM MODEL T -> "WARM STEPS TIMEOUT_S NEED_S"
  # Estimates for cp4 on H100 (bf16 FLOPs at FlashAttention-2's and cuBLAS's rates; llama3-1b cp4 took 0.45 s a
  # step at 32768 on H200 with the masked attention, docs/performance.md): the start-up (launch, model, sharding;
  # train_gpt draws the whole model on every rank's CPU first) and the time of a step. TIMEOUT_S allows 1.5 x
  # the start-up and 2 x the steps; NEED_S (the start-up and one step past the warm-ups: the least that gives a
  # row) must be left of the budget for the run to start.
  local up step w s
  case $1:$2 in
    tessera:llama3-8b) up=65 ;;
    pytorch:llama3-8b) up=25 ;;
    *:llama3-1b) up=18 ;;
    *) up=5 ;;
  esac
  case $2:$3 in
    llama3-8b:131072) step=20000 w=1 s=2 ;;
    llama3-8b:65536) step=6000 w=1 s=3 ;;
    llama3-8b:32768) step=2000 w=2 s=4 ;;
    llama3-8b:*) step=500 w=2 s=4 ;;
    llama3-1b:131072) step=5500 w=1 s=3 ;;
    llama3-1b:65536) step=1500 w=2 s=3 ;;
    *) step=500 w=3 s=5 ;;
  esac
  w=${WARM:-$w} s=${STEPS:-$s}
  local timeout=$((up * 3 / 2 + (w + s) * step * 2 / 1000 + 15)) need=$((up + (w + 1) * step / 1000))
  ((timeout < 60)) && timeout=60
  echo "$w $s ${RUN_TIMEOUT:-$timeout} $need"
}
settle() {  # settle MAX_S: wait (<= 30 s, <= MAX_S) until no process holds a GPU: a killed run's workers may exit late
  command -v nvidia-smi >/dev/null || return 0
  local i left n=$(($1 < 30 ? $1 : 30))
  for ((i = 0; i < n; i++)); do
    left=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr '\n' ' ')
    [ -z "${left// /}" ] && return 0
    sleep 1
  done
  ((n > 0)) && echo "  (GPU processes still alive after $n s: $left)"
}

status() {  # status RC SECONDS: the run's facts as the last line of its log (bench/results.py cp reads them)
  printf 'CP_RUN {"name": "%s", "system": "%s", "model": "%s", "seq_len": %s, "layout": "%s", "dp": %s, "cp": %s, ' \
    "$name" "$sys" "$model" "$T" "$layout" "$DP" "$CP" >>"$LOGS/$name.log"
  printf '"tp": %s, "recompute": "%s", "warm": %s, "steps": %s, "rc": "%s", "seconds": %s, "limit": %s}\n' \
    "$TP" "$R" "$W" "$S" "$1" "$2" "$limit" >>"$LOGS/$name.log"
}

rc=0
for spec in "${RUNS[@]}"; do
  IFS=: read -r sys model T layout <<<"$spec"
  name="$sys-$model-$T-$layout"
  read -r DP CP TP <<<"$(factors "$layout")"
  N=$((DP * CP * TP)) R=$(recompute_of "$model" "$T" "$CP")
  read -r W S limit need <<<"$(plan "$sys" "$model" "$T")"
  left=$((BUDGET_S > 0 ? BUDGET_S - SECONDS : 1 << 30))  # no budget: no limit but the run's own
  ((left < limit)) && limit=$left
  case $sys in
    tessera)
      cmd=("${TORCHRUN[@]}" --nproc_per_node="$N" --no_python "$BUILD/bin/train_gpt" --model "$model"
        --precision "$PRECISION" --seq-length "$T" --layout "${DP}x1x${CP}x${TP}" --dp-mode fsdp --batch "$DP"
        --recompute "$R" --steps $((W + S)) --breakdown --log-jsonl "$LOGS/$name.jsonl") ;;
    pytorch)
      if ((TP > 1)); then
        echo "=== $BENCH: $name: not run (PyTorch's context_parallel with DTensor TP is not run here)"
        continue
      fi
      cmd=(env MODEL="$model" T="$T" CP="$CP" RECOMPUTE="$R" WARM="$W" STEPS="$S" "${TORCHRUN[@]}" --nproc_per_node="$N"
        "$HERE/torch_cp.py") ;;
    *) echo "cp/run.sh: $spec: unknown system $sys (tessera pytorch)" >&2; exit 2 ;;
  esac
  ((need < MIN_RUN_S)) && need=$MIN_RUN_S
  if ((left < need)); then
    ((left < 0)) && left=0
    why="${left} s of the ${BUDGET_S} s budget left, it needs about ${need} s"
    echo "=== $BENCH: $name SKIPPED: $why"
    if [ ! -s "$LOGS/$name.log" ]; then  # an earlier call's log of this run stays
      echo "cp/run.sh: skipped: $why" >"$LOGS/$name.log"
      status skipped 0
    fi
    rc=1
    continue
  fi
  echo "=== $BENCH: $name ($W + $S steps, recompute $R, timeout ${limit} s, +${SECONDS} s): ${cmd[*]}"
  [ "$sys" = tessera ] && rm -f "$LOGS/$name.jsonl"
  t0=$SECONDS r=0
  timeout -k 15 "$limit" "${cmd[@]}" >"$LOGS/$name.log" 2>&1 || r=$?
  status "$r" $((SECONDS - t0))
  "$PY" "$HERE/../results.py" cp --summary "$LOGS/$name.log" | sed 's/^/  /'
  # The table after every run, so that an invocation ended early still leaves the rows it got.
  "$PY" "$HERE/../results.py" cp "$LOGS" --results "$RESULTS_DIR" --precision "$PRECISION" ${RUN:+--run "$RUN"} >/dev/null 2>&1
  ((r == 0)) || { rc=1; settle $((BUDGET_S > 0 ? BUDGET_S - SECONDS : 30)); }
done

"$PY" "$HERE/../results.py" cp "$LOGS" --results "$RESULTS_DIR" --precision "$PRECISION" ${RUN:+--run "$RUN"} || rc=1
echo "=== $BENCH: done after ${SECONDS} s, rc=$rc"
exit $rc
