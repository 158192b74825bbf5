#!/usr/bin/env bash
# The installable C++ package: `cmake --install` of the build tree into a temporary prefix, the
# installed headers checked (check_headers.py), then examples/downstream — a project outside
# the tree — configured with find_package(tessera), built, and run on 2 ranks over Gloo with the
# explicit bootstrap. It passes when every rank exits 0 (DDP matched the single-process run and
# the loss fell; see examples/downstream/train.cpp) and rank 0 printed its OK line.
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
echo "PASS: find_package(tessera) from outside the tree; downstream_train trained on 2 ranks"
