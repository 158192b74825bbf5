#!/usr/bin/env bash
# The benchmark binaries on a tiny GPT (CPU and Gloo here, 2 ranks under torchrun), checked
# against each other. Every driver builds src/models' GPT from the same seed, so:
#   first losses (before any update, same batch): tessera_bench_ddp single = tp (all variants) at
#        B=4 = PyTorch's anchor GPT from tessera's weights (tests/bench/anchor_loss.py); single = pp
#        (all variants) at B=8; single = the ddp probe's rank 0 at B=2 (the fsdp probe's: a number)
#   last losses (after STEPS steps, same model and data):
#   tp:  plain, sequence parallel, no backward overlap, forward in pieces (plain and sequence
#        parallel)
#   pp:  1F1B split by compute, 1F1B split evenly (PARTITION=params), GPipe, interleaved 1F1B,
#        FUSED_WGRAD=0, 1F1B with 2 extra warm-up forwards, an explicit LAYERS split
#   fsdp: prefetch off and prefetch with a budget
# and the TESSERA_FAKE_WORLD=2 probe (bench/common/fake_world.h) of ddp (with its variants), tp and
# fsdp: one process each, every RESULT line marked "fake_world": 2 and its system "-nocomm"; the
# one-process pipeline prediction (--emulate 2): three rows, every one marked "-emulated"; the old
# variable names (FAKE_WORLD, PP_EMULATE) and malformed values refused with the variable named.
# A run that fails, prints no RESULT or disagrees (relative 1e-5; the sums run in other orders, a
# wrong gradient is off by far more) fails the test (exit 1).
#   bench_smoke.sh BUILD_DIR
set -uo pipefail
BUILD=${1:?build dir}
HERE=$(cd "$(dirname "$0")" && pwd)
export D=256 L=4 V=512 T=32 STEPS=2 TESSERA_TIMEOUT_S=60 OMP_NUM_THREADS=1
# torchrun's agent polls its workers every 0.1 s (PET_MONITOR_INTERVAL; its default of 5 s adds up to
# 5 s to every launch).
export PET_MONITOR_INTERVAL=${PET_MONITOR_INTERVAL:-0.1}
LAUNCH=(torchrun --standalone --nproc_per_node=2 --no_python)
tr_python=$(head -1 "$(command -v torchrun)" 2>/dev/null | sed -n 's/^#! *//p')
PY=${tr_python:-python3}  # torchrun's interpreter: it has torch
[ "$("$PY" -c 'import torch;print(torch.__version__.split(".")[0])' 2>/dev/null)" = 1 ] && LAUNCH+=(-r 1 -t 1)
# The 2-rank runs start under TESSERA_BENCH_LAUNCHER: torchrun (the default), or mpirun where tessera
# has PMIx (tests/bench/CMakeLists.txt picks it: 0.5 s per launch against torchrun 1.13's 4 to 8 s).
case ${TESSERA_BENCH_LAUNCHER:-torchrun} in
  torchrun) ;;
  mpirun) LAUNCH=(mpirun --allow-run-as-root --oversubscribe -np 2) ;;
  *) echo "FAIL TESSERA_BENCH_LAUNCHER=$TESSERA_BENCH_LAUNCHER: expected torchrun or mpirun"; exit 1 ;;
esac
rc=0
# losses NAME ENV... -- CMD...: "LAST FIRST" of the first RESULT line (rank 0's), or "nan nan".
losses() {
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local out r l f
  out=$(env "${envs[@]}" timeout -k 10 120 "$@" 2>&1)
  r=$?
  l=$(grep -o '"last_loss": [0-9.eE+-]*' <<<"$out" | head -1 | awk '{print $2}')
  f=$(grep -o '"first_loss": [0-9.eE+-]*' <<<"$out" | head -1 | awk '{print $2}')
  if [ $r -ne 0 ] || [ -z "$l" ] || [ -z "$f" ]; then
    echo "FAIL $name: exit $r, no losses; output tail:" >&2
    tail -15 <<<"$out" >&2
    rc=1
    echo nan nan
    return
  fi
  echo "$name: first_loss $f last_loss $l" >&2
  echo "$l $f"
}
two() { local name=$1; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  losses "$name" "${envs[@]}" -- "${LAUNCH[@]}" "$BUILD/bench/$@"; }
one() { local name=$1; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  losses "$name" "${envs[@]}" -- "$BUILD/bench/$@"; }
same() {  # same WHAT A B...: all finite and equal to 1e-5 relative
  local what=$1; shift
  if "$PY" - "$@" <<'PY'
import math, sys
v = [float(x) for x in sys.argv[1:]]
sys.exit(0 if all(math.isfinite(x) for x in v) and max(v) - min(v) <= 1e-5 * abs(v[0]) else 1)
PY
  then echo "ok   $what: $*"; else echo "FAIL $what: losses differ: $*"; rc=1; fi
}
# One process, the whole model: the reference first losses at B = 2, 4, 8.
read -r _ s2 <<<"$(one single-b2 B=2 -- tessera_bench_ddp single)"
read -r _ s4 <<<"$(one single-b4 B=4 -- tessera_bench_ddp single)"
read -r _ s8 <<<"$(one single-b8 B=8 -- tessera_bench_ddp single)"
anchor=$(B=4 timeout -k 10 120 "$PY" "$HERE/anchor_loss.py" 2>&1) || { echo "FAIL anchor_loss.py: $anchor"; anchor=nan; rc=1; }
same "first loss, B=4: tessera's single-process model / PyTorch's anchor GPT from tessera's weights" "$s4" "$anchor"

read -r a fa <<<"$(two tp B=4 -- tessera_bench_tp)"
read -r b fb <<<"$(two tp-sp B=4 -- tessera_bench_tp --sp)"
read -r c fc <<<"$(two tp-nooverlap B=4 -- tessera_bench_tp --no-overlap)"
read -r d fd <<<"$(two tp-chunks3 B=4 -- tessera_bench_tp --variants chunks3+carve8)"
read -r e fe <<<"$(two tp-sp-chunks2 B=4 -- tessera_bench_tp --sp --variants chunks2)"
same "tp first loss = single's: plain / sequence parallel / no overlap / pieces (plain, sp)" "$s4" "$fa" "$fb" "$fc" "$fd" "$fe"
same "tp: plain / sequence parallel / no overlap / forward in pieces (plain, sp)" "$a" "$b" "$c" "$d" "$e"

read -r a fa <<<"$(two pp-1f1b B=8 MB=4 -- tessera_bench_pp)"
read -r b fb <<<"$(two pp-evensplit B=8 MB=4 PARTITION=params -- tessera_bench_pp)"
read -r c fc <<<"$(two pp-gpipe B=8 MB=4 -- tessera_bench_pp --gpipe)"
read -r d fd <<<"$(two pp-interleaved B=8 MB=4 -- tessera_bench_pp --interleaved)"
read -r e fe <<<"$(two pp-nofuse B=8 MB=4 FUSED_WGRAD=0 -- tessera_bench_pp)"
read -r f ff <<<"$(two pp-extra2 B=8 MB=4 EXTRA_WARMUP=2 -- tessera_bench_pp)"
read -r g fg <<<"$(two pp-layers B=8 MB=4 LAYERS=3,1 -- tessera_bench_pp)"
read -r h fh <<<"$(two pp-zb B=8 MB=4 -- tessera_bench_pp --zb-h1)"
same "pp first loss = single's: 1F1B / even split / GPipe / interleaved / autograd's sums / extra warm-up / LAYERS / ZB-H1" \
  "$s8" "$fa" "$fb" "$fc" "$fd" "$fe" "$ff" "$fg" "$fh"
same "pp: 1F1B / even split / GPipe / interleaved / autograd's weight-gradient sums / extra warm-up / LAYERS / ZB-H1" \
  "$a" "$b" "$c" "$d" "$e" "$f" "$g" "$h"

read -r a _ <<<"$(two fsdp-noprefetch B=2 -- tessera_bench_fsdp --prefetch-mib 0)"
read -r b _ <<<"$(two fsdp-prefetch B=2 -- tessera_bench_fsdp --prefetch-mib 64)"
same "fsdp: no prefetch / prefetch" "$a" "$b"

probe() {  # probe NAME BIN ARGS...: the one-process probe runs and marks each of its N lines; echoes rank 0's first loss
  local name=$1; shift
  local out r
  out=$(TESSERA_FAKE_WORLD=2 B=2 timeout -k 10 120 "$BUILD/bench/$@" 2>&1)
  r=$?
  local lines marked
  lines=$(grep -c '^RESULT ' <<<"$out")
  marked=$(grep '^RESULT ' <<<"$out" | grep -c '"system": "[^"]*-nocomm".*"fake_world": 2,')
  if [ $r -eq 0 ] && [ "$lines" -gt 0 ] && [ "$lines" = "$marked" ]; then
    echo "ok   probe $name: $lines line(s) marked fake_world 2" >&2
  else
    echo "FAIL probe $name: exit $r, $lines RESULT line(s), $marked marked; output tail:" >&2
    tail -15 <<<"$out" >&2
    rc=1
  fi
  grep -o '"first_loss": [0-9.eE+-]*' <<<"$out" | head -1 | awk '{print $2}'
}
pd=$(probe ddp tessera_bench_ddp tessera --variants base,view+fused,fused+bf16,view+fused+optov)
probe tp-sp tessera_bench_tp --sp >/dev/null
pf=$(probe fsdp tessera_bench_fsdp --prefetch-mib 64)
# DDP's probe runs the whole model, so its first loss is single's; FSDP's gathers fake shards (the
# fake all-gather cannot know the other rank's values, bench/common/fake_world.h), so its loss is
# only checked to be a number.
same "first loss, B=2: single / rank 0 of the ddp probe" "$s2" "${pd:-nan}"
if [[ $pf =~ ^[0-9]+\.[0-9]+$ ]]; then echo "ok   fsdp probe: first loss $pf"; else echo "FAIL fsdp probe: first loss '$pf'"; rc=1; fi

out=$(EXTRA_WARMUP=2 B=8 MB=4 timeout -k 10 120 "$BUILD/bench/tessera_bench_pp" --emulate 2 2>&1)
r=$?
rows=$(grep -c '^RESULT {"system": "tessera-pp-1F1B-mb4-[^"]*emulated"' <<<"$out")
if [ $r -eq 0 ] && [ "$rows" = 3 ]; then
  echo "ok   pp emulation: 3 rows marked emulated"
else
  echo "FAIL pp emulation: exit $r, $rows emulated row(s); output tail:"
  tail -15 <<<"$out"
  rc=1
fi
out=$(B=8 MB=4 timeout -k 10 120 "$BUILD/bench/tessera_bench_pp" --emulate 2 --zb-h1 2>&1)
r=$?
rows=$(grep -c '^RESULT {"system": "tessera-pp-ZB-H1-mb4-[^"]*emulated"' <<<"$out")
if [ $r -eq 0 ] && [ "$rows" = 2 ] && grep -q ' W [0-9.]* ms (mean)' <<<"$out"; then
  echo "ok   pp emulation, ZB-H1: 2 rows marked emulated, W priced"
else
  echo "FAIL pp emulation, ZB-H1: exit $r, $rows emulated row(s); output tail:"
  tail -15 <<<"$out"
  rc=1
fi

refused() {  # refused WANT ENV... -- BIN ARGS...: exits non-zero at once, saying WANT
  local want=$1; shift
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local out
  if out=$(env "${envs[@]}" timeout -k 5 60 "$BUILD/bench/$@" 2>&1); then
    echo "FAIL ${envs[*]} $*: accepted"; rc=1
  elif grep -qF "$want" <<<"$out"; then
    echo "ok   refused ${envs[*]}: $(grep -F "$want" <<<"$out" | head -1 | cut -c1-150)"
  else
    echo "FAIL ${envs[*]} $*: refused without naming '$want': $(tail -3 <<<"$out")"; rc=1
  fi
}
refused "FAKE_WORLD is now TESSERA_FAKE_WORLD" FAKE_WORLD=2 -- tessera_bench_fsdp
refused "PP_EMULATE is now" PP_EMULATE=2 -- tessera_bench_pp
refused "TESSERA_FAKE_COMM_BUSBW_GBPS=fast" TESSERA_FAKE_WORLD=2 TESSERA_FAKE_COMM_BUSBW_GBPS=fast -- tessera_bench_tp
refused "TESSERA_FAKE_COMM_KEEP=forever" TESSERA_FAKE_WORLD=2 TESSERA_FAKE_COMM_KEEP=forever -- tessera_bench_ddp tessera
refused "needs a CUDA device" TESSERA_FAKE_WORLD=2 TESSERA_FAKE_COMM_TIMED=1 -- tessera_bench_fsdp
[ $rc -eq 0 ] && echo "bench smoke: all variants agree" || echo "bench smoke: FAILED"
exit $rc
