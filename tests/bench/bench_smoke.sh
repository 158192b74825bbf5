#!/usr/bin/env bash
# The benchmark binaries on a tiny GPT (CPU and Gloo here, 2 ranks under torchrun), checked
# against each other: variants of one parallelism train the same model on the same data, so
# after STEPS steps their losses must agree:
#   tp:  plain, sequence parallel, no backward overlap, forward in pieces (plain and sequence
#        parallel)                                               (same full weights, same batch)
#   pp:  1F1B split by compute, 1F1B split by parameters, GPipe, interleaved 1F1B, FUSED_WGRAD=0,
#        1F1B with 2 extra warm-up forwards, an explicit LAYERS split
#   fsdp: prefetch off and prefetch with a budget
# and the FAKE_WORLD=2 probe (bench/common/fake_world.h) of ddp (with its variants), tp and fsdp:
# one process each, every RESULT line marked "fake_world": 2 and its system "-nocomm"; and the
# one-process pipeline prediction (PP_EMULATE=2): three rows, every one marked "-emulated".
# A variant that fails, prints no RESULT or disagrees (relative 1e-5; the sums run in other
# orders, a wrong gradient is off by far more) fails the test (exit 1).
#   bench_smoke.sh BUILD_DIR
set -uo pipefail
BUILD=${1:?build dir}
export D=256 L=4 V=512 T=32 STEPS=2 TESSERA_TIMEOUT_S=60 OMP_NUM_THREADS=1
TORCHRUN=(torchrun --standalone --nproc_per_node=2 --no_python)
tr_python=$(head -1 "$(command -v torchrun)" 2>/dev/null | sed -n 's/^#! *//p')
[ "$(${tr_python:-python3} -c 'import torch;print(torch.__version__.split(".")[0])' 2>/dev/null)" = 1 ] && TORCHRUN+=(-r 1 -t 1)
rc=0
loss() {  # loss NAME ENV... -- BIN ARGS...: the last_loss of rank 0's RESULT line
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local out
  out=$(env "${envs[@]}" timeout -k 10 120 "${TORCHRUN[@]}" "$BUILD/bench/$@" 2>&1)
  local r=$?
  local l
  l=$(grep -o '"last_loss": [0-9.eE+-]*' <<<"$out" | head -1 | awk '{print $2}')
  if [ $r -ne 0 ] || [ -z "$l" ]; then
    echo "FAIL $name: exit $r, no loss; output tail:" >&2
    tail -15 <<<"$out" >&2
    rc=1
    echo nan
    return
  fi
  echo "$name: last_loss $l" >&2
  echo "$l"
}
same() {  # same WHAT A B...: all equal to 1e-4 relative
  local what=$1; shift
  if python3 - "$@" <<'PY'
import math, sys
v = [float(x) for x in sys.argv[1:]]
sys.exit(0 if all(math.isfinite(x) for x in v) and max(v) - min(v) <= 1e-5 * abs(v[0]) else 1)
PY
  then echo "ok   $what: $*"; else echo "FAIL $what: losses differ: $*"; rc=1; fi
}
a=$(loss tp B=4 -- tessera_bench_tp)
b=$(loss tp-sp B=4 -- tessera_bench_tp --sp)
c=$(loss tp-nooverlap B=4 -- tessera_bench_tp --no-overlap)
d=$(loss tp-chunks3 B=4 -- tessera_bench_tp --variants chunks3+carve8)
e=$(loss tp-sp-chunks2 B=4 -- tessera_bench_tp --sp --variants chunks2)
same "tp: plain / sequence parallel / no overlap / forward in pieces (plain, sp)" "$a" "$b" "$c" "$d" "$e"
a=$(loss pp-1f1b B=8 MB=4 -- tessera_bench_pp)
b=$(loss pp-paramsplit B=8 MB=4 PARTITION=params -- tessera_bench_pp)
c=$(loss pp-gpipe B=8 MB=4 -- tessera_bench_pp --gpipe)
d=$(loss pp-interleaved B=8 MB=4 -- tessera_bench_pp --interleaved)
e=$(loss pp-nofuse B=8 MB=4 FUSED_WGRAD=0 -- tessera_bench_pp)
f=$(loss pp-extra2 B=8 MB=4 EXTRA_WARMUP=2 -- tessera_bench_pp)
g=$(loss pp-layers B=8 MB=4 LAYERS=3,1 -- tessera_bench_pp)
same "pp: 1F1B / parameter split / GPipe / interleaved / autograd's weight-gradient sums / extra warm-up / LAYERS" \
  "$a" "$b" "$c" "$d" "$e" "$f" "$g"
a=$(loss fsdp-noprefetch B=2 -- tessera_bench_fsdp --prefetch-mib 0)
b=$(loss fsdp-prefetch B=2 -- tessera_bench_fsdp --prefetch-mib 64)
same "fsdp: no prefetch / prefetch" "$a" "$b"
probe() {  # probe NAME BIN ARGS...: the one-process probe runs and marks each of its N lines
  local name=$1; shift
  local out r
  out=$(FAKE_WORLD=2 B=2 timeout -k 10 120 "$BUILD/bench/$@" 2>&1)
  r=$?
  local lines marked
  lines=$(grep -c '^RESULT ' <<<"$out")
  marked=$(grep '^RESULT ' <<<"$out" | grep -c '"system": "[^"]*-nocomm".*"fake_world": 2,')
  if [ $r -eq 0 ] && [ "$lines" -gt 0 ] && [ "$lines" = "$marked" ]; then
    echo "ok   probe $name: $lines line(s) marked fake_world 2"
  else
    echo "FAIL probe $name: exit $r, $lines RESULT line(s), $marked marked; output tail:"
    tail -15 <<<"$out"
    rc=1
  fi
}
probe ddp tessera_bench_ddp tessera --variants base,view+fused,fused+bf16,view+fused+optov
probe tp-sp tessera_bench_tp --sp
probe fsdp tessera_bench_fsdp --prefetch-mib 64
out=$(PP_EMULATE=2 EXTRA_WARMUP=2 B=8 MB=4 timeout -k 10 120 "$BUILD/bench/tessera_bench_pp" 2>&1)
r=$?
rows=$(grep -c '^RESULT {"system": "tessera-pp-1F1B-mb4-[^"]*emulated"' <<<"$out")
if [ $r -eq 0 ] && [ "$rows" = 3 ]; then
  echo "ok   pp emulation: 3 rows marked emulated"
else
  echo "FAIL pp emulation: exit $r, $rows emulated row(s); output tail:"
  tail -15 <<<"$out"
  rc=1
fi
[ $rc -eq 0 ] && echo "bench smoke: all variants agree" || echo "bench smoke: FAILED"
exit $rc
