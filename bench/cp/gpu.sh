#!/usr/bin/env bash
# Issue 38's benchmark in one device call on a 4-GPU machine, from the repository root (carry .deps: CLI11's
# headers): builds train_gpt against the image's PyTorch (scripts/gpu-check --no-tests --no-bench, that target
# only), then runs bench/cp/run.sh with what is left of the call as its budget: BUDGET_S = CALL_S (590) - the
# seconds the build took - MARGIN_S (30: a last run's kill, 15 s after its timeout, the table, the exit).
# run.sh rewrites the table after every run, so a call ended early still leaves the rows it got. Logs (each
# run's .log, train_gpt's .jsonl) in $OUT/cp-logs, the table in $OUT/results/cp.{json,md} (copy it to
# bench/results/ to commit it).
#   OUT=/path bench/cp/gpu.sh          Env: OUT (/tmp/cp-gpu), BUILD (build-gpu), CALL_S, MARGIN_S, run.sh's
set -uo pipefail
OUT=${OUT:-/tmp/cp-gpu} BUILD=${BUILD:-build-gpu}
t0=$(date +%s)
mkdir -p "$OUT/cp-logs" "$OUT/results"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
GPU_CHECK_TARGETS=train_gpt BUILD=$BUILD OUT=$OUT scripts/gpu-check --no-tests --no-bench >"$OUT/gpu-check.log" 2>&1
built=$(($(date +%s) - t0))
if [ ! -x "$BUILD/bin/train_gpt" ]; then
  echo "bench/cp/gpu.sh: train_gpt was not built (${built} s):"
  tail -30 "$OUT/build.log" 2>/dev/null || tail -30 "$OUT/gpu-check.log"
  exit 1
fi
budget=$((${CALL_S:-590} - built - ${MARGIN_S:-30}))
echo "=== bench/cp/gpu.sh: train_gpt built in ${built} s; $(nvidia-smi -L | grep -c '^GPU ') GPUs; run.sh gets ${budget} s"
echo "bench/cp/gpu.sh (train_gpt built in ${built} s; run.sh's budget ${budget} s)" >>"$OUT/cp-logs/commands.txt"
BUDGET_S=$budget RESULTS=$OUT/results bench/cp/run.sh "$BUILD" "$OUT/cp-logs"
rc=$?
echo "=== bench/cp/gpu.sh: done rc=$rc after $(($(date +%s) - t0)) s"
exit $rc
