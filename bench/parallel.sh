#!/usr/bin/env bash
# Tensor, pipeline and fully sharded data parallelism on GPT-735M: PyTorch (bench/torch_anchor.py: DTensor TP,
# Schedule1F1B, FSDP2) beside tessera's drivers (tessera_bench_tp/_pp/_fsdp); each section one run of
# bench/results/gpt735m (probes for nocomm, emulated, pp_emulated and, with NPROC=1, <section>-one-rank), with both
# systems' 1-GPU rows (pytorch-single, tessera-single) as the scaling references.
#   bench/parallel.sh BUILD_DIR LOG_DIR [--smoke] [tp] [pp] [fsdp] [nocomm] [emulated] [pp_emulated]  (default tp pp fsdp)
# Sections (their runs: the case below): tp (plain, sp, no overlap; TP_VARIANTS in process), pp (PP_RUNS), fsdp
# (FSDP_BUDGETS MiB of prefetch), nocomm (one process as rank 0 of TESSERA_FAKE_WORLD=2: a parallel step's cost
# besides communication), emulated (the same, communication timed by a model: TESSERA_FAKE_COMM_*,
# bench/common/fake_world.h), pp_emulated (2 stages predicted from unit costs measured on one GPU, --emulate 2).
# --smoke: a tiny model (D=256 L=4 V=512 T=64 STEPS=2), tessera's runs only, the results in LOG_DIR.
# Env: NPROC (2), RUN_TIMEOUT (s per run, 120), SINGLE_VARIANTS (base), DDP_VARIANTS, TP_VARIANTS,
# EMU_TP_VARIANTS, FSDP_BUDGETS ("0 256 512 1024 2048"), PP_RUNS ("mb8 mb16 extra nofuse paramsplit
# interleaved"), PP_EXTRA (2), RESULTS (bench/results), SUITE, and D/L/V/T/STEPS passed through.
# Exit status 0 when every run produced its row (the results hold what ran).
set -uo pipefail
BUILD=${1:?build dir}
LOGS=${2:?log dir}
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
SMOKE=0 SECTIONS=()
for a in "$@"; do
  case $a in
    --smoke) SMOKE=1 ;;
    tp | pp | fsdp | nocomm | emulated | pp_emulated) SECTIONS+=("$a") ;;
    *) echo "parallel.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
[ ${#SECTIONS[@]} -eq 0 ] && SECTIONS=(tp pp fsdp)
NPROC=${NPROC:-2}
PP_RUNS_SET=${PP_RUNS:+1}
PP_RUNS=${PP_RUNS:-mb8 mb16 extra nofuse paramsplit interleaved}
PP_EXTRA=${PP_EXTRA:-2}
TP_VARIANTS=${TP_VARIANTS:-base,chunks2,chunks4,carve16,carve24,chunks2+carve16,chunks4+carve16,chunks2+carve24,ring+carve16}
EMU_TP_VARIANTS_SET=${EMU_TP_VARIANTS:+1}
EMU_TP_VARIANTS=${EMU_TP_VARIANTS:-base,carve16,chunks2+carve16,ring,ring+carve16}
FAKE_DDP_VARIANTS=${DDP_VARIANTS:-base,view,fused,view+fused,bf16}  # nocomm and emulated
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
RESULTS=${RESULTS:-$HERE/results}
if [ $SMOKE = 1 ]; then
  export D=${D:-256} L=${L:-4} V=${V:-512} T=${T:-64} STEPS=${STEPS:-2}
  RESULTS=$LOGS
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$LOGS" "$RESULTS"
rc=0
logs=()
BENCH="parallel bench"
source "$HERE/run_lib.sh"  # run NAME CMD..., torchrun_cmd, machine
torchrun_cmd  # TORCHRUN=(torchrun --standalone [-r 1 -t 1 under torch 1.x])
torch_run() { local name=$1 n=$2 mode=$3; [ $SMOKE = 1 ] || run "$name" "${TORCHRUN[@]}" --nproc_per_node="$n" "$HERE/torch_anchor.py" "$mode"; }
tessera_run() { local name=$1 bin=$2; shift 2; run "$name" "${TORCHRUN[@]}" --nproc_per_node="$NPROC" --no_python "$BUILD/bench/$bin" "$@"; }

B=8 torch_run pytorch-single 1 single
B=8 run tessera-single "$BUILD/bench/tessera_bench_ddp" single --variants "${SINGLE_VARIANTS:-base}"
singles=("${logs[@]}")
declare -A section_logs
for s in "${SECTIONS[@]}"; do
  logs=()
  case $s in
    tp)
      B=16 torch_run pytorch-tp "$NPROC" tp
      # In-process variants (tp_bench.cpp): forward in pieces (chunksN), SMs kept free of the
      # GEMMs beside a collective (carveN), the row layers' forward reduced by a ring (ring).
      B=16 tessera_run tessera-tp tessera_bench_tp --variants "$TP_VARIANTS"
      B=16 tessera_run tessera-tp-sp tessera_bench_tp --sp --variants "$TP_VARIANTS"
      B=16 tessera_run tessera-tp-nooverlap tessera_bench_tp --no-overlap ;;
    pp)  # mbN: PyTorch's and tessera's 1F1B in N micro-batches; extra: PP_EXTRA more warm-up forwards on the first
      # stage; paramsplit: blocks split evenly (PyTorch's L/pp) instead of by compute; nofuse: autograd's weight
      # gradients; interleaved: interleaved 1F1B
      for p in $PP_RUNS; do
        case $p in
          mb8) B=16 MB=8 torch_run pytorch-pp-mb8 "$NPROC" pp
               B=16 MB=8 tessera_run tessera-pp-1F1B-mb8 tessera_bench_pp ;;
          mb16) B=32 MB=16 torch_run pytorch-pp-mb16 "$NPROC" pp
                B=32 MB=16 tessera_run tessera-pp-1F1B-mb16 tessera_bench_pp ;;
          extra) B=32 MB=16 EXTRA_WARMUP=$PP_EXTRA tessera_run "tessera-pp-1F1B-mb16-extra$PP_EXTRA" tessera_bench_pp
                 B=16 MB=8 EXTRA_WARMUP=$PP_EXTRA tessera_run "tessera-pp-1F1B-mb8-extra$PP_EXTRA" tessera_bench_pp ;;
          paramsplit) B=32 MB=16 PARTITION=params tessera_run tessera-pp-1F1B-mb16-paramsplit tessera_bench_pp ;;
          nofuse) B=32 MB=16 FUSED_WGRAD=0 tessera_run tessera-pp-1F1B-mb16-nofuse tessera_bench_pp ;;
          interleaved) B=32 MB=16 tessera_run tessera-pp-interleaved-1F1B-mb16 tessera_bench_pp --interleaved ;;
          *) echo "parallel.sh: unknown PP_RUNS entry $p" >&2; rc=1 ;;
        esac
      done ;;
    fsdp)
      B=8 torch_run pytorch-fsdp "$NPROC" fsdp
      for m in ${FSDP_BUDGETS:-0 256 512 1024 2048}; do
        B=8 tessera_run "tessera-fsdp-prefetch$m" tessera_bench_fsdp --prefetch-mib "$m"
      done ;;
    nocomm)  # one process each, as rank 0 of a world of 2 that does not communicate. PyTorch's DDP fails on the
      # fake group (its all-reduce future yields None to DDP's comm hook) and DTensor TP on it does not measure
      # its machinery: both left out
      fake=(env TESSERA_FAKE_WORLD=2)
      B=8 run tessera-ddp-nocomm "${fake[@]}" "$BUILD/bench/tessera_bench_ddp" tessera \
        --variants "$FAKE_DDP_VARIANTS"
      B=16 run tessera-tp-nocomm "${fake[@]}" "$BUILD/bench/tessera_bench_tp"
      B=16 run tessera-tp-sp-nocomm "${fake[@]}" "$BUILD/bench/tessera_bench_tp" --sp
      [ $SMOKE = 1 ] || B=8 run pytorch-fsdp-nocomm "${fake[@]}" python3 "$HERE/torch_anchor.py" fsdp
      for m in 0 512; do
        B=8 run "tessera-fsdp-prefetch$m-nocomm" "${fake[@]}" "$BUILD/bench/tessera_bench_fsdp" --prefetch-mib "$m"
      done ;;
    emulated)  # as nocomm, the fake communicator timed (each op takes a modelled network's time on its own stream);
      # -keepdone: TESSERA_FAKE_COMM_KEEP=done, every op's tensors kept until it completes
      fake=(env TESSERA_FAKE_WORLD=2 TESSERA_FAKE_COMM_TIMED=1)
      for m in 512 0; do
        B=8 run "tessera-fsdp-prefetch$m-emulated" "${fake[@]}" "$BUILD/bench/tessera_bench_fsdp" --prefetch-mib "$m"
      done
      [ $SMOKE = 1 ] || B=8 run tessera-fsdp-prefetch512-emulated-keepdone "${fake[@]}" TESSERA_FAKE_COMM_KEEP=done \
        "$BUILD/bench/tessera_bench_fsdp" --prefetch-mib 512
      B=8 run tessera-ddp-emulated "${fake[@]}" "$BUILD/bench/tessera_bench_ddp" tessera \
        --variants "$FAKE_DDP_VARIANTS"
      B=16 run tessera-tp-sp-emulated "${fake[@]}" "$BUILD/bench/tessera_bench_tp" --sp --variants "$EMU_TP_VARIANTS"
      B=16 run tessera-tp-emulated "${fake[@]}" "$BUILD/bench/tessera_bench_tp" --variants "$EMU_TP_VARIANTS" ;;
    pp_emulated)  # one process, the units timed, the 2-stage schedule simulated
      B=32 MB=16 EXTRA_WARMUP=$PP_EXTRA run tessera-pp-mb16-emulated "$BUILD/bench/tessera_bench_pp" --emulate 2
      B=16 MB=8 EXTRA_WARMUP=$PP_EXTRA run tessera-pp-mb8-emulated "$BUILD/bench/tessera_bench_pp" --emulate 2 ;;
  esac
  section_logs[$s]="${logs[*]}"
done

# One run per section: its rows beside the two 1-GPU references.
title() {
  case $1 in
    tp) echo "Tensor parallel: tessera beside PyTorch DTensor TP" ;;
    pp) echo "Pipeline parallel: tessera beside torch.distributed.pipelining" ;;
    fsdp) echo "FSDP: tessera beside PyTorch FSDP2" ;;
    nocomm) echo "One GPU as rank 0 of 2, no communication (TESSERA_FAKE_WORLD=2)" ;;
    emulated) echo "One GPU as rank 0 of 2, communication emulated (TESSERA_FAKE_COMM_TIMED=1)" ;;
    pp_emulated) echo "A 2-stage pipeline predicted on one GPU from unit costs" ;;
  esac
}
declare -A columns=(
  [tp]=scaling,overhead_ms,forward_chunks,sm_carveout
  [pp]=scaling,overhead_ms,fused_wgrad,extra_warmup,peak_mem_GiB_per_rank,peak_in_flight_per_rank
  [fsdp]=scaling,prefetch_budget_MiB,peak_unsharded_units,peak_unsharded_GiB,mem_before_backward_GiB
  [nocomm]=scaling,fake_world,overhead_ms,fused_wgrad,mem_before_backward_GiB
  [emulated]=scaling,fake_world,overhead_ms,fused_wgrad,forward_chunks,prefetch_budget_MiB
  [pp_emulated]=scaling,extra_warmup,layers_per_stage,pipeline_ms,optimizer_ms,sequential_step_ms)
command="$([ "$NPROC" != 2 ] && echo "NPROC=$NPROC ")$(env | grep -E '^TESSERA_FAKE_COMM_' | sort | tr '\n' ' ')${EMU_TP_VARIANTS_SET:+EMU_TP_VARIANTS=\"$EMU_TP_VARIANTS\" }${PP_RUNS_SET:+PP_RUNS=\"$PP_RUNS\" }${SINGLE_VARIANTS:+SINGLE_VARIANTS=\"$SINGLE_VARIANTS\" }${DDP_VARIANTS:+DDP_VARIANTS=\"$DDP_VARIANTS\" }${FSDP_BUDGETS:+FSDP_BUDGETS=\"$FSDP_BUDGETS\" }bench/parallel.sh $BUILD $LOGS $*"
model=735m
[ "${D:-2048} ${L:-12} ${V:-32000}" = "2048 12 32000" ] || model="gpt D=${D} L=${L} V=${V}"
precision=fp32
nvidia-smi -L >/dev/null 2>&1 && precision=bf16
for s in "${SECTIONS[@]}"; do
  read -ra sec <<<"${section_logs[$s]}"
  # The one-GPU probes, and a layout of one rank (NPROC=1: its cost alone), are probes; the rest gpt735m's runs.
  case $s in nocomm | emulated | pp_emulated) suite=${SUITE:-probes} n=1 run=$s ;; *) suite=${SUITE:-gpt735m} n=$NPROC run=$s ;; esac
  [ "$NPROC" = 1 ] && [ "$suite" = gpt735m ] && suite=${SUITE:-probes} run=$s-one-rank
  python3 "$HERE/results.py" gpt "${singles[@]}" "${sec[@]}" --suite "$suite" --run "$run" --results "$RESULTS" \
    --machine "$(machine "$n")" --environment "$(environment)" --command "$command" --title "$(title "$s")" \
    --config "D=${D:-2048} L=${L:-12} V=${V:-32000} T=${T:-1024} STEPS=${STEPS:-10}" --model "$model" \
    --seq-len "${T:-1024}" --precision "$precision" --columns "${columns[$s]}" >/dev/null || rc=1
  echo "=== parallel bench: wrote run $run of $RESULTS/$suite.{json,md}"
done
exit $rc
