#!/usr/bin/env bash
# One Python test: a pytest file on N ranks under torchrun (Gloo), or (expect_fail) the
# harness check that a failing rank ends the launch. Exit 0 pass, 1 fail.
#
#   run_pytest.sh <python> <nproc> <expected passed per rank> <file.py>
#   run_pytest.sh <python> <nproc> expect_fail <script.py>
#
# Pass only when every rank's pytest summary says exactly "<expected> passed" (no failed,
# error, skipped, xfailed), so a test file that collects nothing or skips cannot pass.
# The whole launch runs under `timeout`; a failing rank makes torchrun stop the others.
set -uo pipefail

PY=$1 NPROC=$2 EXPECT=$3 FILE=$4
LIMIT=${TESSERA_PYTEST_TIMEOUT_S:-240}
export TESSERA_TIMEOUT_S=${TESSERA_TIMEOUT_S:-60}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# torchrun's agent polls its workers every 0.1 s (PET_MONITOR_INTERVAL; its default of 5 s adds up to
# 5 s to every launch).
export PET_MONITOR_INTERVAL=${PET_MONITOR_INTERVAL:-0.1}
# A GPU file (TESSERA_PYTEST_NEED_GPUS=n): skipped (exit 77, ctest SKIP) where fewer GPUs are visible.
if [[ -n ${TESSERA_PYTEST_NEED_GPUS:-} ]]; then
  have=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  if ((have < TESSERA_PYTEST_NEED_GPUS)); then
    echo "SKIP ($(basename "$FILE")): needs $TESSERA_PYTEST_NEED_GPUS GPUs, $have visible"
    exit 77
  fi
fi
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
fail() { echo "FAIL ($(basename "$FILE") on $NPROC ranks): $*"; exit 1; }

# Debian's torchrun 1.13 needs -r 1 -t 1 under Python 3.11 (lines get a [defaultN]: prefix).
if [[ $EXPECT == expect_fail ]]; then
  cmd=("$PY" -m torch.distributed.run -r 1 -t 1 --standalone --nproc_per_node="$NPROC" "$FILE")
else
  cmd=("$PY" -m torch.distributed.run -r 1 -t 1 --standalone --nproc_per_node="$NPROC"
       -m pytest -p no:cacheprovider -q -x -rfEs "$FILE")
fi
echo "+ ${cmd[*]}"
timeout -k 10 "$LIMIT" "${cmd[@]}" >"$OUT" 2>&1
RC=$?
cat "$OUT"
echo "+ exit status $RC"
((RC == 124 || RC == 137)) && fail "the launch did not finish within ${LIMIT}s"

if [[ $EXPECT == expect_fail ]]; then
  ((RC != 0)) || fail "torchrun exited 0 although rank 1 failed"
  grep -q "rank 1: failing on purpose" "$OUT" || fail "rank 1's error message is missing"
  grep -q "passed the barrier" "$OUT" && fail "a rank passed a barrier that rank 1 never joined"
  echo "PASS: the launch failed with exit status $RC and rank 1's error"
  exit 0
fi

((RC == 0)) || fail "torchrun exited with $RC"
for ((r = 0; r < NPROC; r++)); do
  summary=$(grep -E "^\[default$r\]:.* in [0-9.]+s" "$OUT" | grep -E "passed|failed|error|skipped" | tail -1)
  [[ -n $summary ]] || fail "rank $r printed no pytest summary"
  [[ $summary =~ (failed|error|skipped|xfail|xpass) ]] && fail "rank $r: $summary"
  [[ $summary =~ (^|[^0-9])$EXPECT\ passed ]] || fail "rank $r: '$summary', expected $EXPECT passed"
done
echo "PASS: $EXPECT tests passed on each of $NPROC ranks"
