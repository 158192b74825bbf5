#!/usr/bin/env bash
# Fuzzes the token-format header parsers (src/data/formats.cpp) with libFuzzer + ASan + UBSan for a
# bounded time; CTest runs it as data.fuzz. Exits non-zero on any finding (crash, sanitizer
# report, broken promise, non-tessera exception, timeout, OOM), printing it.
#
#   tests/data/run_fuzz.sh [REPO_ROOT]
#
# Environment:
#   TESSERA_FUZZ_SECONDS   fuzzing time (default 30)
#   TESSERA_FUZZ_CXX       the clang++ to use (default: clang++, else clang++-14)
#   TESSERA_FUZZ_FORMATS   the formats.cpp to fuzz (default REPO_ROOT/src/data/formats.cpp; for
#                          checking that the fuzzer catches a planted bug in a copy)
#   TESSERA_FUZZ_KEEP=1    keep the work directory (binary, corpus) after a clean run
# Needs clang++ and libFuzzer's runtime: Debian packages clang and libclang-rt-14-dev
# (scripts/setup installs them).
set -uo pipefail

repo=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
repo=$(cd "$repo" && pwd) || { echo "run_fuzz: no repository at '$1'" >&2; exit 2; }
seconds=${TESSERA_FUZZ_SECONDS:-30}
formats=${TESSERA_FUZZ_FORMATS:-$repo/src/data/formats.cpp}
target=$repo/tests/data/fuzz_formats.cpp

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

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-fuzz.XXXXXX")
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

echo "run_fuzz: building $target + $formats with $cxx"
t0=$SECONDS
if ! "$cxx" -std=c++17 -O1 -g -fno-omit-frame-pointer "${sanitize[@]}" -DFMT_HEADER_ONLY=1 -I"$repo/src" \
    "$formats" "$target" -o "$work/fuzz_formats"; then
  keep=1
  echo "run_fuzz: FAILED: the fuzz target does not build (work directory kept: $work)" >&2
  exit 1
fi
echo "run_fuzz: built in $((SECONDS - t0)) s"

# Seeds: valid structure for every parser, so the fuzzer starts from inputs that get deep.
mkdir -p "$work/corpus" "$work/artifacts"
python3 - "$work/corpus" "$work/formats.dict" <<'EOF'
import os, struct, sys

out, dictfile = sys.argv[1], sys.argv[2]

def megatron(code, lengths, pointers, doc_indices, bin_bytes):
    """The fuzz input: u64 .bin size, then the .idx (layout in src/data/formats.h)."""
    idx = b"MMIDIDX\0\0" + struct.pack("<QBQQ", 1, code, len(lengths), len(doc_indices))
    idx += struct.pack("<%di" % len(lengths), *lengths)
    idx += struct.pack("<%dq" % len(pointers), *pointers)
    idx += struct.pack("<%dq" % len(doc_indices), *doc_indices)
    return struct.pack("<Q", bin_bytes) + idx

def contiguous(code, lengths, doc_indices, slack=0):
    size = 2 if code == 8 else 4
    pointers, p = [], 0
    for n in lengths:
        pointers.append(p)
        p += n * size
    return megatron(code, lengths, pointers, doc_indices, p + slack)

def llmc(tokens, wide):
    header = [20240801 if wide else 20240520, 7 if wide else 1, len(tokens)] + [0] * 253
    body = struct.pack("<%d%s" % (len(tokens), "I" if wide else "H"), *tokens)
    return struct.pack("<256i", *header) + body

seeds = {
    "megatron_u16_3seq": contiguous(8, [3, 0, 5], [0, 1, 3]),
    "megatron_u16_docs": contiguous(8, [1, 2, 3, 4], [0, 2, 2, 4], slack=6),
    "megatron_i32_4seq": contiguous(4, [2, 1, 4, 0], [0, 2, 4]),
    "megatron_i32_shared": megatron(4, [2, 2, 1], [0, 0, 4], [0, 3], 8),
    "megatron_empty": megatron(8, [], [], [0], 0),
    "llmc_u16": llmc([1, 2, 3, 50256, 65535], wide=False),
    "llmc_u32": llmc([7, 100000, 4294967295], wide=True),
    "llmc_u16_empty": llmc([], wide=False),
    "llmc_u32_empty": llmc([], wide=True),
    "raw_tokens": bytes(range(12)),
}
for name, data in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)

def esc(b):
    return "".join("\\x%02x" % c for c in b)

with open(dictfile, "w") as f:
    f.write('megatron_magic="%s"\n' % esc(b"MMIDIDX\0\0"))
    f.write('megatron_v1="%s"\n' % esc(struct.pack("<Q", 1)))
    f.write('llmc_magic16="%s"\n' % esc(struct.pack("<i", 20240520)))
    f.write('llmc_magic32="%s"\n' % esc(struct.pack("<i", 20240801)))
    f.write('llmc_v7="%s"\n' % esc(struct.pack("<i", 7)))
print("run_fuzz: wrote %d seeds" % len(seeds))
EOF
[[ $? == 0 ]] || { echo "run_fuzz: FAILED: could not write the seed corpus" >&2; exit 1; }

echo "run_fuzz: fuzzing for ${seconds} s"
log=$work/fuzz.log
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
"$work/fuzz_formats" "$work/corpus" \
  -dict="$work/formats.dict" -max_len=8192 -max_total_time="$seconds" -rss_limit_mb=1024 -timeout=10 \
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
    echo "run_fuzz: reproduce: $work/fuzz_formats $a" >&2
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
