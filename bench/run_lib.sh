# Sourced by the benchmark runners (bench/*/run.sh, bench/parallel.sh, bench/llama/*.sh, bench/checkpoint/async_save.sh).
# run NAME CMD...: runs one benchmark process under `timeout RUN_TIMEOUT`, its output in
# LOGS/NAME.log (the log's name names its rows in bench/results.py); prints its RESULT lines, or on
# failure the log's tail, and the seconds it took; sets rc=1 on failure and appends the log's path
# to the array `logs`. BENCH names the driver in the header line.
run() {
  local name=$1
  shift
  echo "=== ${BENCH:-bench}: $name: $*"
  local t0=$SECONDS
  if timeout -k 15 "$RUN_TIMEOUT" "$@" >"$LOGS/$name.log" 2>&1; then
    grep -E "RESULT" "$LOGS/$name.log" | cut -c1-400 | sed 's/^/  /' || true
  else
    local r=$?
    echo "  $name FAILED (rc=$r$([ $r = 124 ] && echo ", timed out after ${RUN_TIMEOUT}s")); log tail:"
    grep -vE "^\s*$" "$LOGS/$name.log" | tail -20 | sed 's/^/  | /'
    rc=1
  fi
  echo "  ($((SECONDS - t0)) s)"
  logs+=("$LOGS/$name.log")
}
# budget_run NAME CMD...: `run` with a timeout of what is left of BUDGET_S (seconds since the script
# started, less BUDGET_RESERVE_S, 0 by default), at most RUN_TIMEOUT; with under 30 s left it is
# skipped (SKIPPED said, budget_skipped=NAME, rc=1). BUDGET_S 0: no budget. rc keeps earlier
# failures. Returns 0 when the run succeeded.
budget_run() {
  local name=$1 t=$RUN_TIMEOUT before=$rc ok
  budget_skipped=""
  if ((BUDGET_S > 0)); then
    t=$((BUDGET_S - SECONDS - ${BUDGET_RESERVE_S:-0}))
    ((t > RUN_TIMEOUT)) && t=$RUN_TIMEOUT
    if ((t < 30)); then
      echo "=== ${BENCH:-bench}: $name SKIPPED: ${BUDGET_S}s budget spent"
      budget_skipped=$name
      rc=1
      return 1
    fi
  fi
  rc=0
  RUN_TIMEOUT=$t run "$@"
  ok=$rc
  rc=$((before | ok))
  return $ok
}
# torchrun_cmd: sets the array TORCHRUN to `torchrun --standalone`, plus `-r 1 -t 1` under torch 1.x: Debian's
# torchrun (1.13, the CPU machines) crashes on its default output settings (its workers' output is then
# redirected and teed, each line prefixed "[defaultN]:", which bench/results.py strips).
torchrun_cmd() {
  TORCHRUN=(torchrun --standalone)
  local tr_python
  tr_python=$(head -1 "$(command -v torchrun)" 2>/dev/null | sed -n 's/^#! *//p')
  [ "$(${tr_python:-python3} -c 'import torch;print(torch.__version__.split(".")[0])' 2>/dev/null)" = 1 ] && TORCHRUN+=(-r 1 -t 1)
  return 0
}
# machine [N]: the machine a run's results name: "N x CARD" (N: the GPUs the run uses, default every GPU listed),
# or without GPUs the host's CPU ("CPU: MODEL, C cores, M GiB": host). environment: the rest (driver, the
# GPU0-GPU1 link, torch).
host() {
  echo "CPU: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $(getconf _NPROCESSORS_ONLN) cores, $(free -g | awk '/^Mem:/{print $2}') GiB"
}
machine() {
  local card
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  if [ -n "$card" ]; then
    echo "${1:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')} x $card"
  else
    host
  fi
}
environment() {
  local driver topo
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
  # The GPU0-GPU1 link: the third column of GPU0's row (with one GPU that column is its CPU affinity).
  (($(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') > 1)) &&
    topo=$(nvidia-smi topo -m 2>/dev/null | awk '/^GPU0/{print $3; exit}' || true)
  echo "${driver:+driver $driver; }${topo:+GPU0-GPU1 link $topo; }$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') GPUs on the host; torch $(${PYTHON:-python3} -c 'import torch;print(torch.__version__)' 2>/dev/null)"
}
