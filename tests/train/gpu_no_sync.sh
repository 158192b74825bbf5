#!/usr/bin/env bash
# No host synchronization inside a training step on GPUs (issue 40): train_gpt with
# --sync-debug error, where PyTorch throws on any item(), copy to the host, blocking copy or
# stream/device synchronize after the run's first step, in the layouts the visible GPUs allow
# (1 GPU: DDP, FSDP, gradient accumulation, selective recompute with fused kernels, FP8; 2 GPUs:
# DDP, FSDP, TP + SP, PP 1F1B and ZB-H1). Each run's reported losses and gradient norms (read back
# one step late) must equal, step by step, those of the same run with --breakdown (which
# synchronizes and reports at once): a report shifted by a step or read before its step ended
# would differ. A tiny Llama, 6 steps, bf16 (the GPUs' default). Exit 0 pass, 1 fail, 77 skip (no GPU).
#   gpu_no_sync.sh TRAIN_GPT [OUT_DIR]
set -uo pipefail
TRAIN=$1 OUT=${2:-$(mktemp -d)}
if ! nvidia-smi -L >/dev/null 2>&1; then echo "SKIP: no GPU visible"; exit 77; fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NGPU=$(nvidia-smi -L | wc -l)
if [[ -n ${CUDA_VISIBLE_DEVICES+x} ]]; then NGPU=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .); fi
mkdir -p "$OUT"
PY=$(command -v python3)
fail=0
MODEL=(--model llama-tiny --hidden-size 128 --heads 4 --kv-heads 2 --ffn 384 --seq-len 128 --steps 6 --seed 5
       --lr 3e-3)
# case NAME NPROC FLAGS...: the checked run and its --breakdown twin, compared.
case_() {
  local name=$1 n=$2
  shift 2
  if ((n > NGPU)); then echo "skip $name: needs $n GPUs, $NGPU visible"; return; fi
  for mode in checked breakdown; do
    local extra=(--sync-debug error)
    [[ $mode == breakdown ]] && extra=(--breakdown)
    if ! timeout 300 torchrun -r 1 -t 1 --standalone --nproc_per_node="$n" --no_python "$TRAIN" "${MODEL[@]}" "$@" \
      "${extra[@]}" --log-jsonl "$OUT/$name.$mode.jsonl" >"$OUT/$name.$mode.log" 2>&1; then
      echo "FAIL $name ($mode): train_gpt failed; the end of $OUT/$name.$mode.log:"
      grep -v "^\[tessera rank [1-9]" "$OUT/$name.$mode.log" | grep -iE "error|synchroniz" | head -5
      fail=1
      return
    fi
  done
  "$PY" - "$OUT/$name.checked.jsonl" "$OUT/$name.breakdown.jsonl" "$name" "$TOL" <<'PY' || fail=1
import json, sys
a, b, name, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
def steps(p):
    return [r for r in map(json.loads, open(p)) if r.get("event") == "step"]
x, y = steps(a), steps(b)
if [r["step"] for r in x] != list(range(1, 7)) or [r["step"] for r in y] != list(range(1, 7)):
    sys.exit(f"FAIL {name}: step records {[r['step'] for r in x]} / {[r['step'] for r in y]}, expected 1..6")
worst = max(max(abs(p["loss"] - q["loss"]), abs(p["grad_norm"] - q["grad_norm"])) for p, q in zip(x, y))
moved = min(abs(x[i]["loss"] - x[i + 1]["loss"]) for i in range(5))
print(f"{'ok  ' if worst <= tol else 'FAIL'} {name}: losses {x[0]['loss']:.5f} .. {x[-1]['loss']:.5f}, largest "
      f"difference from the synchronous run {worst:.2e} (tolerance {tol:g}; the smallest step-to-step change {moved:.2e})")
sys.exit(0 if worst <= tol else 1)
PY
}
TOL=1e-5
case_ ddp1 1
case_ fsdp1 1 --dp-mode fsdp
case_ accumulate1 1 --micro-batches 2 --batch 8
case_ fused_selective1 1 --recompute selective --fused-kernels on
TOL=2e-3 case_ fp8_bf16_1 1 --precision bf16 --fp8 tensorwise --hidden-size 256 --ffn 768
case_ ddp2 2
case_ fsdp2 2 --dp-mode fsdp
case_ tp2_sp 2 --tp 2 --sp
case_ pp2_1f1b 2 --pp 2 --batch 8
case_ pp2_zb 2 --pp 2 --batch 8 --schedule zb-h1
if ((fail)); then echo "FAIL: see above ($OUT)"; exit 1; fi
echo "PASS: no host synchronization inside a step, reports equal to the synchronous run's"
