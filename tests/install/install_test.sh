#!/usr/bin/env bash
# The installable C++ package: `cmake --install` of the build tree into a temporary prefix, the
# installed headers checked (check_headers.py), then two projects outside the tree, configured with
# find_package(tessera), built, and run on 2 ranks over Gloo: examples/downstream (DDP against the
# single-process run, explicit bootstrap: its OK line) and docs/cpp.md's training loop of one's own
# as the page prints it (the cpp block that starts "// my_trainer.cpp", under torchrun: the loss
# falls and every rank exits 0).
#   install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-install.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

cmake --install "$build" --prefix "$work/prefix" --component cpp >"$work/install.log"
echo "installed: $(find "$work/prefix" -name '*.h' | wc -l) headers, $(ls "$work/prefix"/lib*/libtessera.so* "$work"/prefix/lib/*/libtessera.so* 2>/dev/null | head -1)"
python3 "$src/tests/install/check_headers.py" "$work/prefix/include"
# Nothing from the build or source tree may leak into the package.
if grep -rlE "$src/src|$build" "$work/prefix" --include='*.cmake' >/dev/null; then
  grep -rnE "$src/src|$build" "$work/prefix" --include='*.cmake'
  echo "FAIL: the installed CMake package refers to the build or source tree"; exit 1
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# build_one DIR NAME: DIR/NAME.cpp as a project of its own on find_package(tessera); logs in DIR.
build_one() {
  printf '%s\n' "cmake_minimum_required(VERSION 3.22)" "project($2 LANGUAGES CXX)" "set(CMAKE_CXX_STANDARD 17)" \
    "find_package(tessera REQUIRED)" "add_executable($2 $2.cpp)" \
    "target_link_libraries($2 PRIVATE tessera::tessera)" >"$1/CMakeLists.txt"
  cmake -S "$1" -B "$1/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" \
    >"$1/configure.log" 2>&1 || { cat "$1/configure.log"; return 1; }
  cmake --build "$1/build" -j "${TESSERA_JOBS:-2}" >"$1/build.log" 2>&1 || { cat "$1/build.log"; return 1; }
}
cmake -S "$src/examples/downstream" -B "$work/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
grep -- '-- tessera ' "$work/configure.log" || true
cmake --build "$work/build" -j "${TESSERA_JOBS:-2}" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for r in 0 1; do
  TESSERA_BACKEND=gloo timeout 180 "$work/build/downstream_train" --rank "$r" --world 2 --port "$port" \
    >"$work/rank$r.log" 2>&1 &
  pids+=($!)
done
status=0
for i in 0 1; do
  if ! wait "${pids[$i]}"; then
    status=1
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done  # never leave a sibling waiting
  fi
done
pids=()
for r in 0 1; do sed "s/^/[rank $r] /" "$work/rank$r.log"; done
[[ $status == 0 ]] || { echo "FAIL: a rank of downstream_train failed"; exit 1; }
grep -q 'downstream_train: 2 ranks (explicit).*: OK$' "$work/rank0.log" || { echo "FAIL: no OK line from rank 0"; exit 1; }
# docs/cpp.md's trainer, word for word, on the Brown corpus (synthetic progressions take a tiny
# model hundreds of steps; real text's loss falls in 8).
data=${TESSERA_TRAIN_DATA:-$src/data/brown/brown_sp4096_text_document}
[ -f "$data.bin" ] || { echo "FAIL: no $data.bin (scripts/setup prepares it)"; exit 1; }
mkdir -p "$work/doc"
python3 - "$src/docs/cpp.md" "$work/doc/my_trainer.cpp" <<'EOF'
import re, sys
blocks = re.findall(r"```cpp\n(.*?)```", open(sys.argv[1]).read(), re.S)
mine = [b for b in blocks if b.startswith("// my_trainer.cpp")]
if len(mine) != 1:
    sys.exit(f"docs/cpp.md: {len(mine)} ```cpp blocks start with '// my_trainer.cpp' (expected 1)")
open(sys.argv[2], "w").write(mine[0])
EOF
build_one "$work/doc" my_trainer || { echo "FAIL: docs/cpp.md's trainer does not build"; exit 1; }
# A free port, not --standalone's fixed 29400: this test runs beside the launch lock's tests (which
# take --standalone's port), tests/install/CMakeLists.txt.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(cd "$work/doc" && TESSERA_BACKEND=gloo OMP_NUM_THREADS=1 PET_MONITOR_INTERVAL=0.1 timeout 240 \
  torchrun -r 1 -t 1 --master_port="$port" --nproc_per_node=2 --no_python "$work/doc/build/my_trainer" \
  --model llama-tiny --seq-len 32 --batch 8 --steps 8 --lr 1e-2 --log-jsonl "$work/doc/log.jsonl" \
  --data "$data" --vocab-size 4096 --split 98,2 --eod-token 2) \
  >"$work/doc_run.log" 2>&1 || { cat "$work/doc_run.log"; echo "FAIL: docs/cpp.md's trainer failed on 2 ranks"; exit 1; }
grep -E "my_trainer: loss [0-9.]+ -> [0-9.]+" "$work/doc_run.log" || { cat "$work/doc_run.log"; echo "FAIL: no loss line"; exit 1; }
[[ $(grep -c '"event": "step"' "$work/doc/log.jsonl") == 8 ]] || { echo "FAIL: the trainer's JSONL log lacks steps"; exit 1; }
# The public headers' examples ("// Example:" blocks), compiled against the install.
mkdir -p "$work/examples"
python3 "$src/tests/install/header_examples.py" "$work/prefix/include" "$work/examples/header_examples.cpp"
build_one "$work/examples" header_examples ||
  { echo "FAIL: a header's example does not compile ($work/examples/header_examples.cpp)"; exit 1; }
echo "PASS: find_package(tessera) from outside the tree; downstream_train and docs/cpp.md's trainer ran on 2 ranks; the headers' examples compile"
