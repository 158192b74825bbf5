#!/usr/bin/env bash
# tessera beside torch.distributed under the real launchers: tests/python/beside_torch.py (both
# init orders, and tessera.init(init_torch_distributed=True)) on 2 ranks; every rank must print
# its "BESIDE order=<o> launcher=<l> rank=<r> world=2 ... ok" line exactly once. Exit 0 pass,
# 1 fail, 77 skip (the launcher is missing; srun without root).
#
#   beside_torch_test.sh <case> <python> <beside_torch.py> <scripts/slurm-local>
# cases: torchrun_<order> (--standalone: rank 0 binds MASTER_PORT under torchrun 1.13),
#        torchrun_agent_<order> (static rendezvous: the agent's store), mpirun_<order>,
#        srun_<order> (one-node Slurm, --mpi=pmix), errors (a store that is not there)
#        with <order> one of torch_first, tessera_first, init_torch, torch_first_env (tessera
#        detects the launcher itself instead of taking torch's store: torchrun only).
set -uo pipefail
# torchrun's agent polls its workers every 0.1 s (PET_MONITOR_INTERVAL; its default of 5 s adds up to
# 5 s to every launch).
export PET_MONITOR_INTERVAL=${PET_MONITOR_INTERVAL:-0.1}

CASE=$1 PY=$2 SCRIPT=$3 SLURM_LOCAL=$4
LIMIT=${TESSERA_LAUNCH_TIMEOUT_S:-120}
export TESSERA_TIMEOUT_S=${TESSERA_TIMEOUT_S:-60} OMP_NUM_THREADS=1
SLURM_DIR=${TESSERA_SLURM_DIR:-/tmp/tessera-slurm}
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
# skip, fail, need, launch (sets RC, output in $OUT), free_port, slurm_up.
source "$(dirname "$0")/../launch/lib.sh"

# expect <order> <launcher> [regex the lines must also match]
expect() {
  local order=$1 launcher=$2 extra=${3:-} r n
  ((RC == 0)) || fail "the launch exited with $RC, expected 0"
  grep -q "BESIDE FAILED" "$OUT" && fail "a rank reported BESIDE FAILED"
  for r in 0 1; do
    n=$(grep -cE "BESIDE order=$order launcher=$launcher rank=$r world=2 .*${extra}.* ok$" "$OUT")
    ((n == 1)) || fail "rank $r printed 'BESIDE order=$order launcher=$launcher rank=$r world=2 ...${extra}... ok' $n times"
  done
  echo "PASS ($CASE): torch.distributed and tessera collectives alternated on 2 ranks ($order, $launcher)"
}

TORCHRUN=("$PY" -m torch.distributed.run -r 1 -t 1)  # Debian's torchrun 1.13 needs -r 1 -t 1 (Python 3.11)
order=${CASE#*_}
order=${order#agent_}
# tessera's launcher: its own detection, or torch.distributed's store (when this build can take it).
torch_store=$("$PY" -c 'import tessera, torch.distributed as d; print(int(tessera._C.can_use_torch_store(d.HashStore())))') ||
  fail "could not import tessera"
case $CASE in
  torchrun_agent_*)
    need torchrun
    port=$(free_port)
    launch "${TORCHRUN[@]}" --master_port="$port" --nproc_per_node=2 "$SCRIPT" "$order"
    want=torchrun
    [[ $order == torch_first && $torch_store == 1 ]] && want=torch.distributed
    expect "$order" "$want" "hosts_store=0"
    ;;
  torchrun_*)
    need torchrun
    launch "${TORCHRUN[@]}" --standalone --nproc_per_node=2 "$SCRIPT" "$order"
    want=torchrun
    [[ $order == torch_first && $torch_store == 1 ]] && want=torch.distributed
    expect "$order" "$want"
    # torchrun 1.13's --standalone: rank 0 runs the one store server on MASTER_PORT (multi-tenant, shared).
    if [[ $want == torchrun ]] && ! grep -q "prefix=/worker/attempt_\|keys under '/worker/" "$OUT"; then
      grep -qE "rank=0 world=2 hosts_store=1 store='store server on port" "$OUT" || fail "rank 0 did not host the store"
    fi
    ;;
  mpirun_*)
    need mpirun
    port=$(free_port)
    launch mpirun --allow-run-as-root --oversubscribe -np 2 -x PYTHONPATH -x MASTER_ADDR=127.0.0.1 \
      -x MASTER_PORT="$port" "$PY" "$SCRIPT" "$order"
    want=pmix
    [[ $order == torch_first && $torch_store == 1 ]] && want=torch.distributed
    expect "$order" "$want"
    ;;
  srun_*)
    slurm_up
    port=$(free_port)
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port launch srun -N 1 --kill-on-bad-exit=1 --wait=30 --mpi=pmix -n 2 \
      "$PY" "$SCRIPT" "$order"
    want=pmix
    [[ $order == torch_first && $torch_store == 1 ]] && want=torch.distributed
    expect "$order" "$want"
    ;;
  errors)  # nobody serves the store: the error names the launcher and the store tried
    port=$(free_port)
    launch "$PY" -c "import tessera
try:
    tessera.init(rank=1, world_size=2, store_port=$port, backend='gloo', timeout=3)
except tessera.Error as e:
    print('ERROR', e)"
    grep -qE "^ERROR tessera::init \(explicit launch, rank 1 of 2, store client of 127\.0\.0\.1:$port, keys under 'tessera'\): .*could not connect" "$OUT" ||
      fail "the error does not name the launcher and the store client of 127.0.0.1:$port"
    launch env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" TESSERA_TIMEOUT_S=3 "$PY" -c "import tessera
try:
    tessera.init(backend='gloo')
except tessera.Error as e:
    print('ERROR', e)"
    grep -qE "^ERROR tessera::init \(torchrun launch, rank 1 of 2, store client of 127\.0\.0\.1:$port, keys under 'tessera'\)" "$OUT" ||
      fail "the torchrun error does not name the launcher and the store"
    echo "PASS ($CASE): failures name the launcher and the store"
    ;;
  *) fail "unknown case $CASE" ;;
esac
