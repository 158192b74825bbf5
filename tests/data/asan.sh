#!/usr/bin/env bash
# Builds the src/data reader suites (tests/data/test_readers.cpp + test_samples.cpp) with every
# src/data/*.cpp under AddressSanitizer + UndefinedBehaviorSanitizer (the rest of libtessera is not
# needed: src/data uses common/error.h, header-only, and common/device.cpp) and runs them once.
# Exits non-zero on a failed test or any sanitizer report, printing it.
#
#   tests/data/asan.sh [REPO_ROOT] [gtest args...]
#
# Environment:
#   TESSERA_ASAN_CXX    the compiler (default g++)
#   TESSERA_ASAN_KEEP=1 keep the work directory (objects, binary, log)
#   TORCH_INCLUDE / TORCH_LIB   LibTorch's include root and library directory
#                       (default /usr/include and /usr/lib/x86_64-linux-gnu, Debian's libtorch-dev)
# LeakSanitizer is off (LibTorch leaks at exit); UBSan halts on the first report.
set -uo pipefail

repo=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
repo=$(cd "$repo" && pwd) || { echo "asan: no repository at '$1'" >&2; exit 2; }
shift $(( $# > 0 ? 1 : 0 ))
cxx=${TESSERA_ASAN_CXX:-g++}
torch_inc=${TORCH_INCLUDE:-/usr/include}
torch_lib=${TORCH_LIB:-/usr/lib/x86_64-linux-gnu}

command -v "$cxx" >/dev/null 2>&1 || { echo "asan: FAILED: no compiler '$cxx'" >&2; exit 1; }
[[ -f $torch_inc/torch/csrc/api/include/torch/torch.h || -f $torch_inc/ATen/ATen.h ]] ||
  { echo "asan: FAILED: LibTorch headers not found under $torch_inc (Debian: libtorch-dev)" >&2; exit 1; }
[[ -f /usr/include/gtest/gtest.h || -n ${GTEST_INCLUDE:-} ]] ||
  { echo "asan: FAILED: GoogleTest not found (Debian: libgtest-dev)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-asan.XXXXXX")
keep=${TESSERA_ASAN_KEEP:-0}
cleanup() { [[ $keep == 1 ]] || rm -rf "$work"; }
trap cleanup EXIT

flags=(-std=gnu++17 -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
       -DFMT_HEADER_ONLY=1 -D_GLIBCXX_USE_CXX11_ABI=1
       -I"$repo/src" -I"$repo/tests/data" -isystem "$torch_inc/torch/csrc/api/include")
# /usr/include is a default system directory: naming it again breaks libstdc++'s #include_next.
[[ $torch_inc != /usr/include ]] && flags+=(-isystem "$torch_inc")
[[ -n ${GTEST_INCLUDE:-} ]] && flags+=(-isystem "$GTEST_INCLUDE")

sources=("$repo"/src/data/*.cpp "$repo/src/common/device.cpp" "$repo/tests/data/test_readers.cpp"
         "$repo/tests/data/test_samples.cpp")
jobs=${TESSERA_ASAN_JOBS:-$(nproc 2>/dev/null || echo 2)}

echo "asan: compiling ${#sources[@]} files with $cxx (${jobs} at a time) in $work"
t0=$SECONDS
# Compile in parallel (one object per source), then link.
fail=0
pids=()
objs=()
for src in "${sources[@]}"; do
  rel=${src#"$repo"/}
  obj=$work/obj/${rel//\//_}.o
  objs+=("$obj")
  mkdir -p "$work/obj"
  ( "$cxx" "${flags[@]}" -c "$src" -o "$obj" >"$obj.log" 2>&1 || { echo "asan: FAILED to compile $rel:" >&2; cat "$obj.log" >&2; exit 1; } ) &
  pids+=($!)
  if (( ${#pids[@]} >= jobs )); then
    wait "${pids[0]}" || fail=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || fail=1; done
if (( fail )); then keep=1; echo "asan: FAILED: compilation (work directory kept: $work)" >&2; exit 1; fi
echo "asan: compiled in $((SECONDS - t0)) s"

t1=$SECONDS
if ! "$cxx" -fsanitize=address,undefined "${objs[@]}" -o "$work/test_data_asan" \
    -L"$torch_lib" -Wl,-rpath,"$torch_lib" -Wl,--no-as-needed -ltorch -ltorch_cpu -lc10 -Wl,--as-needed \
    -lgtest_main -lgtest -pthread; then
  keep=1
  echo "asan: FAILED: link (work directory kept: $work)" >&2
  exit 1
fi
echo "asan: linked in $((SECONDS - t1)) s"

t2=$SECONDS
log=$work/run.log
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0:halt_on_error=1:detect_stack_use_after_return=1:strict_string_checks=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
  "$work/test_data_asan" --gtest_color=no "$@" >"$log" 2>&1
rc=$?
run_s=$((SECONDS - t2))

summary=$(grep -E '^\[(==========|  PASSED  |  FAILED  |  SKIPPED )\]' "$log")
reports=$(grep -c -E 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$log")
if [[ $rc != 0 || $reports != 0 ]]; then
  keep=1
  echo "asan: FAILED (exit $rc, $reports sanitizer report(s)) after ${run_s} s. The run's log:" >&2
  grep -v -E '^\[ +(RUN|OK) +\]' "$log" | tail -n 200 >&2
  echo "asan: work directory kept: $work" >&2
  exit 1
fi
echo "$summary"
echo "asan: OK: no AddressSanitizer/UBSan report; build $((t2 - t0)) s, run ${run_s} s, total $((SECONDS - t0)) s"
