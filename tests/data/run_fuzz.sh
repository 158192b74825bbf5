#!/usr/bin/env bash
# Fuzzes a pure parser with libFuzzer + ASan + UBSan for a bounded time: by default the
# token-format header parsers (src/data/formats.cpp; CTest: data.fuzz), or what the options name
# (src/hf's safetensors header parser; CTest: hf.fuzz). Exits non-zero on any finding (crash,
# sanitizer report, broken promise, non-tessera exception, timeout, OOM), printing it.
#
#   tests/data/run_fuzz.sh [REPO_ROOT] [--name NAME] [--target FUZZ.cpp] [--seeds SEEDS.py]
#                          [--source PARSER.cpp]... [--include DIR]... [--seconds N]
#
# Paths are relative to REPO_ROOT unless absolute. Defaults: data, tests/data/fuzz_formats.cpp,
# tests/data/fuzz_seeds.py, src/data/formats.cpp, 30 s. SEEDS.py is run as
# `python3 SEEDS.py CORPUS_DIR DICT_FILE` and writes the seed corpus and a libFuzzer dictionary.
#
# Environment:
#   TESSERA_FUZZ_SECONDS   fuzzing time (default: --seconds, else 30)
#   TESSERA_FUZZ_CXX       the clang++ to use (default: clang++, else clang++-14)
#   TESSERA_FUZZ_FORMATS   the parser source fuzzed in place of the first --source (for checking
#                          that the fuzzer catches a planted bug in a copy)
#   TESSERA_FUZZ_KEEP=1    keep the work directory (binary, corpus) after a clean run
# Needs clang++ and libFuzzer's runtime: Debian packages clang and libclang-rt-14-dev
# (scripts/setup installs them).
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [[ $# -gt 0 && $1 != --* ]]; then
  repo=$(cd "$1" && pwd) || { echo "run_fuzz: no repository at '$1'" >&2; exit 2; }
  shift
fi
name=data target=tests/data/fuzz_formats.cpp seeds=tests/data/fuzz_seeds.py default_seconds=30
sources=() includes=()
while [[ $# -gt 0 ]]; do
  [[ $# -ge 2 ]] || { echo "run_fuzz: '$1' needs a value" >&2; exit 2; }
  case $1 in
    --name) name=$2 ;;
    --target) target=$2 ;;
    --seeds) seeds=$2 ;;
    --source) sources+=("$2") ;;
    --include) includes+=("-I$2") ;;
    --seconds) default_seconds=$2 ;;
    *) echo "run_fuzz: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift 2
done
((${#sources[@]})) || sources=(src/data/formats.cpp)
abs() { [[ $1 == /* ]] && echo "$1" || echo "$repo/$1"; }
target=$(abs "$target")
seeds=$(abs "$seeds")
for i in "${!sources[@]}"; do sources[i]=$(abs "${sources[i]}"); done
[[ -n ${TESSERA_FUZZ_FORMATS:-} ]] && sources[0]=$TESSERA_FUZZ_FORMATS
seconds=${TESSERA_FUZZ_SECONDS:-$default_seconds}

missing() {
  echo "run_fuzz: FAILED: $1" >&2
  echo "run_fuzz: the fuzz test needs clang++ with libFuzzer and the sanitizer runtimes: install the Debian" >&2
  echo "run_fuzz: packages 'clang' and 'libclang-rt-14-dev' (apt-get install clang libclang-rt-14-dev;" >&2
  echo "run_fuzz: scripts/setup installs them). This is not skipped: CI must run the fuzzer." >&2
  exit 1
}

cxx=${TESSERA_FUZZ_CXX:-}
if [[ -z $cxx ]]; then
  for c in clang++ clang++-14; do
    if command -v "$c" >/dev/null 2>&1; then cxx=$c; break; fi
  done
fi
[[ -n $cxx ]] && command -v "$cxx" >/dev/null 2>&1 || missing "no clang++ found${cxx:+ ('$cxx' is not on PATH)}"
command -v python3 >/dev/null 2>&1 || { echo "run_fuzz: FAILED: python3 is needed to write the seed corpus" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-fuzz-$name.XXXXXX")
keep=${TESSERA_FUZZ_KEEP:-0}
cleanup() { [[ $keep == 1 ]] || rm -rf "$work"; }
trap cleanup EXIT

sanitize=(-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)

# Probe: does this clang link libFuzzer and the sanitizers at all?
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' >"$work/probe.cpp"
if ! "$cxx" -std=c++17 "${sanitize[@]}" "$work/probe.cpp" -o "$work/probe" >"$work/probe.log" 2>&1; then
  cat "$work/probe.log" >&2
  missing "$cxx cannot link a libFuzzer target (-fsanitize=fuzzer,address,undefined)"
fi

echo "run_fuzz: $name: building $target + ${sources[*]} with $cxx"
t0=$SECONDS
if ! "$cxx" -std=c++17 -O1 -g -fno-omit-frame-pointer "${sanitize[@]}" -DFMT_HEADER_ONLY=1 -I"$repo/include" -I"$repo/src" \
    "${includes[@]}" "${sources[@]}" "$target" -o "$work/fuzz"; then
  keep=1
  echo "run_fuzz: FAILED: the fuzz target does not build (work directory kept: $work)" >&2
  exit 1
fi
echo "run_fuzz: built in $((SECONDS - t0)) s"

# Seeds: valid structure for every parser, so the fuzzer starts from inputs that get deep.
mkdir -p "$work/corpus" "$work/artifacts"
python3 "$seeds" "$work/corpus" "$work/fuzz.dict"
[[ $? == 0 ]] || { echo "run_fuzz: FAILED: could not write the seed corpus" >&2; exit 1; }

echo "run_fuzz: fuzzing for ${seconds} s"
log=$work/fuzz.log
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
"$work/fuzz" "$work/corpus" \
  -dict="$work/fuzz.dict" -max_len=8192 -max_total_time="$seconds" -rss_limit_mb=1024 -timeout=10 \
  -print_final_stats=1 -artifact_prefix="$work/artifacts/" >"$log" 2>&1
rc=$?

# Findings: a non-zero exit, an artifact, or a sanitizer report that did not stop the run.
shopt -s nullglob
artifacts=("$work"/artifacts/*)
if [[ $rc != 0 || ${#artifacts[@]} -gt 0 ]] || grep -q -E 'ERROR: (AddressSanitizer|UndefinedBehaviorSanitizer)|runtime error:' "$log"; then
  keep=1
  echo "run_fuzz: FAILED: the fuzzer found a problem (exit $rc). Its log:" >&2
  grep -v -E '^(#[0-9]+\s+(NEW|REDUCE|pulse|INITED)|\s+NEW_FUNC)' "$log" | tail -n 150 >&2
  for a in "${artifacts[@]}"; do
    echo "run_fuzz: finding $(basename "$a") ($(stat -c %s "$a") bytes), hex:" >&2
    od -An -tx1 -v "$a" | head -n 64 >&2
    echo "run_fuzz: reproduce: $work/fuzz $a" >&2
  done
  echo "run_fuzz: work directory kept: $work" >&2
  exit 1
fi

# Summary from libFuzzer's final lines, e.g. "#123456 DONE cov: 150 ft: 400 corp: 60/2Kb ...
# exec/s: 4000" and "Done 123456 runs in 31 second(s)".
done_line=$(grep -E '^#[0-9]+\s+DONE' "$log" | tail -n 1)
runs=$(sed -n -E 's/^Done ([0-9]+) runs in ([0-9]+) second.*/\1/p' "$log" | tail -n 1)
secs=$(sed -n -E 's/^Done ([0-9]+) runs in ([0-9]+) second.*/\2/p' "$log" | tail -n 1)
cov=$(sed -n -E 's/.* cov: ([0-9]+).*/\1/p' <<<"$done_line")
ft=$(sed -n -E 's/.* ft: ([0-9]+).*/\1/p' <<<"$done_line")
corp=$(sed -n -E 's/.* corp: ([0-9]+)\/.*/\1/p' <<<"$done_line")
rate=$(sed -n -E 's/.* exec\/s: ([0-9]+).*/\1/p' <<<"$done_line")
echo "run_fuzz: OK: ${runs:-?} executions in ${secs:-?} s (${rate:-?} exec/s), coverage ${cov:-?} edges / ${ft:-?} features, corpus ${corp:-?} inputs, no findings"
