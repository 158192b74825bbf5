#!/usr/bin/env bash
# Runs the collectives benchmark on this machine's GPUs: PyTorch's side and tessera's side in
# interleaved rounds, then writes the run RUN (bf16) of bench/results/collectives.{json,md} (bench/results.py
# collectives).
#   bench/collectives/run.sh BUILD_DIR LOG_DIR [ROUNDS]
# Needs torchrun (PyTorch) on the PATH and tessera built with NCCL in BUILD_DIR.
set -euo pipefail
BUILD=${1:?build dir}
LOGS=${2:?log dir}
ROUNDS=${3:-2}
NPROC=${NPROC:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$LOGS"
torch_logs=() tessera_logs=()
for i in $(seq 1 "$ROUNDS"); do
  torchrun --nproc_per_node="$NPROC" "$HERE/torch_nccl_bw.py" 2>&1 | tee "$LOGS/bw_torch_$i.log"
  torchrun --nproc_per_node="$NPROC" --no-python "$BUILD/bench/tessera_bench_collectives" 2>&1 |
    tee "$LOGS/bw_tessera_$i.log"
  torch_logs+=("$LOGS/bw_torch_$i.log")
  tessera_logs+=("$LOGS/bw_tessera_$i.log")
done
# Diagnostic (not in the rows): tessera running its ops on non-blocking NCCL communicators, to
# show what that mode costs per op (NCCL launches each op of a non-blocking comm from a thread).
diag=()
if [ "${DIAG_NONBLOCKING:-1}" = 1 ]; then
  TESSERA_NCCL_BLOCKING=0 torchrun --nproc_per_node="$NPROC" --no-python "$BUILD/bench/tessera_bench_collectives" 2>&1 |
    tee "$LOGS/bw_tessera_nonblocking.log"
  diag=(--diag-nonblocking "$LOGS/bw_tessera_nonblocking.log")
fi
source "$ROOT/bench/run_lib.sh"  # machine, environment
python3 "$ROOT/bench/results.py" collectives --torch "${torch_logs[@]}" --tessera "${tessera_logs[@]}" \
  --machine "$(machine "$NPROC")" --environment "$(environment)" --gpus "$NPROC" ${RUN:+--run "$RUN"} \
  --command "NPROC=$NPROC bench/collectives/run.sh $BUILD $LOGS $ROUNDS" ${diag[@]+"${diag[@]}"}
