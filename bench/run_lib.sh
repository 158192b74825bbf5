# Sourced by the benchmark drivers (bench/train/run.sh, bench/llama/run.sh).
# run NAME CMD...: runs one benchmark process under `timeout RUN_TIMEOUT`, its output in
# LOGS/NAME.log; prints its RESULT lines, or on failure the log's tail, and the seconds it took;
# sets rc=1 on failure and appends the log's path to the array `logs`. BENCH names the driver in
# the header line.
run() {
  local name=$1
  shift
  echo "=== ${BENCH:-bench}: $name: $*"
  local t0=$SECONDS
  if timeout -k 15 "$RUN_TIMEOUT" "$@" >"$LOGS/$name.log" 2>&1; then
    grep -E "RESULT" "$LOGS/$name.log" | cut -c1-400 | sed 's/^/  /' || true
  else
    local r=$?
    echo "  $name FAILED (rc=$r); log tail:"
    grep -vE "^\s*$" "$LOGS/$name.log" | tail -20 | sed 's/^/  | /'
    rc=1
  fi
  echo "  ($((SECONDS - t0)) s)"
  logs+=("$LOGS/$name.log")
}
