#!/usr/bin/env bash
# Issue 37's GPU work in one call, on a GPU machine from the repository root (the image's torch):
# builds what it needs (scripts/gpu-check --no-tests --no-bench with these targets), then, each
# section on its own so that one failure leaves the others' results:
#   tests   the FP8 kernels bit for bit against the CPU (test_kernels_gpu Fp8Gpu*), the FP8 layers
#           at tp 1/2/4 against the emulation (test_tp_fp8_gpu), the loss gap (fp8_gpu_loss_gap:
#           carry data/brown)
#   casts   tessera_bench_fp8: the casts beside a copy, cuBLASLt FP8 beside bf16 GEMMs
#   tables  bench/llama/parallel.sh fp8: llama3-1b on one GPU, then MODEL8 (llama3-8b) on every
#           visible GPU in FSDP at T8 (4096), selective recompute: tessera bf16 / FP8 beside
#           compiled PyTorch bf16 / FP8; results under $OUT/results
#   bench/fp8/gpu.sh [tests] [casts] [tables]        (default: all three)
# Env: OUT (/tmp/fp8-gpu), BUILD (build-gpu), MODEL8 (llama3-8b), T8 (4096), BUDGET_S (520: the
# tables' runs are cut to what is left of it).
set -uo pipefail
OUT=${OUT:-/tmp/fp8-gpu} BUILD=${BUILD:-build-gpu}
SECTIONS=("$@")
[ ${#SECTIONS[@]} -eq 0 ] && SECTIONS=(tests casts tables)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s)
left() { echo $((${BUDGET_S:-520} - ($(date +%s) - t0))); }
mkdir -p "$OUT/results"
GPU_CHECK_TARGETS="train_gpt test_nccl_gpu test_kernels_gpu test_tp_fp8_gpu tessera_bench_fp8" BUILD=$BUILD OUT=$OUT \
  scripts/gpu-check --no-tests --no-bench >/dev/null 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
gpus=$(nvidia-smi -L | grep -c '^GPU ')
rc=0
for s in "${SECTIONS[@]}"; do
  echo "=== bench/fp8/gpu.sh: $s (+$(($(date +%s) - t0)) s)"
  case $s in
    tests)
      "$BUILD/tests/kernels/test_kernels_gpu" --gtest_filter='Fp8Gpu*' >"$OUT/fp8_kernels.log" 2>&1 || rc=1
      grep -E "OK \]|FAILED \]|Failure|differ|actual" "$OUT/fp8_kernels.log" | head -20
      ctest --test-dir "$BUILD" -R "test_tp_fp8_gpu|fp8_gpu_loss_gap" --output-on-failure --timeout 600 \
        >"$OUT/fp8_ctest.log" 2>&1 || rc=1
      grep -E "Passed|Failed|Skipped|PASS|FAIL|gap" "$OUT/fp8_ctest.log" | head -20
      cp "$BUILD"/tests/fp8/gpu_loss_gap/fp8_loss_gpu.* "$OUT/results/" 2>/dev/null ;;
    casts) "$BUILD/bench/tessera_bench_fp8" | tee "$OUT/results/fp8_cast_bench.md" || rc=1 ;;
    tables)
      CUDA_VISIBLE_DEVICES=0 NPROC=1 MODEL=llama3-1b B=4 STEPS=8 RESULT_NAME=fp8_1gpu_llama3_1b RESULTS=$OUT/results \
        BUDGET_S=$(($(left) / 3)) bench/llama/parallel.sh "$BUILD" "$OUT/logs1" fp8 2>&1 | grep -E "^\||rror" | head -12
      if ((gpus > 1)); then
        NPROC=$gpus MODEL=${MODEL8:-llama3-8b} T=${T8:-4096} B=1 STEPS=8 RECOMPUTE=selective RESULT_NAME=fp8_${gpus}gpu_llama3_8b \
          RESULTS=$OUT/results BUDGET_S=$(left) bench/llama/parallel.sh "$BUILD" "$OUT/logs8" fp8 2>&1 | grep -E "^\||rror" | head -12
      fi
      tar czf "$OUT/fp8-logs.tgz" -C "$OUT" logs1 logs8 2>/dev/null && rm -rf "$OUT/logs1" "$OUT/logs8" ;;
    *) echo "bench/fp8/gpu.sh: unknown section $s (tests casts tables)" >&2; exit 2 ;;
  esac
done
echo "=== bench/fp8/gpu.sh done rc=$rc (+$(($(date +%s) - t0)) s)"
exit $rc
