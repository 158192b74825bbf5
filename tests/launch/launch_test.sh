#!/usr/bin/env bash
# One launch test: runs launch_probe under a real launcher and checks that every rank printed
#   PROBE launcher=<L> rank=<r> world=<N> local_rank=<r> local_world=<N> ... ok
# exactly once (these launches are single-node, so local rank = rank). Exit 0 pass,
# 1 fail, 77 skip (ctest SKIP_RETURN_CODE) with the reason printed.
# The netns_* cases run on two Slurm nodes made of network namespaces (scripts/slurm-netns,
# beside slurm-local): 4 ranks, 2 per node, checked for where they ran and whom they talked to.
#
#   launch_test.sh <case> <launch_probe> <scripts/slurm-local> [<train_gpt>]
# cases: torchrun_agent_store torchrun_standalone torchrun_restart mpirun_pmix mpirun_rank_fails srun_pmix
#        srun_pmix_rank_missing srun_slurm_env srun_rank_fails sbatch_pmix sbatch_rank_fails
#        slurm_cleanup netns_srun_pmix netns_srun_slurm_env netns_rank_fails
#        netns_sbatch_pmix netns_train_gpt netns_cleanup
set -uo pipefail

CASE=$1 PROBE=$2 SLURM_LOCAL=$3 TRAIN=${4:-}
LIMIT=${TESSERA_LAUNCH_TIMEOUT_S:-120}  # whole launch; the probe's own ops time out sooner
export TESSERA_TIMEOUT_S=${TESSERA_TIMEOUT_S:-60}
SLURM_DIR=${TESSERA_SLURM_DIR:-/tmp/tessera-slurm}
SLURM_NETNS=$(dirname "$SLURM_LOCAL")/slurm-netns
NETNS_DIR=${TESSERA_SLURM_NETNS_DIR:-/tmp/tessera-slurm-netns}
NET=${TESSERA_SLURM_NETNS_NET:-10.77.0}
OUT=$(mktemp)
WORK=""
NETNS_STOP=0  # set by netns_up when this test started the two-node Slurm: stopped on exit
cleanup() {
  rm -f "$OUT"
  [[ -n $WORK ]] && rm -rf "$WORK"
  if ((NETNS_STOP)); then  # on failure the marker stays for launch.netns_cleanup
    if "$SLURM_NETNS" stop >/dev/null 2>&1; then rm -f "$NETNS_DIR/.started-by-launch-tests"; else
      echo "warning: scripts/slurm-netns stop failed"
    fi
  fi
}
trap cleanup EXIT

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

# netns_up: the two-node Slurm of scripts/slurm-netns, started (and, on exit, stopped again) if
# it is not running. A test killed by its ctest TIMEOUT leaves a marker for launch.netns_cleanup.
netns_up() {
  need srun
  [[ $(id -u) -eq 0 ]] || skip "the two-node Slurm needs root (scripts/slurm-netns: namespaces, munged, slurmd)"
  local log rc
  log=$("$SLURM_NETNS" start 2>&1)
  rc=$?
  echo "$log"
  ((rc == 3)) && skip "scripts/slurm-netns says it needs root"
  ((rc == 4)) && skip "Slurm, munge or iproute2 is not installed (scripts/setup installs them)"
  ((rc == 5)) && skip "this machine does not allow network namespaces/veths (scripts/slurm-netns exit 5, above)"
  if grep -q "slurmctld started" <<<"$log"; then
    NETNS_STOP=1
    touch "$NETNS_DIR/.started-by-launch-tests"
  fi
  ((rc == 0)) || fail "scripts/slurm-netns start failed (exit $rc)"
  export SLURM_CONF=$NETNS_DIR/slurm.conf
}

# The two-node launch: 4 tasks, block distribution (ranks 0-1 on tnode1, 2-3 on tnode2); each
# task first prints the node list Slurm gave it.
NETNS_SRUN=(srun -N 2 -n 4 --ntasks-per-node=2 --kill-on-bad-exit=1 --wait=30)
NODELIST_THEN=(bash -c 'echo "NODELIST rank=$SLURM_PROCID nodeid=$SLURM_NODEID host=$(hostname) job=$SLURM_JOB_NODELIST step=$SLURM_STEP_NODELIST"; exec "$0" "$@"')

# expect_two_nodes <launcher> <prefix>: every rank's line says where it ran (node id, host name,
# the address that name resolves to there), that the store is on tnode1's address, and its TCP
# connections: ranks on each node talk to the other node's address, none over loopback.
expect_two_nodes() {
  local launcher=$1 prefix=$2 r node host ip line tcp stores
  ((RC == 0)) || fail "srun exited with $RC, expected 0"
  grep -q "PROBE FAILED" "$OUT" && fail "a rank reported PROBE FAILED"
  (($(grep -cE "^PROBE .* ok$" "$OUT") == 4)) || fail "expected 4 PROBE ok lines"
  for ((r = 0; r < 4; r++)); do
    node=$((r / 2)) host=tnode$((r / 2 + 1)) ip=$NET.$((11 + r / 2))
    grep -qxF "NODELIST rank=$r nodeid=$node host=$host job=tnode[1-2] step=tnode[1-2]" "$OUT" ||
      fail "rank $r: no 'NODELIST rank=$r nodeid=$node host=$host job=tnode[1-2] step=tnode[1-2]' line"
    line=$(grep -E "^PROBE launcher=$launcher rank=$r world=4 local_rank=$((r % 2)) local_world=2 hosts_store=$((r == 0 ? 1 : 0)) prefix=${prefix}[^ ]* node=$node host=$host host_ip=${ip//./\\.} store=tnode1:[0-9]+ store_ip=${NET//./\\.}\\.11 tcp=[^ ]+ ok$" "$OUT")
    (($(grep -c . <<<"$line") == 1)) ||
      fail "rank $r: no single 'PROBE launcher=$launcher rank=$r world=4 local_rank=$((r % 2)) local_world=2 ... node=$node host=$host host_ip=$ip store=tnode1:<port> store_ip=$NET.11 tcp=... ok' line"
    tcp=$(sed -E 's/.* tcp=([^ ]+) ok$/\1/' <<<"$line")
    [[ ,$tcp, == *,127.* ]] && fail "rank $r has a TCP connection over loopback: tcp=$tcp"
    if ((node == 0)); then
      [[ ,$tcp, == *,$NET.12,* ]] || fail "rank $r on tnode1 has no TCP connection to tnode2 ($NET.12): tcp=$tcp"
    else
      [[ ,$tcp, == *,$NET.11,* ]] || fail "rank $r on tnode2 has no TCP connection to tnode1 ($NET.11): tcp=$tcp"
    fi
  done
  stores=$(grep -oE "^PROBE .* store=[^ ]+" "$OUT" | sed -E 's/.* store=//' | sort -u)
  (($(grep -c . <<<"$stores") == 1)) || fail "the ranks used different store addresses: $stores"
  echo "PASS ($CASE): 4 ranks under $launcher on tnode1 (ranks 0-1, $NET.11) and tnode2 (ranks 2-3, $NET.12);" \
    "store $stores on tnode1; TCP crossed the nodes' veths, none over loopback"
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
  netns_srun_pmix)  # rank 0 publishes its host name and port through PMIx across the nodes
    netns_up
    export TESSERA_PROBE_WHERE=1
    launch "${NETNS_SRUN[@]}" --mpi=pmix "${NODELIST_THEN[@]}" "$PROBE"
    expect_two_nodes pmix "tessera/slurm.pmix."
    ;;
  netns_srun_slurm_env)  # every rank finds the store on the first host of SLURM_STEP_NODELIST
    netns_up
    export TESSERA_PROBE_WHERE=1
    launch "${NETNS_SRUN[@]}" --mpi=none "${NODELIST_THEN[@]}" "$PROBE"
    expect_two_nodes slurm "tessera/slurm/"
    ;;
  netns_rank_fails)  # rank 3 (tnode2) fails: the step must end with its error on both nodes, not hang
    netns_up
    export TESSERA_PROBE_FAIL_RANK=3
    launch "${NETNS_SRUN[@]}" --mpi=pmix "$PROBE"
    expect_rank_failure 3
    ;;
  netns_sbatch_pmix)  # examples/slurm/tessera.sbatch as a user submits it: the batch script runs on tnode1
    netns_up
    need sbatch
    export TESSERA_PROBE_WHERE=1  # sbatch passes the environment on
    script=$(cd "$(dirname "$SLURM_LOCAL")/.." && pwd)/examples/slurm/tessera.sbatch
    joblog=$(mktemp)
    launch sbatch --wait -N 2 --ntasks-per-node=2 -o "$joblog" "$script" "${NODELIST_THEN[@]}" "$PROBE"
    echo "--- job output ($joblog)"
    cat "$joblog" | tee -a "$OUT"
    rm -f "$joblog"
    grep -qF "2 node(s) [tnode[1-2]], 4 task(s)" "$OUT" || fail "the batch script did not report 2 nodes [tnode[1-2]] and 4 tasks"
    expect_two_nodes pmix "tessera/slurm.pmix."
    ;;
  netns_train_gpt)  # dp2 x tp2 over the two nodes (tp inside a node, dp across) vs one process
    [[ -x $TRAIN ]] || fail "train_gpt not built ('$TRAIN')"
    need torchrun
    netns_up
    export TESSERA_BACKEND=gloo OMP_NUM_THREADS=1
    WORK=$(mktemp -d)
    LIMIT=${TESSERA_TRAIN_TEST_TIMEOUT_S:-240}
    # As tests/train/train_gpt_test.sh: 8 heads, clipping active, 5 steps.
    base=(--model tiny --heads 8 --batch 16 --steps 5 --lr 1e-2 --clip 0.3 --seed 7)
    launch torchrun -r 1 -t 1 --master_port="$(free_port)" --nproc_per_node=1 --no_python "$TRAIN" "${base[@]}" \
      --log-jsonl "$WORK/ref.jsonl"
    ((RC == 0)) || fail "the single-process reference exited with $RC"
    launch "${NETNS_SRUN[@]}" --mpi=pmix "${NODELIST_THEN[@]}" "$TRAIN" "${base[@]}" --layout 2x1x2 \
      --log-jsonl "$WORK/got.jsonl"
    ((RC == 0)) || fail "srun exited with $RC"
    for ((r = 0; r < 4; r++)); do
      grep -qE "pmix launch: rank $r/4 local rank $((r % 2))/2 on host tnode$((r / 2 + 1))," "$OUT" ||
        fail "rank $r did not report running as local rank $((r % 2))/2 on tnode$((r / 2 + 1))"
    done
    python3 "$(dirname "$0")/../train/compare_losses.py" "$WORK/ref.jsonl" "$WORK/got.jsonl" --rtol 1e-5 ||
      fail "the two-node loss curve differs from the single-process run"
    echo "PASS ($CASE): train_gpt 2x1x2 on tnode1+tnode2 matches the single-process losses (rtol 1e-5)"
    ;;
  netns_cleanup)  # after a netns test killed by its timeout (no trap ran): stop what it started
    if [[ -f $NETNS_DIR/.started-by-launch-tests ]]; then
      "$SLURM_NETNS" stop || fail "scripts/slurm-netns stop failed"
      rm -f "$NETNS_DIR/.started-by-launch-tests"
    else
      echo "nothing left by the netns launch tests"
    fi
    ;;
  *) fail "unknown case '$CASE'" ;;
esac
