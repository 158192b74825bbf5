#!/usr/bin/env bash
# DDP benchmark on this machine's GPUs: the anchors' GPT-735M trained by PyTorch and by tessera,
# 1 GPU and 2 GPUs, then the run "ddp" of bench/results/gpt735m.{json,md}.
#   bench/ddp/run.sh BUILD_DIR LOG_DIR
# Runs, in order (each under `timeout`, a failed run leaves its row out and the rest go on):
#   pytorch-single (torchrun -n1 torch_ddp.py single), tessera-single (tessera_bench_ddp single),
#   pytorch-ddp (torchrun -n2 torch_ddp.py ddp), tessera-ddp (torchrun -n2 tessera_bench_ddp
#   tessera --variants ...: bucket views, bf16, SM carveouts), then PyTorch and tessera with NCCL
#   limited to CTAS (8 16) CTAs, tessera under NCCL's "efficiency" CTA policy (CTA_POLICY=0: not);
#   then bench/results.py gpt --suite gpt735m --run ddp.
# About 20-40 s per run (model init on the CPU dominates), 2-3 min in all.
# Env: SINGLE_VARIANTS / DDP_VARIANTS (the in-process variant lists, see ddp_bench.cpp), CTAS,
# NPROC (2), RUN_TIMEOUT (s per run, 90), B/STEPS/D/L/V/T passed through (smoke tests: e.g. L=2 STEPS=3),
# RESULTS (dir for gpt735m.json/md, default bench/results), SUITE (gpt735m).
# Exit status: 0 when every run produced its row, 1 otherwise (the results hold what ran).
set -uo pipefail
BUILD=${1:?build dir}
LOGS=${2:?log dir}
NPROC=${NPROC:-2}
RUN_TIMEOUT=${RUN_TIMEOUT:-90}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
RESULTS=${RESULTS:-$ROOT/bench/results}
BIN="$BUILD/bench/tessera_bench_ddp"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$LOGS"
[ -x "$BIN" ] || { echo "run.sh: $BIN was not built (needs CUDA LibTorch >= 2 and tessera's DDP)" >&2; }
rc=0
logs=()
BENCH="ddp bench"
source "$ROOT/bench/run_lib.sh"  # run NAME CMD..., machine

run pytorch-single torchrun --nproc_per_node=1 --standalone "$HERE/torch_ddp.py" single
# tessera's 1-GPU reference, and (in the same process) the same step with SMs carved out of its
# GEMMs: what the carveout costs where nothing runs beside them.
# "fused": the linears sum their weight gradients in fp32 in the GEMM (the reference of the fused DDP rows).
run tessera-single "$BIN" single --variants "${SINGLE_VARIANTS:-base,fused,view+fused,carve8,carve16,carve24}"
run pytorch-ddp torchrun --nproc_per_node="$NPROC" --standalone "$HERE/torch_ddp.py" ddp
# tessera DDP and its variants, one process (same model and data, a fresh DDP each): bucket views,
# bf16 gradients, weight gradients summed in the GEMM (fused; with view: straight into the bucket,
# no copy in or out: bench/results/probes.md, run nocomm), and N SMs
# kept free of backward's GEMMs while buckets are in flight (carveN).
run tessera-ddp torchrun --nproc_per_node="$NPROC" --standalone --no-python "$BIN" tessera \
  --variants "${DDP_VARIANTS:-base,view,bf16,fused,view+fused,fused+bf16,view+fused+optov,fused+bf16+optov,view+fused+carve16,carve8,carve16,carve24,bf16+carve16}"
# NCCL limited to N CTAs (NCCL_MAX_CTAS, so the all-reduce takes fewer SMs; PyTorch too, for a fair
# row), with the matching carveout (CTAS=0 skips these).
for c in ${CTAS:-8 16}; do
  [ "$c" = 0 ] && continue
  BENCH_SYSTEM=pytorch-ddp-ctas$c NCCL_MAX_CTAS=$c run pytorch-ddp-ctas$c torchrun --nproc_per_node="$NPROC" --standalone "$HERE/torch_ddp.py" ddp
  BENCH_SYSTEM=tessera-ddp-ctas$c NCCL_MAX_CTAS=$c run tessera-ddp-ctas$c torchrun --nproc_per_node="$NPROC" --standalone --no-python "$BIN" tessera \
    --variants "base,carve$c,bf16+carve$c"
done
# NCCL's CTA policy "efficiency" (as few CTAs as give decent bandwidth; TESSERA_NCCL_CTA_POLICY,
# src/comm/nccl/nccl_communicator.cpp) with the fused variants (CTA_POLICY=0 skips it).
if [ "${CTA_POLICY:-1}" != 0 ]; then
  BENCH_SYSTEM=tessera-ddp-ctapolicy TESSERA_NCCL_CTA_POLICY=efficiency run tessera-ddp-ctapolicy \
    torchrun --nproc_per_node="$NPROC" --standalone --no-python "$BIN" tessera --variants "view+fused,fused+bf16,view+fused+carve16"
fi

model=735m
[ "${D:-2048} ${L:-12} ${V:-32000}" = "2048 12 32000" ] || model="gpt D=${D} L=${L} V=${V}"
python3 "$ROOT/bench/results.py" gpt "${logs[@]}" --suite "${SUITE:-gpt735m}" --run ddp --results "$RESULTS" \
  --machine "$(machine "$NPROC")" --environment "$(environment)" --command "bench/ddp/run.sh $BUILD $LOGS" \
  --title "DDP: tessera beside PyTorch DDP" --model "$model" --seq-len "${T:-1024}" --precision bf16 \
  --config "D=${D:-2048} L=${L:-12} V=${V:-32000} T=${T:-1024} B=${B:-8} STEPS=${STEPS:-10}" \
  --method "fp32 parameters under bf16 autocast, fused AdamW lr 1e-4, random tokens, batch B per GPU; 3 warm-ups then the median of STEPS steps, the device synchronised around each step; peak memory = max allocated by the caching allocator" \
  --note "hidden_comm_fraction = 1 - overhead_ms / allreduce_ms, clamped to [0, 1]; allreduce_ms = all-reducing every gradient bucket (same sizes, fp32) back to back without backward. An estimate: any other DDP overhead counts as exposed communication." \
  --columns scaled_against,scaling,allreduce_ms,hidden_comm_fraction \
  --expect pytorch-single --expect tessera-single --expect pytorch-ddp --expect tessera-ddp || rc=1
exit $rc
