#!/usr/bin/env bash
# One launch test: runs launch_probe under a real launcher and checks that every rank printed
#   PROBE launcher=<L> rank=<r> world=<N> local_rank=<r> local_world=<N> ... ok
# exactly once (all launches here are single-node, so local rank = rank). Exit 0 pass,
# 1 fail, 77 skip (ctest SKIP_RETURN_CODE) with the reason printed.
#
#   launch_test.sh <case> <launch_probe> <scripts/slurm-local>
# cases: torchrun_agent_store torchrun_standalone torchrun_restart mpirun_pmix mpirun_rank_fails srun_pmix
#        srun_pmix_rank_missing srun_slurm_env srun_rank_fails sbatch_pmix sbatch_rank_fails
#        slurm_cleanup
set -uo pipefail

CASE=$1 PROBE=$2 SLURM_LOCAL=$3
LIMIT=${TESSERA_LAUNCH_TIMEOUT_S:-120}  # whole launch; the probe's own ops time out sooner
export TESSERA_TIMEOUT_S=${TESSERA_TIMEOUT_S:-60}
SLURM_DIR=${TESSERA_SLURM_DIR:-/tmp/tessera-slurm}
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT

# skip, fail, need, launch (sets RC, output in $OUT), free_port, slurm_up.
source "$(dirname "$0")/lib.sh"

# expect_ok <launcher> <world> [extra regex the lines must match]
expect_ok() {
  local launcher=$1 world=$2 extra=${3:-} r n total
  ((RC == 0)) || fail "launcher exited with $RC, expected 0"
  for ((r = 0; r < world; r++)); do
    n=$(grep -cE "PROBE launcher=$launcher rank=$r world=$world local_rank=$r local_world=$world .*${extra}.* ok$" "$OUT")
    ((n == 1)) || fail "rank $r printed its 'PROBE launcher=$launcher rank=$r world=$world ...${extra}... ok' line $n times, expected once"
  done
  total=$(grep -cE "PROBE .* ok$" "$OUT")
  ((total == world)) || fail "$total PROBE ok lines for a world of $world"
  grep -q "PROBE FAILED" "$OUT" && fail "a rank reported PROBE FAILED"
  echo "PASS ($CASE): all $world ranks ok under $launcher"
}

# expect_rank_failure <failing rank>: the launch must fail, name the rank's error, and not hang.
expect_rank_failure() {
  ((RC != 0)) || fail "launcher exited 0 although rank $1 failed"
  grep -q "PROBE FAILED rank=$1: rank $1: failing on purpose" "$OUT" || fail "rank $1's error message is missing"
  echo "PASS ($CASE): the launch failed with exit status $RC and rank $1's error"
}

# mpirun runs 3 ranks; on a GPU machine with fewer GPUs (NCCL needs one per rank) as many as
# there are GPUs, unless TESSERA_BACKEND picks the backend.
NP=3
if [[ -z ${TESSERA_BACKEND:-} ]] && command -v nvidia-smi >/dev/null; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  if ((gpus > 0 && gpus < NP)); then NP=$gpus; echo "note: $gpus GPU(s) visible: mpirun runs $NP ranks"; fi
fi

# srun: kill the step when a task fails, and the rest 30 s after the first task ends.
SRUN=(srun -N 1 --kill-on-bad-exit=1 --wait=30)

case $CASE in
  torchrun_agent_store)  # static rendezvous: the agent's store, TORCHELASTIC_USE_AGENT_STORE=True
    need torchrun
    # A free port rather than torchrun's default 29500, which another job may hold.
    port=$(free_port)
    launch torchrun -r 1 -t 1 --master_port="$port" --nproc_per_node=2 --no_python "$PROBE"
    expect_ok torchrun 2 "hosts_store=0 prefix=/worker/attempt_0/tessera"
    ;;
  torchrun_standalone)
    # c10d rendezvous. torchrun 1.13 sets TORCHELASTIC_USE_AGENT_STORE=False here: rank 0 binds
    # MASTER_PORT and the others connect (tessera's plain path). Newer torchruns (2.x) share
    # the agent's store under --standalone too; then the agent-store path is what runs.
    need torchrun
    launch torchrun -r 1 -t 1 --standalone --nproc_per_node=2 --no_python "$PROBE"
    if grep -q "prefix=/worker/attempt_" "$OUT"; then
      echo "note: this torchrun uses the agent's store under --standalone too"
      expect_ok torchrun 2 "hosts_store=0 prefix=/worker/attempt_0/tessera"
    else
      expect_ok torchrun 2 "prefix=tessera"
      grep -qE "rank=0 .*hosts_store=1" "$OUT" || fail "rank 0 did not host the store"
    fi
    ;;
  torchrun_restart)  # a rank dies at step 3; torchrun restarts every worker, which resume from the checkpoint
    need torchrun
    restart_probe=$(dirname "$PROBE")/restart_probe
    [[ -x $restart_probe ]] || fail "$restart_probe not built"
    work=$(mktemp -d)
    port=$(free_port)
    launch torchrun -r 1 -t 1 --master_port="$port" --nproc_per_node=2 --max_restarts=0 --no_python \
      "$restart_probe" "$work/straight" 6
    ((RC == 0)) || fail "the uninterrupted run failed (exit $RC)"
    straight=$(grep -o "RESTART_PROBE final.*" "$OUT")
    [[ -n $straight ]] || fail "the uninterrupted run printed no final parameters"
    port=$(free_port)
    TESSERA_CRASH_AT_STEP=3 launch torchrun -r 1 -t 1 --master_port="$port" --nproc_per_node=2 --max_restarts=1 \
      --no_python "$restart_probe" "$work/restarted" 6
    rm -rf "$work"
    ((RC == 0)) || fail "the restarted run failed (exit $RC)"
    grep -q "rank 1 crashing on purpose after step 3" "$OUT" || fail "rank 1 did not crash as injected"
    grep -q "RESTART_PROBE attempt=1 resumed_from=3" "$OUT" || fail "the second attempt did not resume at step 3"
    restarted=$(grep -o "RESTART_PROBE final.*" "$OUT")
    [[ $restarted == "$straight" ]] || fail "parameters differ: uninterrupted '$straight' vs restarted '$restarted'"
    echo "PASS ($CASE): restarted after a crash at step 3, resumed from the checkpoint, parameters bitwise equal"
    ;;
  mpirun_pmix)
    need mpirun
    launch mpirun --allow-run-as-root --oversubscribe -np "$NP" "$PROBE"
    expect_ok pmix "$NP" "prefix=tessera/"
    ;;
  mpirun_rank_fails)
    need mpirun
    ((NP >= 2)) || skip "one GPU: no second rank to fail"
    launch mpirun --allow-run-as-root --oversubscribe -np "$NP" -x TESSERA_PROBE_FAIL_RANK=1 "$PROBE"
    expect_rank_failure 1
    ;;
  srun_pmix)
    slurm_up
    launch "${SRUN[@]}" --mpi=pmix -n 2 "$PROBE"
    expect_ok pmix 2 "prefix=tessera/slurm.pmix."
    ;;
  srun_pmix_rank_missing)  # rank 1 never reaches PMIx: rank 0's fence must time out, not hang
    slurm_up
    export TESSERA_TIMEOUT_S=10
    launch srun -N 1 --wait=60 --mpi=pmix -n 2 \
      bash -c 'if [[ $SLURM_PROCID == 1 ]]; then exit 3; fi; exec "$0"' "$PROBE"
    ((RC != 0)) || fail "srun exited 0 although rank 1 never started"
    grep -qE "PROBE FAILED .*PMIx_Fence.* on rank 0: TIMEOUT" "$OUT" ||
      fail "rank 0 did not report its PMIx_Fence timing out"
    echo "PASS ($CASE): rank 0's PMIx_Fence timed out with a clear error"
    ;;
  srun_slurm_env)
    slurm_up
    launch "${SRUN[@]}" --mpi=none -n 2 "$PROBE"
    expect_ok slurm 2 "prefix=tessera/slurm/"
    ;;
  srun_rank_fails)
    slurm_up
    export TESSERA_PROBE_FAIL_RANK=0  # srun passes the environment on
    launch "${SRUN[@]}" --mpi=none -n 2 "$PROBE"
    expect_rank_failure 0
    ;;
  sbatch_pmix | sbatch_rank_fails)  # examples/slurm/tessera.sbatch, submitted as a user would
    slurm_up
    need sbatch
    script=$(cd "$(dirname "$SLURM_LOCAL")/.." && pwd)/examples/slurm/tessera.sbatch
    [[ $CASE == sbatch_rank_fails ]] && export TESSERA_PROBE_FAIL_RANK=1  # sbatch passes it on
    joblog=$(mktemp)
    launch sbatch --wait -N 1 --ntasks-per-node=2 -o "$joblog" "$script" "$PROBE"
    echo "--- job output ($joblog)"
    cat "$joblog" | tee -a "$OUT"
    rm -f "$joblog"
    if [[ $CASE == sbatch_pmix ]]; then
      expect_ok pmix 2 "prefix=tessera/slurm.pmix."
    else
      expect_rank_failure 1
    fi
    ;;
  slurm_cleanup)
    if [[ -f $SLURM_DIR/.started-by-launch-tests ]]; then
      "$SLURM_LOCAL" stop || fail "scripts/slurm-local stop failed"
      rm -f "$SLURM_DIR/.started-by-launch-tests"
    else
      echo "the local Slurm was not started by the launch tests; leaving it as it is"
    fi
    ;;
  *) fail "unknown case '$CASE'" ;;
esac
