# Shell helpers of the launch tests (tests/launch/launch_test.sh) and the trainer's tests
# (tests/examples/train_gpt_test.sh). The sourcing script sets CASE, LIMIT (seconds for one
# launch), OUT (a temp file), SLURM_LOCAL and SLURM_DIR first.

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL ($CASE): $*"; exit 1; }
need() { command -v "$1" >/dev/null || skip "$1 not found (scripts/setup installs it)"; }

# Runs the launcher under `timeout`, output to $OUT (and to ours, for ctest's log).
launch() {
  echo "+ $*"
  timeout -k 10 "$LIMIT" "$@" >"$OUT" 2>&1
  RC=$?
  cat "$OUT"
  echo "+ exit status $RC"
  if ((RC == 124 || RC == 137)); then fail "the launch did not finish within ${LIMIT}s"; fi
}

slurm_up() {
  need srun
  [[ $(id -u) -eq 0 ]] || skip "the local Slurm needs root (scripts/slurm-local: munged, slurmctld, slurmd)"
  local log
  log=$("$SLURM_LOCAL" start 2>&1)
  local rc=$?
  echo "$log"
  ((rc == 3)) && skip "scripts/slurm-local says it needs root"
  ((rc == 4)) && skip "Slurm or munge is not installed (scripts/setup installs them)"
  ((rc == 0)) || fail "scripts/slurm-local start failed (exit $rc)"
  if grep -q "slurmctld started" <<<"$log"; then touch "$SLURM_DIR/.started-by-launch-tests"; fi
  export SLURM_CONF=$SLURM_DIR/slurm.conf
}

# A free TCP port (for torchrun's --master_port).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])' ||
    fail "could not pick a free port"
}
