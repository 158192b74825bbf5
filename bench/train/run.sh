#!/usr/bin/env bash
# train_gpt beside PyTorch (bench/torch_anchor.py) and, for dp and fsdp, tessera's Python path
# (bench/train/tessera_py.py) on the anchors' GPT-735M, bf16, in one run; then the run RUN
# (train_gpt-<sections>) of bench/results/SUITE (gpt735m): PyTorch's and tessera-py's rows scaled against
# pytorch-single, train_gpt's against tessera-train-single, vs_pytorch over PyTorch's row of the layout.
#   bench/train/run.sh BUILD_DIR LOG_DIR [sections...]      (default: single dp fsdp tp pp)
# Sections (N = NPROC GPUs): single (B=8, 1 GPU), dp and fsdp (B=8 per GPU), tp (B=16 shared), pp (B=32 in 16
# micro-batches), accum (1 GPU: B=32 in 16 micro-batches, and without fused weight gradients), mixed (N=4:
# 2x1x2 ddp and fsdp, 1x2x2; no PyTorch row), data (1 GPU: synthetic tokens and the Brown corpus, each twice,
# alternating: real data must not slow the step; alone it is the run train-step of bench/results/data).
# Env: NPROC (2), RUN_TIMEOUT (s per run, 180), STEPS (10 after 3 warm-ups), SUITE, RUN, RESULTS; PYTHONPATH must
# reach the built module (scripts/bench sets it); TESSERA_OVERLAP_SM_CARVEOUT and TESSERA_TP_FORWARD_CHUNKS
# reach every tessera run (the command records them).
set -uo pipefail
BUILD=${1:?build dir}
LOGS=${2:?log dir}
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
SECTIONS=("$@")
[ ${#SECTIONS[@]} -eq 0 ] && SECTIONS=(single dp fsdp tp pp)
N=${NPROC:-2}
RUN_TIMEOUT=${RUN_TIMEOUT:-180}
export STEPS=${STEPS:-10}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$LOGS"
TORCHRUN=(torchrun --standalone)
rc=0
logs=()
BENCH="train bench"
source "$HERE/../run_lib.sh"  # run NAME CMD..., machine
torch_run() { local name=$1 n=$2 mode=$3; run "$name" "${TORCHRUN[@]}" --nproc_per_node="$n" "$HERE/../torch_anchor.py" "$mode"; }
train() {  # train NAME NPROC train_gpt-flags...: then its RESULT line from the JSONL log
  local name=$1 n=$2
  shift 2
  run "$name" "${TORCHRUN[@]}" --nproc_per_node="$n" --no-python "$BUILD/bin/train_gpt" --model 735m \
    --precision bf16 --steps $((STEPS + 3)) --log-jsonl "$LOGS/$name.jsonl" "$@"
  python3 "$HERE/../results.py" from-jsonl "$LOGS/$name.jsonl" "$name" >>"$LOGS/$name.log" && grep RESULT "$LOGS/$name.log" | cut -c1-300
}
py_run() { local name=$1 mode=$2; run "$name" "${TORCHRUN[@]}" --nproc_per_node="$N" "$HERE/tessera_py.py" "$mode"; }

for s in "${SECTIONS[@]}"; do
  case $s in
    single)
      B=8 torch_run pytorch-single 1 single
      train tessera-train-single 1 --layout 1x1x1 --batch 8 ;;
    dp)
      B=8 torch_run pytorch-ddp "$N" ddp
      train tessera-train-ddp "$N" --layout "${N}x1x1" --batch $((8 * N))
      B=8 py_run tessera-py-ddp ddp ;;
    fsdp)
      B=8 torch_run pytorch-fsdp "$N" fsdp
      train tessera-train-fsdp "$N" --layout "${N}x1x1" --dp-mode fsdp --batch $((8 * N))
      B=8 py_run tessera-py-fsdp fsdp ;;
    tp)
      B=16 torch_run pytorch-tp "$N" tp
      train tessera-train-tp "$N" --layout "1x1x${N}" --batch 16
      train tessera-train-tp-sp "$N" --layout "1x1x${N}" --batch 16 --sp ;;
    pp)
      B=32 MB=16 torch_run pytorch-pp-mb16 "$N" pp
      train tessera-train-pp-mb16 "$N" --layout "1x${N}x1" --batch 32 --micro-batches 16 ;;
    accum)
      train tessera-train-accum16 1 --layout 1x1x1 --batch 32 --micro-batches 16
      train tessera-train-accum16-nofuse 1 --layout 1x1x1 --batch 32 --micro-batches 16 --no-fused-wgrad
      train tessera-train-single-nofuse 1 --layout 1x1x1 --batch 8 --no-fused-wgrad ;;
    mixed)
      train tessera-train-2x1x2-ddp 4 --layout 2x1x2 --batch 32
      train tessera-train-2x1x2-fsdp 4 --layout 2x1x2 --dp-mode fsdp --batch 32
      train tessera-train-1x2x2 4 --layout 1x2x2 --batch 32 --micro-batches 8 ;;
    data)
      brown=(--data "${TESSERA_DATA_DIR:-$HERE/../../data}/brown/brown_sp4096_text_document" --split 98,2 --eod-token 2)
      for k in 1 2; do
        train tessera-train-single$([ $k = 2 ] && echo -2) 1 --layout 1x1x1 --batch 8
        train tessera-train-brown$([ $k = 2 ] && echo -2) 1 --layout 1x1x1 --batch 8 "${brown[@]}"
      done ;;
    *) echo "run.sh: unknown section $s" >&2; exit 2 ;;
  esac
done

suite=gpt735m run="train_gpt-$(IFS=-; echo "${SECTIONS[*]}")"
[ "${SECTIONS[*]}" = data ] && suite=data run=train-step
python3 "$HERE/../results.py" gpt "${logs[@]}" --suite "${SUITE:-$suite}" --run "${RUN:-$run}" \
  --results "${RESULTS:-$HERE/../results}" --machine "$(machine "$N")" --environment "$(environment)" \
  --command "$(env | grep -E '^TESSERA_(OVERLAP_SM_CARVEOUT|TP_FORWARD_CHUNKS)=' | sort | tr '\n' ' ')NPROC=$N STEPS=$STEPS bench/train/run.sh $BUILD $LOGS ${SECTIONS[*]}" \
  --title "train_gpt beside PyTorch on GPT-735M: ${SECTIONS[*]}" --model 735m --seq-len 1024 --precision bf16 \
  --method "3 warm-ups then the median step of train_gpt's JSONL log (results.py from-jsonl) or of the PyTorch run; peak memory = max allocated by the caching allocator (the fullest rank)" \
  --reference pytorch=pytorch-single --reference tessera-py=pytorch-single --reference tessera-train=tessera-train-single \
  --vs-pytorch tessera-train- --vs-pytorch tessera-py- --columns mode,scaled_against,scaling,vs_pytorch || rc=1
exit $rc
