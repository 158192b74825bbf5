# Shell helpers of the launch tests (tests/launch/launch_test.sh) and the trainer's tests
# (tests/train/train_gpt_test.sh). The sourcing script sets CASE, LIMIT (seconds for one
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

# cached_run <log> <key text> <command...>: a deterministic run's log. <log> comes from
# TESSERA_TRAIN_REF_CACHE (a directory) when it holds the run of the same key — $TRAIN's and its
# libtessera's bytes plus <key text> (flags, data files, backend: what the run depends on) —
# else <command...> writes it and it is kept there. Without TESSERA_TRAIN_REF_CACHE it just runs.
# The sourcing script sets TRAIN.
cached_run() {
  local log=$1 text=$2 cache=${TESSERA_TRAIN_REF_CACHE:-} key lib lock
  shift 2
  if [[ -z $cache ]]; then
    "$@"
    return
  fi
  mkdir -p "$cache" || fail "cannot create the reference cache $cache"
  lib=$(ldd "$TRAIN" | awk '/libtessera/ {print $3}')
  key=$( { sha256sum "$TRAIN" ${lib:+"$lib"} | cut -d' ' -f1; printf '%s\n' "$text"; } | sha256sum | cut -c1-32)
  exec {lock}>"$cache/.lock"
  flock "$lock"
  if [[ -s $cache/$key.jsonl ]]; then
    cp "$cache/$key.jsonl" "$log"
    echo "reference: the run of these flags from $cache/$key.jsonl"
  else
    "$@"
    cp "$log" "$cache/$key.jsonl.tmp" && mv "$cache/$key.jsonl.tmp" "$cache/$key.jsonl"
  fi
  exec {lock}>&-
}
