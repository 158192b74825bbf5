#!/usr/bin/env bash
# Issue 54's MoE benchmark. First a correctness check of expert parallelism: train_gpt --model moe-tiny on the
# Brown corpus, fp32, 5 steps, the same seed, data and global batch (8 sequences), on one rank and with --ep 2
# (DDP) and --ep 2 --dp-mode fsdp on two: the loss curves must agree to CHECK_TOL (1e-4) relative, else the
# check fails loudly (CHECK FAILED, exit status 1; `file` still files the run, its check table saying so).
# On NCCL with two GPUs; with fewer on the CPU over Gloo (TESSERA_BACKEND=gloo; a GPU build made without Gloo
# cannot: then run `check` alone on a CPU build into the same LOGS), which the check's log and the filed run say
# (CHECK_NOTE: words added to that). Then the benchmark, on NPROC GPUs (all
# of this machine's): MODEL's shape, LAYERS blocks, seq 4096, bf16 over fp32 weights, no recompute, one sequence per
# GPU a step, no auxiliary losses, no shared expert, untied head — olmoe-1b-7b (d 2048, 16 heads, 16 kv heads, 64
# experts top 8 of expert FFN 1024, top-k probabilities not renormalised, vocabulary 50304, q/k norm QK_NORM) or
# qwen3-30b-a3b (d 2048, 32 heads of 128, 4 kv heads, 128 experts top 8 of 768 renormalised, vocabulary 151936,
# per-head q/k norm, RoPE theta 1e6):
# train_gpt --ep NPROC --dp-mode fsdp (ep 1 on one GPU; and in DDP with DDP=1) with real routing and with
# --moe-force-balanced, beside bench/moe/anchor.py (torchtitan-style PyTorch MoE: grouped_mm, all_to_all_single
# EP, FSDP2, compiled blocks) with real and with forced-balanced routing (the same rule).
# Then `file`: bench/moe/file.py files the run RUN of suite moe (bench/results/moe.{json,md}).
#   bench/moe/run.sh BUILD LOGS [check] [tessera] [pytorch] [file]   (default: all four)
# Sections may run in separate calls on the same LOGS; `file` alone files what LOGS holds, on any machine.
# Env: NPROC (this machine's GPUs), MODEL (olmoe-1b-7b | qwen3-30b-a3b), LAYERS (olmoe: 16, 8 on one GPU; qwen3: 24
# of 48 on 4 GPUs, 12 on 2, 6 on 1: what fp32 weights, gradients and Adam moments leave room for), QK_NORM (the
# preset's: whole for OLMoE, per-head for Qwen3; none), STEPS (12 timed after 3
# warm-ups), DDP (1: also the DDP row), FP8 (1: also --fp8 tensorwise FSDP rows, with and without --fp8-experts), COMPILE (1), CHECK_TOL (1e-4),
# RUN_TIMEOUT (s per run, 300), BUDGET_S (0 = none), PYTHON, RESULTS (bench/results), RUN (MODEL), COMMAND
# (the command the filed run names),
# NOTE (a note of the filed run).
# Exit status 0 when the check passed and every run of this call produced its row.
set -uo pipefail
BUILD=${1:?build dir}
LOGS=${2:?log dir}
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SECTIONS=("$@")
[ ${#SECTIONS[@]} -eq 0 ] && SECTIONS=(check tessera pytorch file)
for s in "${SECTIONS[@]}"; do
  case $s in
    check | tessera | pytorch | file) ;;
    *) echo "moe/run.sh: unknown section $s (check tessera pytorch file)" >&2; exit 2 ;;
  esac
done
has() { [[ " ${SECTIONS[*]} " == *" $1 "* ]]; }
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
N=${NPROC:-$GPUS}
((N < 1)) && N=1
MODEL=${MODEL:-olmoe-1b-7b}
case $MODEL in  # the blocks that fit N GPUs' fp32 weights, gradients and Adam moments (16 bytes a parameter)
  olmoe-1b-7b) LAYERS=${LAYERS:-$( ((N >= 2)) && echo 16 || echo 8)} QK_NORM=${QK_NORM:-whole} ;;
  qwen3-30b-a3b) LAYERS=${LAYERS:-$((N >= 4 ? 24 : N >= 2 ? 12 : 6))} QK_NORM=${QK_NORM:-per-head} ;;
  *) echo "moe/run.sh: MODEL=$MODEL (olmoe-1b-7b qwen3-30b-a3b)" >&2; exit 2 ;;
esac
STEPS=${STEPS:-12} DDP=${DDP:-1} FP8=${FP8:-0} COMPILE=${COMPILE:-1} CHECK_TOL=${CHECK_TOL:-1e-4}
RUN_TIMEOUT=${RUN_TIMEOUT:-300} BUDGET_S=${BUDGET_S:-0} PY=${PYTHON:-python3} RUN=${RUN:-$MODEL}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$LOGS"
rc=0 logs=()
BENCH="moe bench"
source "$HERE/../run_lib.sh"  # run, budget_run, torchrun_cmd, machine, environment
torchrun_cmd
if has tessera || has pytorch; then  # the benchmark's machine (a check alone may run elsewhere: its backend says where)
  machine "$N" >"$LOGS/machine.txt"
  PYTHON=$PY environment >"$LOGS/environment.txt"
  echo "MODEL=$MODEL LAYERS=$LAYERS QK_NORM=$QK_NORM STEPS=$STEPS NPROC=$N COMPILE=$COMPILE" >"$LOGS/settings.txt"
  date -u "+%Y-%m-%d %H:%M UTC" >"$LOGS/date.txt"
fi
if has tessera || has check; then
  [ -x "$BUILD/bin/train_gpt" ] || { echo "moe/run.sh: $BUILD/bin/train_gpt was not built" >&2; exit 1; }
fi

if has check; then
  BROWN=(--data "$ROOT/data/brown/brown_sp4096_text_document" --vocab-size 4096 --split "98,2" --eod-token 2)
  [ -f "$ROOT/data/brown/brown_sp4096_text_document.bin" ] || { echo "moe/run.sh: no data/brown (scripts/setup)" >&2; exit 1; }
  if ((GPUS >= 2)); then
    backend="NCCL, 2 GPUs" cenv=()
  else
    backend="Gloo on the CPU (fewer than 2 GPUs here)" cenv=(TESSERA_BACKEND=gloo CUDA_VISIBLE_DEVICES=)
  fi
  backend+=${CHECK_NOTE:+; $CHECK_NOTE}
  echo "=== moe check: moe-tiny, fp32, 5 steps, batch 8: one rank vs --ep 2 (DDP) vs --ep 2 --dp-mode fsdp; $backend"
  echo "$backend" >"$LOGS/check-backend.txt"
  check_run() {  # check_run NAME NPROC flags...
    local name=$1 n=$2
    shift 2
    rm -f "$LOGS/$name.jsonl"
    budget_run "$name" env "${cenv[@]}" "${TORCHRUN[@]}" --nproc_per_node="$n" --no_python "$BUILD/bin/train_gpt" \
      --model moe-tiny "${BROWN[@]}" --precision fp32 --steps 5 --batch 8 --seed 1234 --log-jsonl "$LOGS/$name.jsonl" "$@"
  }
  check_run check-ep1 1
  check_run check-ep2-ddp 2 --ep 2
  check_run check-ep2-fsdp 2 --ep 2 --dp-mode fsdp
  "$PY" - "$LOGS" "$CHECK_TOL" "$backend" <<'EOF' || rc=1
import json, os, sys
logs, tol, backend = sys.argv[1], float(sys.argv[2]), sys.argv[3]
def losses(name):
    p = os.path.join(logs, name + ".jsonl")
    if not os.path.exists(p):
        return None
    return [r["loss"] for r in map(json.loads, open(p)) if r.get("event") == "step"]
ref = losses("check-ep1")
out = dict(backend=backend, tolerance=tol, losses={}, max_rel={}, passed=False)
ok = bool(ref) and len(ref) == 5
for name in ("check-ep1", "check-ep2-ddp", "check-ep2-fsdp"):
    got = losses(name)
    out["losses"][name] = got
    print(f"  {name:16s} " + (" ".join(f"{x:.7f}" for x in got) if got else "NO LOSSES"))
    if name != "check-ep1":
        if not got or not ref or len(got) != len(ref):
            ok = False
            continue
        rel = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
        out["max_rel"][name] = rel
        print(f"  {name}: largest relative gap to one rank {rel:.2e} (tolerance {tol:g})")
        ok = ok and rel <= tol
out["passed"] = ok
json.dump(out, open(os.path.join(logs, "check.json"), "w"), indent=1)
print("  CHECK " + ("PASSED" if ok else "FAILED: the loss curves of --ep 2 do not match one rank's") + f" ({backend})")
sys.exit(0 if ok else 1)
EOF
fi

# Both sides: no auxiliary losses, no shared expert, no dense first layers, an untied head, seq 4096, bf16 over fp32.
SHAPE=(--model "$MODEL" --num-layers "$LAYERS" --qk-norm "$QK_NORM" --moe-aux-loss-coeff 0 --moe-z-loss-coeff 0
       --moe-shared-expert-intermediate-size 0 --moe-first-dense-layers 0 --untie-embeddings --seq-len 4096
       --precision bf16 --recompute none)
if [ "$MODEL" = olmoe-1b-7b ]; then  # the preset's shape; top-8 probabilities not renormalised (OLMoE's config)
  SHAPE+=(--moe-norm-topk off)
  ANCHOR=(--norm-topk off)
else  # Qwen3-30B-A3B: heads of 128 (not d / heads = 64), per-head q/k norm, top-8 of 128 renormalised, theta 1e6
  ANCHOR=(--heads 32 --kv-heads 4 --head-dim 128 --experts 128 --expert-ffn 768 --vocab 151936 --norm-topk on
          --rope-theta 1e6 --norm-eps 1e-6)
fi
if ((N >= 2)); then TNAME=(tessera-ep$N-fsdp tessera-ep$N-ddp) PNAME=pytorch-ep$N-fsdp; else TNAME=(tessera-single-fsdp tessera-single) PNAME=pytorch-single; fi
EP=()  # expert parallel over every GPU (none on one)
((N >= 2)) && EP=(--ep "$N")
TFLAGS=(--dp-mode fsdp "${EP[@]}")

if has tessera; then
  train() {  # train NAME flags...: the OLMoE shape on N GPUs, one sequence per GPU, 3 warm-ups + STEPS
    local name=$1
    shift
    rm -f "$LOGS/$name.jsonl"
    budget_run "$name" "${TORCHRUN[@]}" --nproc_per_node="$N" --no_python "$BUILD/bin/train_gpt" "${SHAPE[@]}" \
      --batch "$N" --steps $((STEPS + 3)) --log-jsonl "$LOGS/$name.jsonl" "$@" &&
      grep -E "step [0-9]+/[0-9]+ loss" "$LOGS/$name.log" | tail -2 | cut -c1-300 | sed 's/^/  /'
  }
  train "${TNAME[0]}" "${TFLAGS[@]}"
  train "${TNAME[0]}-balanced" "${TFLAGS[@]}" --moe-force-balanced
  [ "$FP8" = 1 ] && train "${TNAME[0]}-fp8" "${TFLAGS[@]}" --fp8 tensorwise &&
    train "${TNAME[0]}-fp8-experts" "${TFLAGS[@]}" --fp8 tensorwise --fp8-experts
fi
if has pytorch; then
  anchor() {  # anchor NAME COMPILE
    budget_run "$1" "${TORCHRUN[@]}" --nproc_per_node="$N" "$HERE/anchor.py" --layers "$LAYERS" --qk-norm "$QK_NORM" \
      "${ANCHOR[@]}" --batch 1 --steps 10 --warmup 3 --routing both --compile "$2" --system "$1"
  }
  anchor "$PNAME" "$COMPILE" ||
    { [ "$COMPILE" = 1 ] && [ -z "${budget_skipped:-}" ] && anchor "${PNAME/pytorch-/pytorch-eager-}" 0; }
fi
if has tessera && [ "$DDP" = 1 ]; then  # DDP's path (one GPU: no data parallel wrapper's sharding)
  train "${TNAME[1]}" "${EP[@]}"
fi

if has file; then
  mach=$(cat "$LOGS/machine.txt" 2>/dev/null || machine "$N")
  envir=$(cat "$LOGS/environment.txt" 2>/dev/null || PYTHON=$PY environment)
  settings=$(cat "$LOGS/settings.txt" 2>/dev/null || echo "MODEL=$MODEL LAYERS=$LAYERS QK_NORM=$QK_NORM STEPS=$STEPS NPROC=$N")
  cmd=${COMMAND:-$settings DDP=$DDP FP8=$FP8 bench/moe/run.sh $BUILD $LOGS ${SECTIONS[*]}}
  "$PY" "$HERE/file.py" "$LOGS" --results "${RESULTS:-$HERE/../results}" --run "$RUN" --machine "$mach" \
    --environment "$envir" --command "$cmd" ${NOTE:+--note "$NOTE"} || rc=1
fi
exit $rc
