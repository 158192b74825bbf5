#!/usr/bin/env bash
# Tensor, pipeline and fully sharded data parallelism on this machine's GPUs: the anchors' GPT-735M
# trained by PyTorch (bench/torch_anchor.py: DTensor TP, pipelining Schedule1F1B, FSDP2) and by
# tessera (tessera_bench_tp / _pp / _fsdp), side by side with each system's 1-GPU run, then one run per
# section (bench/results.py gpt, the run named after the section, with the two 1-GPU rows its rows are
# scaled against) in bench/results/gpt735m.{json,md}; nocomm, emulated and pp_emulated in probes.{json,md}.
#   bench/parallel.sh BUILD_DIR LOG_DIR [tp] [pp] [fsdp] [nocomm] [emulated] [pp_emulated]   (default: tp pp fsdp)
#   bench/parallel.sh BUILD_DIR LOG_DIR --smoke [tp] [pp] [fsdp] [nocomm] [emulated] [pp_emulated]
# Runs, in order, each under `timeout` (a failed run leaves its row out, the rest go on):
#   pytorch-single, tessera-single (B=8, 1 GPU; the scaling reference of each system);
#   tp:   pytorch-tp, tessera-tp, tessera-tp-sp (each with the in-process variants TP_VARIANTS:
#         forward pieces chunksN, SM carveouts carveN, the row layers' ring reduction ring), tessera-tp-nooverlap (B=16 shared by NPROC GPUs);
#   pp:   pytorch-pp-mb8 (B=16), pytorch-pp-mb16 (B=32), tessera-pp-1F1B-mb8, -mb16 (stages balanced
#         by compute), -mb16-nofuse (weight gradients accumulated by autograd), -mb16-paramsplit (blocks split evenly, PARTITION=params: PyTorch's L/pp), interleaved-1F1B-mb16,
#         -mb16-extraK / -mb8-extraK (1F1B with K = PP_EXTRA (2) extra warm-up forwards on the first stage);
#   fsdp: pytorch-fsdp, tessera-fsdp-prefetch{0,256,512,1024,2048} (B=8 per GPU; MiB of budget);
#   nocomm: the one-GPU probe without communication (bench/common/fake_world.h; one process as rank 0
#         of TESSERA_FAKE_WORLD=2, PyTorch on its "fake" process group): pytorch-fsdp-nocomm,
#         tessera-ddp-nocomm (variants DDP_VARIANTS), tessera-tp[-sp]-nocomm, tessera-fsdp-prefetch{0,512}-nocomm;
#         what each system's parallel step costs on one GPU besides communication (runs on 1 GPU).
#   emulated: tessera's nocomm runs again with the fake communicator timed (TESSERA_FAKE_COMM_TIMED=1,
#         src/comm/fake/fake_timing.h: each op takes a modelled network's time on a stream of its own),
#         TP in the variants EMU_TP_VARIANTS (base,carve16,chunks2+carve16,ring,ring+carve16), and tessera-fsdp-prefetch512-emulated-keepdone
#         (TESSERA_FAKE_COMM_KEEP=done: the communicator keeps every op's tensors until it completes, as before
#         FSDP kept its own): the schedule's exposed communication and buffer lifetimes on one GPU.
#   pp_emulated: the 2-stage pipeline predicted from unit costs measured on one GPU (--emulate 2,
#         bench/pp/pp_emulate.h), batch 32 in 16 and 16 in 8: tessera-pp-1F1B-mb16/-mb8-...-emulated.
#         PyTorch's DDP and DTensor TP are left out: its DDP fails on the fake group (the group's
#         all-reduce future yields None to DDP's comm hook) and DTensor TP on it took 197 ms a step
#         against 127 ms on two real GPUs (H200, 2026-11-23): not a measure of its machinery.
# --smoke: tiny model (D=256 L=4 V=512 T=64 STEPS=2) on whatever is there (CPU and Gloo without
# GPUs), tessera's runs only, results to LOG_DIR: checks that the binaries run end to end.
# Env: NPROC (2), RUN_TIMEOUT (s per run, 120), FSDP_BUDGETS ("0 256 512 1024 2048"),
# SINGLE_VARIANTS (tessera-single's in-process variants, ddp_bench.cpp: "base"; e.g. base,fused),
# DDP_VARIANTS (nocomm, emulated: "base,view,fused,view+fused,bf16"), EMU_TP_VARIANTS (emulated),
# TESSERA_FAKE_COMM_* (emulated: the communication model, bench/common/fake_world.h),
# PP_RUNS ("mb8 mb16 extra nofuse paramsplit interleaved": which pp runs; mb8/mb16 are PyTorch's and
# tessera's; extra is tessera's mb16 and mb8 with PP_EXTRA extra warm-up forwards; nofuse is
# tessera's mb16 with at::linear's weight gradients, FUSED_WGRAD=0),
# RESULTS (dir for the results, default bench/results), SUITE (gpt735m; probes for the one-GPU sections and
# for NPROC=1, whose runs are named <section>-one-rank),
# D/L/V/T/STEPS passed through.
# Exit status: 0 when every run produced its row, 1 otherwise (the results hold what ran).
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
    pp)
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
    nocomm)  # one process each, as rank 0 of a world of 2 that does not communicate
      fake=(env TESSERA_FAKE_WORLD=2)
      B=8 run tessera-ddp-nocomm "${fake[@]}" "$BUILD/bench/tessera_bench_ddp" tessera \
        --variants "$FAKE_DDP_VARIANTS"
      B=16 run tessera-tp-nocomm "${fake[@]}" "$BUILD/bench/tessera_bench_tp"
      B=16 run tessera-tp-sp-nocomm "${fake[@]}" "$BUILD/bench/tessera_bench_tp" --sp
      [ $SMOKE = 1 ] || B=8 run pytorch-fsdp-nocomm "${fake[@]}" python3 "$HERE/torch_anchor.py" fsdp
      for m in 0 512; do
        B=8 run "tessera-fsdp-prefetch$m-nocomm" "${fake[@]}" "$BUILD/bench/tessera_bench_fsdp" --prefetch-mib "$m"
      done ;;
    emulated)  # as nocomm, the fake communicator timed
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
