#!/usr/bin/env bash
# Data loading on the host (CPU): tessera's data layer (tessera_bench_data; tessera.data from Python when the
# module is built) beside PyTorch's ways (torch_data.py: Megatron's memmap IndexedDataset, a GPTDataset under a
# torch DataLoader with 0 and 2 workers, nanoGPT's get_batch) on the same files, in one run: the Brown corpus
# (data/brown, scripts/setup) and a synthetic Megatron dataset of TOKENS uint16 tokens (a temporary directory,
# measured cold then warm, deleted after). Then the run "host" of bench/results/data (bench/results.py data).
#   bench/data/run.sh [--build BUILD_DIR] [--smoke]
# --smoke: Brown only, a few steps, nothing written: every measurement printed its row (ctest bench.data_smoke).
# Env: TOKENS (100 M), WORK_MS (the consumer's fake work per step, 2), RESULTS (bench/results), LOGS (the runs'
# output; default a new /tmp/tessera-data-bench.*), RUN_TIMEOUT (s per run, 240), PYTHON (/usr/bin/python3:
# numpy and torch). Exit status 0 when every run produced its rows (the results hold what ran).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=$ROOT/build
SMOKE=0
ARGS=("$@")
while [ $# -gt 0 ]; do
  case $1 in
    --build) BUILD=${2:?--build needs a directory}; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (--build DIR, --smoke)" >&2; exit 2 ;;
  esac
done
BUILD=$(cd "$BUILD" && pwd) || { echo "run.sh: no build directory" >&2; exit 2; }
PYTHON=${PYTHON:-/usr/bin/python3}
RESULTS=${RESULTS:-$ROOT/bench/results}
RUN_TIMEOUT=${RUN_TIMEOUT:-240}
WORK_MS=${WORK_MS:-2}
BIN=$BUILD/bench/tessera_bench_data
BROWN=$ROOT/data/brown/brown_sp4096_text_document
OWN_LOGS=0
[ -n "${LOGS:-}" ] || { LOGS=$(mktemp -d /tmp/tessera-data-bench.XXXXXX); OWN_LOGS=1; }
mkdir -p "$LOGS"
[ -x "$BIN" ] || { echo "run.sh: $BIN is not built (ninja -C $BUILD tessera_bench_data)" >&2; exit 1; }
[ -f "$BROWN.bin" ] && [ -f "$BROWN.idx" ] || { echo "run.sh: $BROWN.{bin,idx} missing (scripts/setup)" >&2; exit 1; }

if [ $SMOKE = 1 ]; then
  # Each measurement once, tiny: the code paths, not the numbers.
  CPP_OPTS=(--steps 20 --warm 2 --repeats 1 --seq-passes 1 --loader-steps 10 --build-repeats 1 --work-ms 1)
  PY_OPTS=(--steps 20 --warm 2 --repeats 1 --seq-passes 1 --loader-steps 10 --build-repeats 1 --work-ms 1)
  TPY_OPTS=(--steps 20 --warm 2 --repeats 1)
else
  CPP_OPTS=(--steps 1000 --warm 50 --repeats 5 --seq-passes 3 --loader-steps 200 --build-repeats 5 --work-ms "$WORK_MS")
  PY_OPTS=(--steps 1000 --warm 50 --repeats 5 --seq-passes 3 --loader-steps 200 --build-repeats 5 --work-ms "$WORK_MS")
  TPY_OPTS=(--steps 1000 --warm 50 --repeats 5)
fi

# tessera's Python rows need the built module (BUILD/python/tessera, target tessera_python).
TPY=0
if PYTHONPATH=$BUILD/python "$PYTHON" -c "import tessera.data" 2>/dev/null; then
  TPY=1
else
  echo "run.sh: tessera.data does not import from $BUILD/python (ninja -C $BUILD tessera_python): no tessera-python rows" >&2
fi

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
rc=0
logs=()
# run NAME CMD...: JSON lines (stdout) to LOGS/NAME.jsonl, human lines (stderr) to the terminal.
run() {
  local name=$1; shift
  echo "=== data bench: $name: $*" >&2
  local t0; t0=$(date +%s)
  timeout -k 10 "$RUN_TIMEOUT" "$@" >"$LOGS/$name.jsonl" 2>"$LOGS/$name.err"
  local r=$?
  sed 's/^/  /' "$LOGS/$name.err" >&2
  if [ $r != 0 ]; then
    echo "  $name FAILED (rc=$r$([ $r = 124 ] && echo ", timed out after ${RUN_TIMEOUT}s"))" >&2
    rc=1
  fi
  echo "  ($(( $(date +%s) - t0 )) s)" >&2
  logs+=("$LOGS/$name.jsonl")
}

# bench DATASET PATH VOCAB [extra options for both]: every system on one dataset.
bench() {
  local name=$1 path=$2 vocab=$3; shift 3
  run "tessera-$name" "$BIN" --data "$path" --name "$name" --vocab "$vocab" "${CPP_OPTS[@]}" "$@"
  run "pytorch-$name" "$PYTHON" "$HERE/torch_data.py" --data "$path" --name "$name" "${PY_OPTS[@]}" "$@"
  if [ $TPY = 1 ]; then
    run "tessera-python-$name" env PYTHONPATH="$BUILD/python" "$PYTHON" "$HERE/tessera_py_data.py" --data "$path" \
      --name "$name" --vocab "$vocab" "${TPY_OPTS[@]}"
  fi
}

describe() {  # describe NAME PATH TEXT: one dataset's entry for the results
  "$PYTHON" - "$1" "$2" "$3" <<'EOF'
import json, os, sys
import numpy as np
name, prefix, text = sys.argv[1:4]
n = int(np.fromfile(prefix + ".idx", dtype="<u8", count=1, offset=18)[0])
lengths = np.fromfile(prefix + ".idx", dtype="<i4", count=n, offset=34)
print(json.dumps({"name": name, "path": prefix, "documents": int(n), "tokens": int(lengths.sum(dtype=np.int64)),
                  "bin_bytes": os.path.getsize(prefix + ".bin"),
                  "description": f"{text}: {n} documents (sequences), {int(lengths.sum(dtype=np.int64)):,} uint16 "
                                 f"tokens, documents of {lengths.min()}-{lengths.max()} tokens, .bin "
                                 f"{os.path.getsize(prefix + '.bin') / 1e6:.1f} MB"}))
EOF
}

DATASETS=$LOGS/datasets.json
echo "[" >"$DATASETS"
echo "$(describe brown "$BROWN" "data/brown/brown_sp4096_text_document (the Brown corpus, SentencePiece 4096)")," >>"$DATASETS"
bench brown "$BROWN" 4096

if [ $SMOKE = 1 ]; then
  echo "]" >>"$DATASETS"
  checks=tessera:seq_read,tessera:build,tessera:sample_read,tessera:loader_next
  checks+=,pytorch-memmap:seq_read,pytorch-memmap:build,pytorch-dataloader-w0:sample_read,nanogpt-memmap:sample_read
  checks+=,pytorch-dataloader-w2:sample_read,pytorch-dataloader-w2:loader_next
  [ $TPY = 1 ] && checks+=,tessera-python:sample_read
  "$PYTHON" "$ROOT/bench/results.py" data "${logs[@]}" --check "$checks" || rc=1
  [ $OWN_LOGS = 1 ] && [ $rc = 0 ] && rm -rf "$LOGS"
  exit $rc
fi

# The synthetic dataset, bigger than the CPU caches, measured cold first (each tool drops it
# from the page cache before opening it).
TOKENS=${TOKENS:-100000000}
SYN_DIR=$(mktemp -d /tmp/tessera-data-synthetic.XXXXXX)
trap 'rm -rf "$SYN_DIR"' EXIT
SYN=$SYN_DIR/synthetic_text_document
echo "=== data bench: writing $TOKENS synthetic tokens to $SYN.{bin,idx}" >&2
t0=$(date +%s)
"$PYTHON" - "$ROOT/tools" "$SYN" "$TOKENS" <<'EOF' || { echo "run.sh: writing the synthetic dataset failed" >&2; exit 1; }
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from tessera_prep.formats import MegatronWriter
prefix, total = sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(20240520)
lengths = rng.integers(100, 5001, size=total // 100 + 1)
lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), total)) + 1]
lengths[-1] -= int(lengths.sum()) - total  # exactly `total` tokens (the last document may be shorter)
if lengths[-1] <= 0:
    lengths = lengths[:-1]
w = MegatronWriter(prefix, "uint16")
chunk, at = rng.integers(0, 50257, size=1 << 24, dtype=np.uint16), 0
for n in lengths:
    if at + n > len(chunk):
        chunk, at = rng.integers(0, 50257, size=1 << 24, dtype=np.uint16), 0
    w.add_document(chunk[at:at + n])
    at += n
w.finish()
print(f"  {len(lengths)} documents, {int(lengths.sum())} tokens", file=sys.stderr)
EOF
echo "  ($(( $(date +%s) - t0 )) s)" >&2
echo "$(describe synthetic "$SYN" "synthetic, written by tools/tessera_prep's MegatronWriter into a temporary directory (deleted after the run): token ids uniform in [0, 50257), document lengths uniform in [100, 5000]")" >>"$DATASETS"
echo "]" >>"$DATASETS"
bench synthetic "$SYN" 50257 --cold

source "$ROOT/bench/run_lib.sh"  # host
env_text="$(uname -sr); load average at start $LOAD_START, at end $(cut -d' ' -f1-3 /proc/loadavg); torch $("$PYTHON" -c 'import torch; print(torch.__version__)'), numpy $("$PYTHON" -c 'import numpy; print(numpy.__version__)')"
mkdir -p "$RESULTS"
"$PYTHON" "$ROOT/bench/results.py" data "${logs[@]}" --datasets "$DATASETS" --machine "$(host)" \
  --environment "$env_text" \
  --command "bench/data/run.sh${ARGS[*]:+ ${ARGS[*]}}" --results "$RESULTS" \
  --config "TOKENS=$TOKENS WORK_MS=$WORK_MS; C++ ${CPP_OPTS[*]}; Python ${PY_OPTS[*]} --workers 2" \
  --method "one process per system, one core's worth of work (torch threads 1) except the DataLoader workers and tessera's loader thread; every per-step number is the median over runs (--repeats) of each run's mean/p50/p99 (nearest rank) after warm-up steps; tokens/s = B x (T+1) / mean step time; sequential read: median of passes after a warm-up pass; cold: the dataset's files written back and dropped from the page cache (fdatasync + POSIX_FADV_DONTNEED) just before opening; timers: std::chrono::steady_clock and time.perf_counter" \
  --note "tessera rows: readSamples returns one [8, 1025] int64 tensor; nanogpt-memmap and tessera-python return x and y (two [8, 1024] tensors); the DataLoader rows one [8, 1025] tensor (default_collate)" \
  --note "fake work: the consumer spins WORK_MS=$WORK_MS ms per step on the CPU; loader_next is how long next() blocks it (~0 when the loader keeps up)" \
  >/dev/null || rc=1
echo "run.sh: wrote the run host of $RESULTS/data.{json,md} (run logs in $LOGS)" >&2
exit $rc
